"""benchmarks/bench_train_step.py at a tiny shape on CPU, as a new user runs it: the script must
run the trainer's own step path end to end (ddp, and fsdp with offload over its 1-process gloo
group) and write its results, so the GPU benchmark the docs name cannot rot unnoticed.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_bench_train_step.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("strategy", [["--strategy", "ddp"], ["--strategy", "fsdp", "--offload"]])
def test_a_tiny_step_runs_through_the_trainer(tiny_world, tmp_path, strategy):
    out = tmp_path / "step.json"
    cmd = [sys.executable, str(ROOT / "benchmarks/bench_train_step.py"), "--shape", "llama-tiny",
           "--world", str(tiny_world), "--device", "cpu", "--seq-len", "16", "--micro-batch", "1",
           "--steps", "1", *strategy, "--out", str(out)]  # fmt: skip
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["config"]["strategy"] == strategy[1]
    assert result["parameters"] > 0
    assert result["tokens_per_s"] > 0, result
