"""Fixtures for the expert-sweep tests: `ray_local`, a local Ray of two CPUs per test module (a
sweep trial's nested TorchTrainer worker needs a CPU beside the trial; each start-up costs as
much as a tiny sweep, so one per module)."""

from __future__ import annotations

import shutil
import tempfile

import pytest


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray for the module's sweeps."""
    import ray

    tmp = tempfile.mkdtemp(prefix="lswsw", dir="/tmp")  # short: Ray's socket paths have a limit
    ray.init(num_cpus=2, _temp_dir=tmp, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
