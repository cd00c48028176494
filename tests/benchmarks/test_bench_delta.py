"""benchmarks/bench_delta.py at its tiny shape, as a new user runs it (a relative --workdir, which
its child process, started in the repository, once could not find): the ΔW analysis runs in the
child and reports its tensors, time and peak memory.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_bench_delta.py
"""

from __future__ import annotations

import json


def test_the_analysis_runs_in_its_child_and_reports_memory(run_bench):
    run = run_bench("bench_delta.py", "--shape", "tiny", "--workdir", "out")
    result = json.loads((run.cwd / "out" / "bench_delta_tiny.json").read_text())
    assert result["tensors"] == 16 * 7 and result["layers"] == 16, result
    assert result["rows"] > 0 and result["wall_s"] > 0 and 0 < result["peak_rss_mib"] <= 1024
    assert (run.cwd / "out" / "bench_delta_tiny.png").stat().st_size > 0
    assert "target <= 1024 MiB: ok" in run.stdout
