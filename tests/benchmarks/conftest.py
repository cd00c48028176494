"""Fixtures for the benchmark tests: the GPU check's whole --smoke run, made once per session and
read by every stage's test (each stage alone would start its own run: minutes on 2 cores)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def gpu_check_smoke(tiny_world, tmp_path_factory) -> Path:
    """The output folder of `benchmarks/gpu_check/run.py --smoke` on the tiny world (every stage);
    the run itself must exit 0."""
    import time

    out = tmp_path_factory.mktemp("gpu_check") / "smoke"
    t0 = time.monotonic()
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu_check/run.py"), "--smoke", "--out", str(out), "--world", str(tiny_world)],
        cwd=out.parent, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (out / "wall_s.txt").write_text(f"{time.monotonic() - t0:.1f}")
    return out
