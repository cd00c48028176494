"""benchmarks/world_signal.py as a new user runs it (a relative --world), at a tiny size: the
tiny world read as it is (not rebuilt at the full size), one SFT seed of each expert at two
steps, and every accuracy printed.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_world_signal.py
"""

from __future__ import annotations

import re


def test_the_base_and_both_experts_are_scored(tiny_world, run_bench):
    run = run_bench("world_signal.py", "--world", "world", "--sft-seeds", "0", "--math-steps", "2", "--lang-steps", "2", links={"world": tiny_world})  # fmt: skip
    lines = run.stdout.splitlines()
    for start in ("base: ", "math SFT seed 0: ", "lang SFT seed 0: "):
        line = next((x for x in lines if x.startswith(start)), None)
        assert line is not None, run.tail()
        scores = [float(v) for v in re.findall(r" (\d\.\d\d)\b", line)]
        assert scores and all(0 <= v <= 1 for v in scores), line


def test_bad_seeds_are_named(run_bench):
    run = run_bench("world_signal.py", "--sft-seeds", "0,x", expect=2)
    assert "'0,x'" in run.stderr
