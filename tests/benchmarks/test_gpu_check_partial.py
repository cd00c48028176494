"""The GPU check's one shot keeps every finished part: a stage that fails, or is cut by a real
SIGTERM, after a part finished keeps that part (its record, the report and the measured
throughput figures say partial); a stage is recorded "running" before its first step; training's
FSDP2 wrap failing keeps both LR runs; a writer of the report or the measured figures that raises
stops no stage; and the memory cap that makes an H200 answer as the issue's H100 80 GB (its
arithmetic on a faked total; on CPU: not applicable).

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_gpu_check_partial.py
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import types
from argparse import Namespace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_check import common as C  # noqa: E402
from gpu_check import run as gc_run  # noqa: E402
from gpu_check.common import GIB, Context  # noqa: E402
from gpu_check.figures import Figure, Target  # noqa: E402
from gpu_check.report import RUNNING  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"
FIG = {"value": 2.5e12, "unit": "B/s", "shape": "s", "result": "forward 7 ms", "derivation": "d"}


def _fake_stages(monkeypatch, stages: dict) -> None:
    """Make `stages` ({name: run}) the check's only stages, each a module gpu_check.<name>."""
    for name, run in stages.items():
        mod = types.ModuleType(f"gpu_check.{name}")
        mod.TITLE, mod.run = f"fake {name}", run
        monkeypatch.setitem(sys.modules, f"gpu_check.{name}", mod)
    monkeypatch.setattr(gc_run, "STAGES", [(n, 0) for n in stages])


def _run_stages(tmp_path: Path, profile: str | None = "h100") -> tuple[Context, list[dict]]:
    ctx = Context(out=tmp_path, smoke=False, device="cpu", deadline=time.monotonic() + 1e4,
                  world=tmp_path, gpu_name=H100)  # fmt: skip
    return ctx, gc_run._stages(ctx, Namespace(stages=None, out=tmp_path), profile)


def test_a_stage_failing_after_a_part_keeps_it_in_its_record_report_and_figures(tmp_path, monkeypatch):  # fmt: skip
    def two_parts(ctx):
        figs = [Figure("first part's speed-up", 3.0, "x", Target(">=", 2.0))]
        ctx.keep("part 1", {"figures": figs, "throughput": {"decode_bytes_per_s": FIG}})
        on_disk = json.loads((tmp_path / "01_fake_a.json").read_text())  # written at once
        assert on_disk["status"] == "running" and on_disk["partial"]["parts"] == ["part 1"]
        figs.append(Figure("never finished", 0.0))  # changed after keep: not in the kept part
        raise RuntimeError("NCCL error in the second part")

    _fake_stages(monkeypatch, {"fake_a": two_parts, "fake_b": lambda ctx: {"figures": []}})
    _, records = _run_stages(tmp_path)
    assert [r["status"] for r in records] == ["failed", "ok"]
    rec = json.loads((tmp_path / "01_fake_a.json").read_text())
    assert rec["status"] == "failed" and rec["error"] == "RuntimeError: NCCL error in the second part"  # fmt: skip
    assert rec["partial"] == {"parts": ["part 1"]}
    assert [f["name"] for f in rec["result"]["figures"]] == ["first part's speed-up"]
    assert rec["result"]["figures"][0]["verdict"] == "met"
    report = (tmp_path / "report.md").read_text()
    assert "**fake_a** failed: RuntimeError: NCCL error in the second part; kept: part 1" in report
    assert "**Partial**; kept: part 1" in report and "| first part's speed-up | 3 x | ≥ 2 | ✅ met |" in report  # fmt: skip
    assert "1 of 1 targets met" in report
    measured = json.loads((tmp_path / "throughput_measured.json").read_text())["figures"]
    got = measured["decode_bytes_per_s"]
    assert got["value"] == 2.5e12
    assert (
        got["result"] == "forward 7 ms"
        and got["partial"] == "stage fake_a failed after part 1 finished"
    )


def test_a_stage_is_recorded_running_before_its_first_step(tmp_path, monkeypatch):
    """A stage SIGKILLed (or hung) before it keeps any part still leaves a trace: its record
    says "running" and the report names it from the stage's start, not a clean run."""
    seen = {}

    def first_step(ctx):  # what a SIGKILL here would leave on disk
        seen["record"] = json.loads((tmp_path / "02_fake_b.json").read_text())
        seen["report"] = (tmp_path / "report.md").read_text()
        return {"figures": []}

    _fake_stages(monkeypatch, {"fake_a": lambda ctx: {"figures": []}, "fake_b": first_step})
    _run_stages(tmp_path)
    assert seen["record"]["status"] == "running" and "partial" not in seen["record"]
    assert "2 stage(s) run, 1 finished" in seen["report"]
    assert f"**fake_b** running: {RUNNING}" in seen["report"]
    assert json.loads((tmp_path / "02_fake_b.json").read_text())["status"] == "ok"


def test_a_raising_save_measured_stops_no_stage_and_the_report_says_it(tmp_path, monkeypatch):
    def disk_full(*a, **k):
        raise OSError("No space left on device")

    monkeypatch.setattr(gc_run, "save_measured", disk_full)
    ran = []
    _fake_stages(monkeypatch, {n: (lambda ctx, n=n: ran.append(n) or {"figures": []}) for n in ("fake_a", "fake_b", "fake_c")})  # fmt: skip
    ctx, records = _run_stages(tmp_path)
    assert ran == ["fake_a", "fake_b", "fake_c"] and [r["status"] for r in records] == ["ok"] * 3
    assert ctx.notes == ["writing the measured figures failed: OSError: No space left on device"]
    report = (tmp_path / "report.md").read_text()
    assert "3 stage(s) run, 3 finished" in report
    assert "- writing the measured figures failed: OSError: No space left on device" in report


@pytest.mark.slow
def test_sigterm_in_the_evaluators_second_candidate_keeps_the_first(tmp_path, tiny_world):
    """The outer `timeout` cuts the check while the evaluator scores its 2nd candidate (held
    there): the 1st candidate's race is in the killed record, the report and its figures."""
    out = tmp_path / "o"
    script = tmp_path / "hold.py"
    argv = ["--smoke", "--stages", "evaluator", "--out", str(out), "--world", str(tiny_world)]
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "import bench_eval\n"
        "bench_eval.renoise = lambda model, i: time.sleep(300)  # the 2nd candidate, held\n"
        "from gpu_check import run\n"
        f"sys.exit(run.main({argv!r}))\n"
    )
    check = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    record = out / "02_evaluator.json"

    def kept() -> bool:
        try:
            rec = json.loads(record.read_text())  # "running" from its start: wait for the part
            return rec.get("status") == "running" and bool(rec.get("partial"))
        except (OSError, ValueError):
            return False

    try:
        deadline = time.monotonic() + 150
        while not kept() and check.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert kept(), "the first candidate was never kept in a running record"
        check.send_signal(signal.SIGTERM)
        rc = check.wait(timeout=60)
    finally:
        if check.poll() is None:
            check.kill()
    output = check.stdout.read()
    assert rc == 128 + signal.SIGTERM, output[-3000:]
    rec = json.loads(record.read_text())
    assert rec["status"] == "killed" and rec["error"].startswith("cut by SIGTERM"), rec
    assert rec["partial"]["parts"] == ["candidate 1"]
    names = [f["name"] for f in rec["result"]["figures"]]
    assert "evaluator seconds per candidate" in names and "evaluator prefill FLOP/s" in names
    assert rec["result"]["race"]["ours"] and len(rec["result"]["race"]["ours"]) == 1
    report = (out / "report.md").read_text()
    assert "**evaluator** killed: cut by SIGTERM" in report and "kept: candidate 1" in report
    assert "| evaluator seconds per candidate |" in report


@pytest.mark.slow
def test_a_failing_fsdp2_wrap_keeps_both_lr_runs(tmp_path, tiny_world, monkeypatch):
    """The wrap (FSDP2's first NCCL init on a GPU) fails: the stage still ends ok with both LR
    runs' figures and the wrap's failure as a missed target."""
    from gpu_check import training

    def broken(*a, **k):
        raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp")

    monkeypatch.setattr(training, "_wrap", broken)
    ctx = Context(out=tmp_path, smoke=True, device="cpu", deadline=time.monotonic() + 600, world=tiny_world, gpu_name="cpu")  # fmt: skip
    rec = gc_run.run_stage(ctx, 4, "training", 0)
    assert rec["status"] == "ok", rec.get("error")
    figs = {f["name"]: f for f in rec["result"]["figures"]}
    assert {"tokens/s, LR 1e-07", "tokens/s, LR 1e-05"} <= set(figs), sorted(figs)
    assert figs["FSDP2 wrap finished"]["verdict"] == "missed"
    assert "NCCL error" in figs["FSDP2 wrap finished"]["note"]


def test_memory_cap_arithmetic_on_a_faked_total():
    h200 = 150_000_000_000  # what torch reports for an H200 (139.7 GiB)
    plan = C.cap_plan(h200, None)  # default: the H100 80 GB
    assert plan["applied"] and plan["cap_gib"] == 80.0
    assert plan["fraction"] == pytest.approx(80 * GIB / h200)
    assert C.cap_plan(h200, 100.0)["fraction"] == pytest.approx(100 * GIB / h200)
    assert not C.cap_plan(h200, 0)["applied"] and "none (--memory-cap-gib 0)" in C.cap_plan(h200, 0)["note"]  # fmt: skip
    h100 = 85_000_000_000  # 79.2 GiB: within the default cap, nothing to cap
    assert not C.cap_plan(h100, None)["applied"] and C.cap_plan(h100, None)["fraction"] is None
    assert C.cap_plan(None, None) == {"cap_gib": None, "total_gib": None, "fraction": None, "applied": False,
                                    "note": "memory cap: not applicable (no CUDA device)"}  # fmt: skip


def test_memory_cap_limits_the_allocator_and_what_mem_get_info_says(monkeypatch):
    """Applied on a faked 150 GB device holding 10 GiB: the allocator's fraction is cap / total,
    and layerswap's fit rules (which read mem_get_info) see an 80 GiB device."""
    fractions = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: fractions.append((f, d)))  # fmt: skip
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (140_000_000_000, 150_000_000_000))  # fmt: skip
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 10 * GIB)
    C.apply_memory_cap(C.cap_plan(150_000_000_000, None))
    assert fractions == [(pytest.approx(80 * GIB / 150e9), 0)]
    assert torch.cuda.mem_get_info() == (70 * GIB, 80 * GIB)


def test_on_cpu_the_cap_is_recorded_as_not_applicable(tmp_path, monkeypatch):
    from gpu_check import env

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = gc_run.parse_args(["--smoke", "--out", str(tmp_path / "o"), "--memory-cap-gib", "80"])
    ctx = gc_run._context(args, tmp_path, time.monotonic())
    assert ctx.memory_cap["applied"] is False
    assert "memory cap: not applicable (no CUDA device)" in ctx.notes
    versions = env.run(ctx)["versions"]
    assert (
        versions["memory cap (--memory-cap-gib)"] == "memory cap: not applicable (no CUDA device)"
    )
    with pytest.raises(SystemExit):
        gc_run.parse_args(["--smoke", "--out", str(tmp_path / "p"), "--memory-cap-gib", "-1"])
