"""`layerswap train` on Ray: a run whose loss turns non-finite stops at once, in one line.

A divergence is deterministic (the same weights, data and learning rate diverge again), so with
`failure.max_failures > 0` Ray Train must not restart the worker group for it; and the command's
output is the one `NonFiniteTraining` line, not Ray's worker traceback above it.
Run: .venv/bin/python -m pytest -q tests/trainables/train/test_ray_divergence.py   (slow: Ray)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow


def test_a_diverging_run_is_not_retried_and_says_so_in_one_line(tiny_world, tmp_path):
    log = tmp_path / "steps.jsonl"
    exp = {
        "name": "diverges",
        "base": str(tiny_world / "base"),
        "kind": "math",
        "language": "en",
        "datasets": [{"path": str(tiny_world / "data/sft/math_en.jsonl")}],
        "mode": "full",
        # lr 1000, the most the config takes: step 1 moves the weights by ~1e3, step 2's
        # loss is no longer finite (tests/trainables/train/test_train_finite.py)
        "hyper": {"lr": 1000.0, "batch_size": 8, "max_steps": 4, "seq_len": 96, "seed": 0},
        "failure": {"max_failures": 2},
        "debug": {"step_log": str(log)},
    }
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(exp))
    runs = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "layerswap.cli", "train", str(f), "--out", str(runs)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    # One attempt: the step log has step 1 once (a restarted group would log it again).
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps.count(steps[0]) == 1, (steps, out[-4000:])
    # Neither the worker's traceback nor the controller's retry decision is printed. Ray's
    # placement-group cleaner prints its own traceback when another Ray runs on the machine
    # (parallel test sessions): not this run's failure, so not counted.
    for noise in ("Error in training function", "[FailurePolicy]", "NonFiniteTraining"):
        assert noise not in out, out[-4000:]
    tracebacks = [s for s in out.splitlines() if "Traceback" in s and "PlacementGroupCleaner" not in s]  # fmt: skip
    assert not tracebacks, out[-4000:]
    said = [line for line in proc.stderr.splitlines() if "non-finite" in line]
    assert len(said) == 1 and said[0].startswith("layerswap: failed: training turned non-finite at step 2"), out[-4000:]  # fmt: skip
    assert not list(Path(runs).rglob("samples_*"))  # no checkpoint of a diverged run
