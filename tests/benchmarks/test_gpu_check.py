"""benchmarks/gpu_check/: the report's arithmetic, its rendering, --update-throughput, and (slow)
the whole --smoke run as CI runs it, so the GPU check cannot rot between the rare GPU sessions.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_gpu_check.py [-m "not slow"]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_check import figures as F  # noqa: E402
from gpu_check.report import render  # noqa: E402
from gpu_check.throughput import measured_figures, updated_yaml  # noqa: E402

from layerswap.spaces.study import Profiles  # noqa: E402

RUN = ROOT / "benchmarks" / "gpu_check" / "run.py"


# ------------------------------------------------------------------------------ arithmetic


def test_targets_compare_in_their_direction():
    assert F.Target(">=", 2.0).met(2.0) and not F.Target(">=", 2.0).met(1.99)
    assert F.Target("<=", 0.01).met(0.0) and not F.Target("<=", 0.01).met(0.011)
    with pytest.raises(ValueError, match="'>'"):
        F.Target(">", 1.0)


def test_verdicts():
    assert F.Figure("x", 3.0, target=F.Target(">=", 2)).verdict == "met"
    assert F.Figure("x", 1.0, target=F.Target(">=", 2)).verdict == "missed"
    assert F.Figure("x", None, target=F.Target(">=", 2)).verdict == "not measured"
    assert F.Figure("x", 1.0).verdict == ""


def test_figure_round_trips_through_json():
    f = F.Figure("speed-up", 2.5, "x", F.Target(">=", 2.0), assumed=1.0, note="median of 2")
    back = F.Figure.from_dict(json.loads(json.dumps(f.to_dict())))
    assert back == f and back.verdict == "met"


def test_ratios():
    assert F.speedup(10.0, 4.0) == 2.5
    assert F.share(1, 4) == 0.25 and F.share(1, 0) is None
    assert F.peak_share(494.7e12, 989.4e12) == 0.5 and F.peak_share(1e12, None) is None
    # 16 GB of bf16 weights over 3.35 TB/s: 4.78 ms a step at least
    assert F.decode_bound_s(16e9, 3.35e12) == pytest.approx(4.776e-3, rel=1e-3)
    assert F.decode_bound_s(16e9, None) is None
    assert F.relative_error(110, 100) == pytest.approx(0.10)
    assert F.relative_error(90, 100) == pytest.approx(-0.10)
    assert F.per_hour(7.2) == 500.0
    with pytest.raises(ValueError):
        F.speedup(1.0, 0.0)
    with pytest.raises(ValueError):
        F.per_hour(0)


def test_gpu_specs_take_the_specific_name_first():
    assert F.gpu_spec("NVIDIA H100 80GB HBM3")[:2] == (989.4e12, 3.35e12)
    assert F.gpu_spec("NVIDIA H100 PCIe")[:2] == (756e12, 2.0e12)
    assert F.gpu_spec("NVIDIA H200")[:2] == (989.4e12, 4.8e12)
    assert F.gpu_spec("Some Future GPU") is None


def test_gpu_specs_tell_pcie_sxm_and_mig_apart_by_their_sms():
    """The name alone can mislead: an H100 reporting 114 SMs is a PCIe card (756, not 989
    TFLOP/s: every MFU 24 % low otherwise), and a MIG slice has a share of the SMs."""
    assert F.gpu_spec("NVIDIA H100 80GB HBM3", 132)[:2] == (989.4e12, 3.35e12)
    pcie = F.gpu_spec("NVIDIA H100", 114)
    assert pcie[:2] == (756e12, 2.0e12) and "H100 PCIe: 114 SMs" in pcie[2]
    mig = F.gpu_spec("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 60)
    assert mig[:2] == pytest.approx((989.4e12 * 60 / 132, 3.35e12 * 60 / 132))
    assert "60/132 SMs" in mig[2]
    assert F.gpu_spec("NVIDIA H200 NVL", 132)[:2] == (835e12, 4.8e12)  # not the SXM's 989
    assert F.gpu_spec("NVIDIA H200", 132)[:2] == (989.4e12, 4.8e12)


def test_fmt():
    assert F.fmt(None) == "—"
    assert F.fmt(0.37) == "0.37" and F.fmt(2.4567) == "2.457"
    assert F.fmt(3.96e14) == "3.96e+14"


# ------------------------------------------------------------------------------ the report


def _records():
    fig = F.Figure("evaluator speed-up", 1.5, "x", F.Target(">=", 2.0), assumed=None, note="n")
    ok = F.Figure("prefill share of peak", 0.6, "share", F.Target(">=", 0.5), assumed=0.25)
    return [
        {"stage": "env", "index": 1, "status": "ok", "seconds": 0.1, "title": "Environment",
         "result": {"versions": {"torch": "2.13"}, "figures": []}},
        {"stage": "evaluator", "index": 2, "status": "ok", "seconds": 50.0, "title": "Evaluator",
         "result": {"figures": [fig.to_dict(), ok.to_dict()], "notes": ["16+8 items"],
                    "throughput": {"prefill_flops_per_s": {"value": 5e14, "unit": "FLOP/s",
                                   "shape": "8B", "result": "r", "derivation": "d"}}}},
        {"stage": "training", "index": 4, "status": "failed", "seconds": 3.0,
         "error": "OutOfMemoryError: CUDA out of memory"},
    ]  # fmt: skip


def test_report_sets_each_figure_beside_its_target_and_assumption():
    md = render(_records(), {"gpu": "NVIDIA H100 80GB HBM3", "mode": "full", "date": "2026-11-27"})
    assert "3 stage(s) run, 2 finished; 1 of 2 targets met." in md
    assert "**training** failed: OutOfMemoryError" in md
    assert "evaluator: evaluator speed-up = 1.5 x, target ≥ 2: missed" in md
    assert "| prefill share of peak | 0.6 share | ≥ 0.5 | ✅ met | 0.25 share |" in md
    assert "| torch | 2.13 |" in md and "- 16+8 items" in md


# ---------------------------------------------------------------------- --update-throughput


def test_update_throughput_writes_measured_provenance_and_keeps_the_rest():
    text = (ROOT / "spaces" / "throughput.yaml").read_text()
    figures = measured_figures(_records())
    assert list(figures) == ["prefill_flops_per_s"]  # failed stages give nothing
    new = updated_yaml(text, "h100", figures, "run.py --out x", "NVIDIA H100 80GB HBM3", "2026-11-27")  # fmt: skip
    assert new.startswith(text.split("\n", 1)[0])  # the comment block is kept
    data = yaml.safe_load(new)
    Profiles.model_validate(data)
    h100 = data["profiles"]["h100"]
    got = h100["prefill_flops_per_s"]
    assert got["value"] == 5e14 and "assumed" not in got
    assert got["measured"]["device"] == "NVIDIA H100 80GB HBM3"
    assert got["measured"]["benchmark"] == "benchmarks/gpu_check/run.py"
    old = yaml.safe_load(text)["profiles"]
    assert h100["train_flops_per_s"] == old["h100"]["train_flops_per_s"]  # untouched: assumed
    assert data["profiles"]["cpu"] == old["cpu"]


def test_update_throughput_names_an_unknown_profile_or_figure():
    text = (ROOT / "spaces" / "throughput.yaml").read_text()
    with pytest.raises(ValueError, match="no profile 'a100'"):
        updated_yaml(text, "a100", {}, "c", "d", "t")
    bad = {"flux_capacitance": {"value": 1.0, "shape": "s", "result": "r", "derivation": "d"}}
    with pytest.raises(ValueError, match="no figure 'flux_capacitance'"):
        updated_yaml(text, "h100", bad, "c", "d", "t")


# ------------------------------------------------------------------------------ the command


def _run(*args, cwd: Path, timeout: int = 60):
    return subprocess.run([sys.executable, str(RUN), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_refuses_a_non_empty_out_folder_and_unknown_stages(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    run = _run("--smoke", "--out", str(tmp_path), cwd=tmp_path)
    assert run.returncode == 2 and "exists and is not empty" in run.stderr
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    run = _run("--smoke", "--stages", "env,warp", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert run.returncode == 2 and "unknown stage(s) warp" in run.stderr
    run = _run("--smoke", "--update-throughput", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert run.returncode == 2 and "--update-throughput takes a GPU run" in run.stderr


def test_without_a_gpu_the_full_check_says_so(tmp_path, tiny_world):
    run = _run("--out", str(tmp_path / "o"), "--world", str(tiny_world), cwd=tmp_path)
    assert run.returncode != 0 and "no usable CUDA device" in run.stderr


@pytest.mark.slow
def test_smoke_runs_every_stage_on_cpu(gpu_check_smoke):
    """What CI runs: every stage at a tiny shape finishes, writes its JSON and joins the report,
    within the ~2 minutes the issue gives it (on 2 shared cores: 5 minutes of slack)."""
    from gpu_check.report import HANG_FILE
    from gpu_check.run import STAGES

    out = gpu_check_smoke
    records = [json.loads(p.read_text()) for p in sorted(out.glob("[0-9][0-9]_*.json"))]
    assert [r["stage"] for r in records] == [n for n, _ in STAGES]
    assert all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    report = (out / "report.md").read_text()
    assert f"{len(STAGES)} stage(s) run, {len(STAGES)} finished" in report
    assert not (out / HANG_FILE).exists()  # the hang watchdog's file goes with a run that ended
    # On a CPU a target is met or not measured (no GPU figure); a miss means a broken path.
    # Except a race of timings: on 2 shared cores under load the evaluator's speed-up read
    # 1.2-1.9x with and without a change (14.6x on a quiet machine), which says nothing of a path.
    missed = [(r["stage"], f["name"]) for r in records for f in r["result"]["figures"]
              if f["verdict"] == "missed" and "speed-up" not in f["name"]]  # fmt: skip
    assert not missed, missed
    wall = float((out / "wall_s.txt").read_text())
    assert wall < 300, f"smoke run took {wall:.0f} s; CI budget is ~2 min"
