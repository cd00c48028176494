"""Fixtures for the benchmark tests: the GPU check's whole --smoke run, made once per session and
read by every stage's test (each stage alone would start its own run: minutes on 2 cores); the
inputs the scripts' smoke runs share (`tiny_experts`), and `run_bench`, which runs a script as a
user would: a subprocess in a fresh working directory, given paths relative to it."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def gpu_check_smoke(tiny_world, tmp_path_factory) -> Path:
    """The output folder of `benchmarks/gpu_check/run.py --smoke` on the tiny world (every stage);
    the run itself must exit 0. Made once per test run: pytest-xdist's processes share it, the
    first to take the lock runs it and the others read its folder (each would otherwise spend a
    minute of the two cores on its own)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's base folder, above every process's own
    out = root / "gpu_check_smoke"
    with open(root / "gpu_check_smoke.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (out / "done").exists():  # written last, after a run that passed
            shutil.rmtree(out, ignore_errors=True)  # what a failed run in another process left
            out.mkdir()
            t0 = time.monotonic()
            run = subprocess.run(
                [sys.executable, str(ROOT / "benchmarks/gpu_check/run.py"), "--smoke", "--out", str(out / "smoke"), "--world", str(tiny_world)],
                cwd=out, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            (out / "smoke" / "wall_s.txt").write_text(f"{time.monotonic() - t0:.1f}")
            (out / "done").touch()
    return out / "smoke"


@pytest.fixture(scope="session")
def tiny_experts(tiny_world, tmp_path_factory) -> dict[str, Path]:
    """Checkpoints next to the tiny world's base (tests/search/search_fixtures.make_experts: the
    base perturbed): "task", "language", "language2", and "nan_lang" (a NaN tensor)."""
    sys.path.insert(0, str(ROOT / "tests" / "search"))
    from search_fixtures import make_experts  # lazy: a test helper module, not on the path

    return make_experts(tiny_world, tmp_path_factory.mktemp("tiny_experts"), nan_expert=True)


@dataclass
class BenchRun:
    """One finished script run: its exit code, output, working directory and wall seconds."""

    returncode: int
    stdout: str
    stderr: str
    cwd: Path
    wall_s: float

    def tail(self) -> str:
        """The ends of both streams, for an assertion message."""
        return f"exit {self.returncode} after {self.wall_s:.0f} s\n{self.stdout[-3000:]}\n{self.stderr[-3000:]}"  # fmt: skip


@pytest.fixture
def run_bench(tmp_path):
    """`run_bench(script, *args, links={name: path}, expect=0)`: run benchmarks/<script> as a new
    user would, from a fresh working directory in which each `links` name is a symlink to its
    path, so the arguments can name inputs by relative paths; the exit code must be `expect`."""

    def run(script: str, *args, links: dict | None = None, expect: int = 0, timeout: int = 600) -> BenchRun:  # fmt: skip
        cwd = tmp_path / "cwd"
        cwd.mkdir(exist_ok=True)
        for name, target in (links or {}).items():
            (cwd / name).parent.mkdir(parents=True, exist_ok=True)
            (cwd / name).symlink_to(Path(target).resolve())
        # a new user's shell: no Ray cluster of this test session to attach to
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / script), *map(str, args)],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        out = BenchRun(proc.returncode, proc.stdout, proc.stderr, cwd, time.monotonic() - t0)
        assert out.returncode == expect, out.tail()
        return out

    return run
