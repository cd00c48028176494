"""benchmarks/bench_merge.py at its tiny shape, as a new user runs it (a relative --workdir):
every contender runs (the CLI merge, the engine, mergekit, compose, the round trip, a copy) and
the outputs agree, so the benchmark cannot rot unnoticed (its expert generator once had).

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_bench_merge.py   (slow: ~30-60 s)
"""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_every_contender_runs_and_the_outputs_agree(run_bench):
    run = run_bench("bench_merge.py", "--shape", "tiny", "--repeats", "1", "--workdir", "out")
    result = json.loads((run.cwd / "out" / "bench_merge.json").read_text())
    assert result["shape"] == "tiny" and result["tensors"] > 0
    assert result["mergekit_vs_ours"]["ok"] and result["compose_vs_disk_equal"], run.tail()
    assert set(result["median_s"]) == {"copy", "merge", "engine", "mergekit", "compose", "roundtrip", "startup"}  # fmt: skip
    assert all(t > 0 for t in result["median_s"].values()), result["median_s"]
    assert all(r > 0 for r in result["peak_rss_mib"]["merge"] + result["peak_rss_mib"]["mergekit"])
    assert "mergekit / merge" in run.stdout
