"""The GPU check's one shot on a lent GPU must keep going: a stage that runs out of CUDA memory
leaves its record and frees the device (its tensors gone first) before the next stage runs; a
device that cannot even be freed (a sticky CUDA error) still lets every later stage write its
record; and the time budget counts from the process's start, world build included. Fake
stages and a CUDA-less torch whose cuda calls are recorded stand in for the GPU.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_gpu_check_stage_failures.py
"""

from __future__ import annotations

import json
import sys
import time
import types
import weakref
from argparse import Namespace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_check import run as gc_run  # noqa: E402
from gpu_check.common import Context  # noqa: E402


def fake_stage(monkeypatch, name: str, run) -> None:
    """Register `gpu_check.<name>` as a stage module whose run is `run`."""
    mod = types.ModuleType(f"gpu_check.{name}")
    mod.TITLE, mod.run = f"fake {name}", run
    monkeypatch.setitem(sys.modules, f"gpu_check.{name}", mod)


def cuda_ctx(tmp_path: Path) -> Context:
    """A full (non-smoke) run's context on "cuda", with time to spare."""
    return Context(out=tmp_path, smoke=False, device="cuda", deadline=time.monotonic() + 1e4,
                   world=tmp_path, gpu_name="NVIDIA H100 80GB HBM3")  # fmt: skip


@pytest.fixture
def cuda_calls(monkeypatch):
    """torch.cuda's freeing calls recorded instead of made (this torch has no CUDA)."""
    calls: list[str] = []
    for fn in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, fn, lambda *a, _fn=fn, **k: calls.append(_fn))
    return calls


def test_out_of_memory_frees_the_stages_tensors_then_the_next_stage_runs(tmp_path, monkeypatch, cuda_calls):  # fmt: skip
    held: list[weakref.ref] = []
    alive_at_empty_cache: list[bool] = []

    def oom(ctx):
        activations = torch.empty(1 << 20)  # what a stage holds when the allocator gives up
        held.append(weakref.ref(activations))
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 17.00 GiB")

    def empty_cache():
        alive_at_empty_cache.append(held[0]() is not None)
        cuda_calls.append("empty_cache")

    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    fake_stage(monkeypatch, "fake_oom", oom)
    fake_stage(monkeypatch, "fake_next", lambda ctx: {"figures": [], "ran": True})
    ctx = cuda_ctx(tmp_path)
    first = gc_run.run_stage(ctx, 1, "fake_oom", 0)
    assert first["status"] == "failed" and first["error"].startswith("OutOfMemoryError: CUDA out")
    # the device was freed once the stage's tensors were gone, and the peak counter restarted
    assert alive_at_empty_cache == [False]
    assert cuda_calls == ["synchronize", "empty_cache", "reset_peak_memory_stats"]
    second = gc_run.run_stage(ctx, 2, "fake_next", 0)
    assert second["status"] == "ok" and second["result"]["ran"]
    on_disk = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert on_disk["01_fake_oom.json"]["status"] == "failed"
    assert on_disk["02_fake_next.json"]["status"] == "ok"


def test_a_device_that_cannot_be_freed_still_leaves_every_record(tmp_path, monkeypatch):
    def sticky(*a, **k):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", sticky)
    fake_stage(monkeypatch, "fake_a", lambda ctx: {"figures": []})
    fake_stage(monkeypatch, "fake_b", lambda ctx: {"figures": []})
    ctx = cuda_ctx(tmp_path)
    records = [gc_run.run_stage(ctx, i, n, 0) for i, n in enumerate(("fake_a", "fake_b"), 1)]
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["01_fake_a.json", "02_fake_b.json"]
    assert len(ctx.notes) == 2 and "illegal memory access" in ctx.notes[0]
    assert ctx.notes[0].startswith("after stage fake_a, freeing the device failed: RuntimeError")


def test_the_budget_counts_from_the_process_start(tmp_path, monkeypatch):
    """The world build (~20 s) and imports come before the first stage; the lent GPU's one
    command has the budget in all, so they spend it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = Namespace(smoke=True, budget_s=360.0, out=tmp_path, memory_cap_gib=None)
    ctx = gc_run._context(args, tmp_path, started=time.monotonic() - 100.0)
    assert 255.0 < ctx.remaining() <= 260.0


def test_promotion_case_that_does_not_fit_is_a_finding_however_cuda_says_it(tmp_path):
    """A kernel's own allocation raises "CUDA error: out of memory", a plain RuntimeError: that
    is the case's finding (does not fit), not the end of the stage and its measured cases."""
    from gpu_check.promotion import _measure

    class FullGpu:
        def loglikelihood(self, reqs, disable_tqdm):
            raise RuntimeError("CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA")

        def generate_until(self, reqs, disable_tqdm):
            raise RuntimeError("shape mismatch")  # a real failure stays one

    ctx = Context(out=tmp_path, smoke=True, device="cpu", deadline=time.monotonic() + 1e4,
                  world=tmp_path, gpu_name="cpu")  # fmt: skip
    fits, error, _, peak = _measure(ctx, FullGpu(), [], "loglikelihood")
    assert (fits, error, peak) == (False, "CUDA error: out of memory", None)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        _measure(ctx, FullGpu(), [], "generate_until")


def test_each_ray_train_command_is_limited_by_the_time_left_when_it_starts(tmp_path, monkeypatch):
    """The killed run and the resumed one each get what is left at their start: a hung resume
    (an NCCL wait) must not spend the killed run's allowance a second time."""
    from gpu_check import ray_train as R

    limits: list[float] = []
    left = iter([200.0, 70.0])

    def killed(args, ckpts, step_log, gpu, limit, keep):
        limits.append(limit)
        return {"step_log_bytes": 0}

    def resumed(args, log, gpu, limit, keep):
        limits.append(limit)
        raise KeyboardInterrupt  # enough: the limits are known

    monkeypatch.setattr(R, "_killed_run", killed)
    monkeypatch.setattr(R, "_resumed_run", resumed)
    ctx = types.SimpleNamespace(device="cuda", world=tmp_path, out=tmp_path, remaining=lambda: next(left), keep=lambda part, result: None)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        R.run(ctx)
    assert limits == [200.0, 70.0]


def test_a_trials_pass_that_fails_leaves_the_other_pass_and_says_so(tmp_path, monkeypatch):
    """The device pass failing (out of memory while both experts are copied, or any error) must
    not take the host pass with it: each pass's outcome is its own finding."""
    import shapes
    from gpu_check import trials as T
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    ctx = types.SimpleNamespace(device="cpu", remaining=lambda: 1e4, config=lambda depth=None: cfg)  # fmt: skip
    monkeypatch.setattr(shapes, "shape_experts", lambda cfg, make_on: {"base": {}})
    outcomes = {
        "device": RuntimeError("CUDA error: out of memory"),
        "host": ValueError("tensors not in the model: ['x']"),
    }

    def one_pass(ctx, key, d, states, tmp, shipped, size, end):
        if key in outcomes:
            raise outcomes[key]
        return {"depth": d, "rows": [{"ran": key}]}

    monkeypatch.setattr(T, "_one_pass", one_pass)
    size = dict(T.SIZES["smoke"], depth=2)
    m = T.measure(ctx, size, shipped=None)
    assert m["passes"]["device"]["does_not_fit"] == "RuntimeError: CUDA error: out of memory"
    assert m["passes"]["host"]["failed"] == "ValueError: tensors not in the model: ['x']"
    del outcomes["device"]
    m = T.measure(ctx, size, shipped=None)  # the device pass measured, the host one failed
    assert m["passes"]["device"]["rows"] == [{"ran": "device"}] and "failed" in m["passes"]["host"]


def test_a_training_run_that_fails_leaves_the_other_lr_and_says_so(tmp_path, monkeypatch):
    """LR 1e-7 running out of memory must not lose LR 1e-5's run (nor the FSDP2 wrap): each
    run's failure is a missed 'run finished' target, and the next run still starts."""
    from gpu_check import training as TR

    started: list[float] = []

    def train_at(ctx, args, cfg, device, lr):
        started.append(lr)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(TR, "_train_at", train_at)
    monkeypatch.setattr(TR, "_skip", lambda ctx, what, need: "skipped" if "wrap" in what else None)
    ctx = types.SimpleNamespace(device="cpu", smoke=True, config=lambda depth=None: types.SimpleNamespace())  # fmt: skip
    out = TR.run(ctx)
    assert started == list(TR.LRS)
    finished = [f for f in out["figures"] if f.name.startswith("training run finished")]
    assert [f.verdict for f in finished] == ["missed", "missed"]
    assert finished[0].note.startswith("OutOfMemoryError: CUDA out of memory")


def test_a_ray_train_command_gets_no_more_than_is_left(tmp_path):
    """No floor above what is left: a 60 s floor let the killed and the resumed command each run
    a minute past the budget. Less than START_S left: the command is not started at all."""
    from gpu_check import ray_train as R

    assert R.command_limit(types.SimpleNamespace(remaining=lambda: 30.0)) == 30.0
    assert R.command_limit(types.SimpleNamespace(remaining=lambda: 999.0)) == 240.0
    with pytest.raises(
        RuntimeError, match=r"5 s of the check's budget left: `layerswap train` needs ~20 s"
    ):
        R.command_limit(types.SimpleNamespace(remaining=lambda: 5.0))


def test_the_default_budget_and_its_grace_end_before_the_device_commands_timeout():
    """The documented device command is `timeout -k 15 540 python3 .../run.py`: the check's own
    alarm (budget + grace, counted from the process's start) must cut a stage and write the
    report before that SIGTERM, with room for the cut stage's cleanup; the hang watchdog (a
    stage blocked in C runs no handler) must end it before that SIGTERM too; and the -k must be
    there, or a process that ignores the SIGTERM (`_on_signal` ignores a second one) runs on."""
    assert gc_run.BUDGET_S + gc_run.GRACE_S <= 540 - 25
    assert gc_run.BUDGET_S + gc_run.GRACE_S + gc_run.HANG_MARGIN_S <= 540 - 5
    command = "timeout -k 15 540 python3 benchmarks/gpu_check/run.py"
    assert command in gc_run.__doc__
    for doc in ("Makefile", "docs/guides/gpus.md"):
        text = (ROOT / doc).read_text()
        assert command in text and "timeout 540" not in text, doc


def test_promotion_runs_before_ray_train_which_runs_last():
    """promotion (a quick fits-or-not) must not wait behind ray_train, the longest stage (112 s
    of the smoke's ~135) and the one likeliest to hang on NCCL."""
    names = [n for n, _ in gc_run.STAGES]
    assert names == ["env", "evaluator", "trials", "training", "promotion", "ray_train"]
