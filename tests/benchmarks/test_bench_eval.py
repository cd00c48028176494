"""benchmarks/bench_eval.py at a tiny size on CPU, as a new user runs it: the cached evaluator
and lm-eval's HFLM both score every candidate (the test suite's tiny Llamas, and the shapes.py
path the llama-8b run takes, at llama-tiny), and the timings and agreement are printed.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_bench_eval.py   (slow: ~15-30 s each)
"""

from __future__ import annotations

import re

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["tiny", "llama-tiny"])
def test_both_contenders_score_every_candidate(run_bench, shape):
    run = run_bench(
        "bench_eval.py", "--shape", shape, "--device", "cpu", "--models", "2", "--items", "4",
        "--max-gen-toks", "4", "--hflm-batch-sizes", "1,4",
    )  # fmt: skip
    medians = [float(m) for m in re.findall(r"per candidate median +([\d.]+) s", run.stdout)]
    assert len(medians) == 3 and all(m > 0 for m in medians), run.tail()  # cached, HFLM 1 and 4
    differ = re.search(r"differing from HFLM batch 1: (\d+)/(\d+)", run.stdout)
    assert differ and int(differ[2]) == 2 * (4 + 4), run.tail()  # 2 candidates x 8 items
    assert re.search(
        r"speed-up per candidate vs HFLM at its best batch \(\d\): [\d.]+x", run.stdout
    )
