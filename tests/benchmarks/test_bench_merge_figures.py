"""bench_merge's figures at more than one repeat, which its smoke run (one repeat) never reaches:
the contenders' order rotates per repeat so each runs once and none always first, and ratios of
medians, paired per-repeat ratios and the targets' verdicts follow benchmarks/merge_bench/.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_bench_merge_figures.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from merge_bench.contenders import NAMES, Contenders
from merge_bench.report import figures


def test_each_repeat_runs_every_contender_once_starting_one_later():
    c = Contenders(Path("run"), {}, None, {}, 16, {})
    orders = [[name for name, _ in c.order(r)] for r in range(len(NAMES) + 1)]
    assert all(sorted(o) == sorted(NAMES) for o in orders)
    assert [o[0] for o in orders] == [*NAMES, NAMES[0]]  # every contender first once, then again
    assert [fn.__name__ for _, fn in c.order(2)] == orders[2]  # each name runs its own contender


def test_ratios_of_medians_paired_ratios_and_verdicts():
    times = {
        "copy": [1.0, 2.0, 4.0],
        "merge": [1.2, 2.0, 8.0],  # medians 2.0 / 2.0: within 1.33, though one repeat was 2x
        "engine": [1.5, 3.0, 6.0],
        "mergekit": [4.0, 3.0, 16.0],
        "compose": [0.1, 0.1, 0.1],
        "roundtrip": [0.2, 0.4, 0.4],
        "startup": [0.5, 0.5, 0.5],
    }
    rss = {"merge": [900.0, 1100.0, 1000.0], "mergekit": [2000.0] * 3, "startup": [50.0] * 3}
    fig = figures(times, rss)
    assert fig.med["merge"] == 2.0 and fig.peak_merge == 1100.0
    assert fig.ratios["merge_over_copy"] == 1.0 and fig.ratios["engine_over_copy"] == 1.5
    assert fig.ratios["mergekit_over_merge"] == 2.0 and fig.ratios["compose_over_roundtrip"] == 0.25
    assert fig.paired["merge_over_copy"] == pytest.approx(1.2)  # median of 1.2, 1.0, 2.0
    assert fig.paired["mergekit_over_merge"] == pytest.approx(2.0)  # median of 3.33, 1.5, 2.0
    assert fig.verdict == {
        "merge_over_copy": True,
        "engine_over_copy": False,
        "mergekit_over_merge": True,
        "peak_rss_merge_mib": False,  # the largest repeat counts, not the median
    }
