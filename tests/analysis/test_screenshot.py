"""The HTML report opens in headless Chromium (skipped only when no Chromium is installed);
the same check as `python benchmarks/screenshot_report.py`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from screenshot_report import check_png, find_browser, screenshot


@pytest.mark.slow
@pytest.mark.skipif(find_browser() is None, reason="no chromium on PATH")
def test_report_screenshot_in_headless_chromium(report, tmp_path):
    png = screenshot(report / "report.html", tmp_path / "shot.png", height=2400)
    w, h, inked = check_png(png)
    assert (w, h) == (1280, 2400) and inked > 0.03
