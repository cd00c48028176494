"""Fixtures shared by the analysis tests: one synthetic run directory and its report per session."""

from __future__ import annotations

import pytest
from analysis_synth import make_run

from layerswap.cli import main


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("analyze"))


@pytest.fixture(scope="session")
def report(run_dir):
    out = run_dir.parent / "report"
    assert main(["analyze", str(run_dir), "--out", str(out), "--resamples", "200"]) == 0
    return out
