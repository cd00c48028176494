"""The HTML report opens in headless Chromium; the same check as
`python benchmarks/screenshot_report.py`. Skipped when no Chromium is installed, except under CI
(`CI` set, as .ci/run does and hosted CI services do), where a missing browser fails the test:
CI installs Debian's `chromium`, so a skip there would hide a broken set-up.

Run: .venv/bin/python -m pytest -q tests/analysis/test_screenshot.py   (slow: ~30 s, mostly the
synthetic run's analysis)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from screenshot_report import BROWSERS, check_png, find_browser, screenshot

IN_CI = bool(os.environ.get("CI"))


@pytest.mark.slow
@pytest.mark.skipif(find_browser() is None and not IN_CI, reason="no chromium on PATH")
def test_report_screenshot_in_headless_chromium(report, tmp_path):
    if find_browser() is None:
        pytest.fail(
            f"CI is set and no Chromium is on PATH (tried {', '.join(BROWSERS)}); CI must run "
            "the browser test: install it (Debian: apt-get install -y chromium; .ci/run does)"
        )
    png = screenshot(report / "report.html", tmp_path / "shot.png", height=2400)
    w, h, inked = check_png(png)
    assert (w, h) == (1280, 2400) and inked > 0.03
