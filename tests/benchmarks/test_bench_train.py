"""benchmarks/bench_train.py at a tiny size, as a new user runs it (a relative --world, which
Ray's training worker reads from another working directory): the plain loop and Ray Train both
train and their tokens/s are compared.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_bench_train.py   (slow: ~1 min, mostly
Ray's start-up)
"""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_the_plain_loop_and_ray_train_both_train(tiny_world, run_bench):
    run = run_bench(
        "bench_train.py", "--world", "world", "--steps", "4", "--hidden", "32", "--layers", "2",
        "--batch-size", "2", "--log-every", "1", "--skip-strategies", "--skip-plain2",
        "--out", "train.json", links={"world": tiny_world},
    )  # fmt: skip
    res = json.loads((run.cwd / "train.json").read_text())
    for arm in ("plain1", "ray"):
        assert res[arm]["steps"] == 4 and res[arm]["tokens"] > 0, res[arm]
        assert res[arm]["tokens_per_s"] > 0
    assert res["ratio_ray_over_plain"] > 0
    assert "Ray Train / plain loop tokens/s" in run.stdout


def test_one_step_is_refused_it_gives_no_tokens_per_s(run_bench):
    run = run_bench("bench_train.py", "--steps", "1", expect=2)
    assert "--steps 1" in run.stderr
