"""benchmarks/bench_train_step.py at a tiny shape on CPU, as a new user runs it (from a fresh
working directory, paths relative to it): the script must run the trainer's own step path end to
end (ddp, and fsdp with offload over its 1-process gloo group) and write its results, so the GPU
benchmark the docs name cannot rot unnoticed.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_bench_train_step.py
"""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("strategy", [["--strategy", "ddp"], ["--strategy", "fsdp", "--offload"]])
def test_a_tiny_step_runs_through_the_trainer(tiny_world, run_bench, strategy):
    run = run_bench(
        "bench_train_step.py", "--shape", "llama-tiny", "--world", "world", "--device", "cpu",
        "--seq-len", "16", "--micro-batch", "1", "--steps", "1", *strategy, "--out", "step.json",
        links={"world": tiny_world}, timeout=300,
    )  # fmt: skip
    result = json.loads((run.cwd / "step.json").read_text())
    assert result["config"]["strategy"] == strategy[1]
    assert result["parameters"] > 0
    assert result["tokens_per_s"] > 0, result


def test_no_timed_step_is_refused(run_bench):
    run = run_bench("bench_train_step.py", "--steps", "0", expect=2)
    assert "--steps 0" in run.stderr
