"""benchmarks/gpu_check/throughput.py: measured figures go into the profile of the GPU measured
(an H200's never into h100), are written under --out as each stage ends (they come back from a
GPU machine whose tree is thrown away, and survive a cut run), and a report folder is applied to
a throughput.yaml afterwards by `throughput.py DIR`, which refuses another GPU's profile.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_gpu_check_throughput.py
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import types
from argparse import Namespace
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_check import run as gc_run  # noqa: E402
from gpu_check import throughput as TP  # noqa: E402
from gpu_check.common import Context  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "gpu_check" / "throughput.py"
H200 = "NVIDIA H200"
FIG = {"value": 4.1e12, "unit": "B/s", "shape": "llama-8b", "result": "r", "derivation": "d"}


def test_profile_follows_the_gpu_family_and_refuses_another():
    assert TP.profile_for("NVIDIA H100 80GB HBM3") == TP.profile_for("NVIDIA H100 PCIe") == "h100"
    assert TP.profile_for("NVIDIA H200") == TP.profile_for("NVIDIA H200 NVL") == "h200"
    assert TP.profile_for("NVIDIA B200") is None
    assert TP.check_profile(None, H200) == "h200"
    with pytest.raises(ValueError, match=r"--profile 'h100' is not the measured GPU's .*'h200'"):
        TP.check_profile("h100", H200)
    with pytest.raises(ValueError, match=r"no row in gpu_check/figures\.GPU_SPECS"):
        TP.check_profile(None, "NVIDIA B200")


def _faked_gpu(monkeypatch, name: str) -> list:
    """torch.cuda as a 150 GB GPU called `name`; returns the memory fractions set on it."""
    fractions: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    props = types.SimpleNamespace(multi_processor_count=132, total_memory=150e9)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: fractions.append(f))  # fmt: skip
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda device=None: (149e9, 150e9)
    )  # restored after
    return fractions


def test_on_an_h200_the_assumed_figures_are_h200s_and_memory_an_h100s(tmp_path, monkeypatch):
    """run._context on a (faked) H200: its own profile's assumptions (h200: 4.8 TB/s) are set
    beside its measurements, its memory is capped at the issue's H100 80 GB, and
    --update-throughput --profile h100 is refused before any stage runs."""
    fractions = _faked_gpu(monkeypatch, H200)
    args = gc_run.parse_args(["--out", str(tmp_path / "o"), "--update-throughput"])
    ctx = gc_run._context(args, tmp_path, time.monotonic())
    assert ctx.assumed.decode_bytes_per_s.value == 2.88e12  # 4.8 TB/s x 0.6, not h100's 2.0e12
    assert "*assumed*: spaces/throughput.yaml profile h200" in ctx.notes
    assert fractions == [pytest.approx(80 * 2**30 / 150e9)] and ctx.memory_cap["cap_gib"] == 80.0
    assert any(n.startswith("memory capped at 80 of the device's 139.7 GiB") for n in ctx.notes)
    assert gc_run._profile(args, ctx) == "h200"
    args = gc_run.parse_args(["--out", str(tmp_path / "o"), "--update-throughput", "--profile", "h100"])  # fmt: skip
    with pytest.raises(SystemExit, match="--profile 'h100' is not the measured GPU's"):
        gc_run._profile(args, ctx)


def test_a_gpu_without_a_profile_is_shown_h100s_labelled_as_another_gpus(tmp_path, monkeypatch):
    _faked_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB")
    ctx = gc_run._context(gc_run.parse_args(["--out", str(tmp_path / "o"), "--memory-cap-gib", "0"]), tmp_path, time.monotonic())  # fmt: skip
    assert ctx.assumed.decode_bytes_per_s.value == 2.0e12  # h100's
    assert any("no profile for NVIDIA A100-SXM4-80GB (a100): the column shows profile h100's, ANOTHER GPU's" in n for n in ctx.notes)  # fmt: skip
    assert "memory cap: none (--memory-cap-gib 0): the device's 139.7 GiB" in ctx.notes


def test_a_new_gpu_profile_is_made_from_h100s_assumptions_marked_as_copied():
    data = yaml.safe_load(TP.THROUGHPUT.read_text())
    del data["profiles"]["h200"]  # a file without the GPU's profile
    text = "# head\n" + yaml.safe_dump(data, sort_keys=False)
    data = yaml.safe_load(TP.updated_yaml(text, "h200", {"decode_bytes_per_s": FIG}, "c", H200, "2026-11-28"))  # fmt: skip
    h200, h100 = data["profiles"]["h200"], yaml.safe_load(text)["profiles"]["h100"]
    assert h200["decode_bytes_per_s"]["value"] == 4.1e12
    assert h200["decode_bytes_per_s"]["measured"]["device"] == H200
    assert h200["train_flops_per_s"]["assumed"].startswith("copied from profile h100, not re-derived for NVIDIA H200")  # fmt: skip
    assert data["profiles"]["h100"] == h100  # untouched
    with pytest.raises(
        ValueError, match="no profile 'a100'"
    ):  # only the measured GPU's own is made
        TP.updated_yaml(text, "a100", {"decode_bytes_per_s": FIG}, "c", H200, "t")


def _fake_stage(monkeypatch, name: str, run) -> None:
    mod = types.ModuleType(f"gpu_check.{name}")
    mod.TITLE, mod.run = f"fake {name}", run
    monkeypatch.setitem(sys.modules, f"gpu_check.{name}", mod)


def test_measurements_are_under_out_after_their_stage_and_survive_a_cut(tmp_path, monkeypatch):
    """The first stage measures; SIGTERM (its Cut) lands in the second: the measurement is under
    --out already, the cut stage's record says killed, and the report names it."""

    def cut(ctx):
        raise gc_run.Cut(signal.SIGTERM)

    _fake_stage(monkeypatch, "fake_meas", lambda ctx: {"figures": [], "throughput": {"decode_bytes_per_s": FIG}})  # fmt: skip
    _fake_stage(monkeypatch, "fake_cut", cut)
    monkeypatch.setattr(gc_run, "STAGES", [("fake_meas", 0), ("fake_cut", 0), ("fake_never", 0)])
    ctx = Context(out=tmp_path, smoke=False, device="cpu", deadline=time.monotonic() + 1e4, world=tmp_path, gpu_name=H200)  # fmt: skip
    with pytest.raises(gc_run.Cut):
        gc_run._stages(ctx, Namespace(stages=None, out=tmp_path), "h200")
    measured = json.loads((tmp_path / TP.MEASURED).read_text())
    assert measured["gpu"] == H200 and measured["profile"] == "h200"
    assert measured["figures"]["decode_bytes_per_s"]["value"] == 4.1e12
    shipped = yaml.safe_load((tmp_path / TP.UPDATED).read_text())["profiles"]
    assert shipped["h200"]["decode_bytes_per_s"]["value"] == 4.1e12
    assert shipped["h100"] == yaml.safe_load(TP.THROUGHPUT.read_text())["profiles"]["h100"]
    killed = json.loads((tmp_path / "02_fake_cut.json").read_text())
    assert killed["status"] == "killed" and killed["error"].startswith("cut by SIGTERM")
    report = (tmp_path / "report.md").read_text()
    assert "**fake_cut** killed: cut by SIGTERM" in report
    assert "run cut by SIGTERM during stage fake_cut; not run: fake_never" in report


def _apply(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)  # fmt: skip


def test_apply_a_report_folder_to_a_throughput_file(tmp_path):
    """From outside, as after a GPU session: the folder's measurements go into the GPU's own
    profile; --profile naming another GPU's is refused with one line, the file unchanged."""
    run_dir = tmp_path / "gpu_check"
    run_dir.mkdir()
    (run_dir / TP.MEASURED).write_text(json.dumps({"gpu": H200, "profile": "h200", "command": "run.py --out X", "date": "2026-11-28", "figures": {"decode_bytes_per_s": FIG}}))  # fmt: skip
    target = tmp_path / "throughput.yaml"
    shutil.copy(TP.THROUGHPUT, target)
    before = target.read_bytes()
    bad = _apply(run_dir, "--profile", "h100", "--file", target)
    assert bad.returncode == 2 and target.read_bytes() == before
    assert len(bad.stderr.strip().splitlines()) == 1 and "--profile 'h100' is not the measured GPU's" in bad.stderr  # fmt: skip
    ok = _apply(run_dir, "--file", target)
    assert ok.returncode == 0, ok.stderr
    data = yaml.safe_load(target.read_text())["profiles"]
    assert data["h200"]["decode_bytes_per_s"]["measured"]["command"] == "run.py --out X"
    assert data["h100"] == yaml.safe_load(before)["profiles"]["h100"]


def test_apply_rebuilds_from_stage_records_and_01_env(tmp_path):
    """A folder without the measured file (cut before it was written, or older code): the
    figures come from the finished stages' records, the GPU's name from 01_env.json."""
    env = {"stage": "env", "status": "ok", "result": {"versions": {"device": H200}}}
    ev = {"stage": "evaluator", "status": "ok", "result": {"throughput": {"decode_bytes_per_s": FIG}}}  # fmt: skip
    (tmp_path / "01_env.json").write_text(json.dumps(env))
    (tmp_path / "02_evaluator.json").write_text(json.dumps(ev))
    m = TP.read_measured(tmp_path)
    assert m["gpu"] == H200 and m["figures"] == {"decode_bytes_per_s": FIG}
    with pytest.raises(ValueError, match=r"neither throughput_measured\.json nor 01_env\.json"):
        TP.read_measured(tmp_path / "nothing")


def test_a_partial_figure_is_partial_in_the_profile_and_in_the_plan(tmp_path):
    """From outside, as after a GPU session SIGKILLed mid-evaluator: the stage's record on disk
    is still `running` with one kept candidate. Applied by `throughput.py DIR`, its figure lands
    in the profile with `measured.partial` saying why, and `layerswap plan`'s text calls it
    "measured, partial: ..." and counts it among the partial ones."""
    from layerswap.spaces.study import load_profiles, load_study
    from layerswap.study.plan import plan_study
    from layerswap.study.report import format_study_plan

    run_dir = tmp_path / "gpu_check"
    run_dir.mkdir()
    env = {"stage": "env", "index": 1, "status": "ok", "result": {"versions": {"device": H200}, "figures": []}}  # fmt: skip
    fig = {**FIG, "value": 3.0e13, "unit": "FLOP/s", "result": "10 prefill forwards"}
    ev = {"stage": "evaluator", "index": 2, "status": "running", "partial": {"parts": ["candidate 1"]}, "result": {"figures": [], "throughput": {"prefill_flops_per_s": fig}}}  # fmt: skip
    (run_dir / "01_env.json").write_text(json.dumps(env))
    (run_dir / "02_evaluator.json").write_text(json.dumps(ev))
    target = tmp_path / "throughput.yaml"
    shutil.copy(TP.THROUGHPUT, target)
    ok = _apply(run_dir, "--file", target)
    assert ok.returncode == 0, ok.stderr
    why = "stage evaluator running after candidate 1 finished"
    measured = yaml.safe_load(target.read_text())["profiles"]["h200"]["prefill_flops_per_s"]["measured"]  # fmt: skip
    assert measured["partial"] == why and measured["result"] == "10 prefill forwards"
    profiles = load_profiles(target)
    assert profiles["h200"].prefill_flops_per_s.measured.partial == why
    study = load_study(ROOT / "spaces" / "examples" / "real_study.yaml")
    text = format_study_plan(plan_study(study, "h200", profiles))
    assert f"prefill_flops_per_s 3e+13 FLOP/s (measured, partial: {why}): benchmarks/gpu_check/run.py" in text  # fmt: skip
    assert "(measured)" not in text  # the only measured figure is the partial one
    n = sum(1 for v in yaml.safe_load(target.read_text())["profiles"]["h200"].values() if isinstance(v, dict) and "value" in v)  # fmt: skip
    assert f"figures of profile h200 (1 of {n} measured, 1 of them partial):" in text
