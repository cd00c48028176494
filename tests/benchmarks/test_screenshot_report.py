"""benchmarks/screenshot_report.py as a new user runs it (a relative --out): the analysis tests'
synthetic run analysed, its report rendered in headless Chromium and the PNG checked. Skipped
when no Chromium is installed, except under CI (`CI` set), where that fails, as in
tests/analysis/test_screenshot.py.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_screenshot_report.py   (slow: ~20 s)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from screenshot_report import find_browser

IN_CI = bool(os.environ.get("CI"))


@pytest.mark.slow
@pytest.mark.skipif(find_browser() is None and not IN_CI, reason="no chromium on PATH")
def test_the_synthetic_runs_report_is_screenshot(run_bench):
    assert find_browser() is not None, "CI is set and no Chromium is on PATH (.ci/run installs it)"
    run = run_bench("screenshot_report.py", "--synthetic", "--out", "shots/report.png", "--height", "1200")  # fmt: skip
    png = run.cwd / "shots" / "report.png"
    assert png.stat().st_size > 0
    found = re.search(r"\((\d+)x(\d+), (\d+)% non-white pixels\)", run.stdout)
    assert found and (found[1], found[2]) == ("1280", "1200") and int(found[3]) >= 1, run.tail()
