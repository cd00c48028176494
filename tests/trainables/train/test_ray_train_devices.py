"""A Ray Train GPU run whose workers have no usable CUDA says so, naming scaling.use_gpu (NCCL's
start-up failing, or a worker's own check: DeviceUnusable, not retried), or, with
LAYERSWAP_ALLOW_CPU=1 where the command runs, trains on the workers' CPUs over gloo; workers no
node can hold are refused before training.

Ray Train's get_device handed a worker cuda:N unchecked: with Ray's fake GPUs here (a fake-GPU
red-team) the run failed as "Distributed package doesn't have NCCL built in", naming nothing,
and the opt-in did not apply. Run: .venv/bin/python -m pytest -q
tests/trainables/train/test_ray_train_devices.py   (slow: Ray fits)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager

import pytest

from layerswap.trainables.train.ray_train import process_group_backend


def test_the_backend_is_nccl_for_gpus_unless_the_cpu_is_allowed_here(monkeypatch):
    import torch

    monkeypatch.delenv("LAYERSWAP_ALLOW_CPU", raising=False)
    assert process_group_backend(False) == "gloo"
    # Decided where the command runs, for every worker: NCCL unless the CPU was allowed here.
    assert process_group_backend(True) == "cpu:gloo,cuda:nccl"
    monkeypatch.setenv("LAYERSWAP_ALLOW_CPU", "1")
    assert process_group_backend(True) == "gloo"  # no CUDA here: the workers run on CPUs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert process_group_backend(True) == "cpu:gloo,cuda:nccl"  # a GPU here: the opt-in is moot


def test_a_worker_with_cuda_trains_on_its_cpu_when_the_driver_chose_gloo(monkeypatch):
    """LAYERSWAP_ALLOW_CPU=1 on a driver without CUDA (a CPU login node joined to a GPU cluster)
    makes the group gloo-only; a worker whose node has CUDA took its GPU anyway, and its CUDA
    tensors went over gloo (FSDP2's reduce-scatter fails there, DDP crawls). The worker's device
    follows the driver's backend: the CPU in a gloo group, its GPU in an NCCL one."""
    import ray.train.torch
    import torch

    from layerswap.trainables.train import ray_train

    monkeypatch.setenv("LAYERSWAP_ALLOW_CPU", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the driver
    backend = process_group_backend(True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a worker on a GPU node
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("cuda", 0))
    assert ray_train._worker_device(True, backend) == "cpu"
    assert ray_train._worker_device(True, process_group_backend(True)) == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a worker without CUDA
    assert ray_train._worker_device(True, "cpu:gloo,cuda:nccl") == "cpu"  # allowed: its CPU
    assert ray_train._worker_device(False, "gloo") == "cpu"


@contextmanager
def _fake_gpu_ray(allow_cpu: bool):
    """A local Ray with 1 GPU it does not have; its workers see LAYERSWAP_ALLOW_CPU as set here."""
    import ray

    tmp = tempfile.mkdtemp(prefix="lsd", dir="/tmp")
    before = os.environ.pop("LAYERSWAP_ALLOW_CPU", None)
    if allow_cpu:
        os.environ["LAYERSWAP_ALLOW_CPU"] = "1"
    ray.init(num_cpus=2, num_gpus=1, _temp_dir=tmp, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        os.environ.pop("LAYERSWAP_ALLOW_CPU", None)
        if before is not None:
            os.environ["LAYERSWAP_ALLOW_CPU"] = before
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_a_gpu_run_whose_workers_cannot_start_nccl_says_so_or_runs_on_cpus_when_allowed(
    tiny_world, tmp_path
):
    from layerswap.trainables.train.ray_failures import NCCL_HINT
    from layerswap.trainables.train.ray_train import train_with_ray
    from tests.trainables.train.train_helpers import make_exp

    exp = make_exp(
        tiny_world,
        hyper={"max_steps": 2},
        scaling={"num_workers": 1, "use_gpu": True, "cpus_per_worker": 1},
        failure={"max_failures": 2},
        storage_path=str(tmp_path / "store"),
    )
    with _fake_gpu_ray(allow_cpu=False):  # NCCL cannot start on the CPU-only torch here
        res = train_with_ray(exp)
    assert res.error is not None and res.error.startswith(NCCL_HINT), res.error
    with _fake_gpu_ray(allow_cpu=True):
        res = train_with_ray(exp.model_copy(update={"storage_path": str(tmp_path / "store2")}))
    assert res.error is None and res.checkpoint is not None


@pytest.mark.slow
def test_workers_no_node_can_hold_are_refused_at_once_on_a_ray_started_here(tiny_world, tmp_path):
    """The shipped configs' accelerator_type: H100 on a machine without one waited in Ray's
    queue forever, printing nothing (fake-GPU red-team): refused before fit, in one line."""
    import time

    from layerswap.trainables.train.ray_train import train_with_ray
    from tests.trainables.train.train_helpers import make_exp

    exp = make_exp(
        tiny_world,
        scaling={
            "num_workers": 1,
            "use_gpu": True,
            "cpus_per_worker": 1,
            "accelerator_type": "H100",
        },
        storage_path=str(tmp_path / "store"),
    )
    with _fake_gpu_ray(allow_cpu=True):
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=r"1 worker\(s\) of \{CPU: 1, GPU: 1, accelerator_type:H100: 0\.001\} do not fit this Ray cluster \(room for 0"):  # fmt: skip
            train_with_ray(exp)
        assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_train_refuses_unplaceable_workers_before_marking_the_run(tiny_world, tmp_path):
    """From outside: `layerswap train` exits 2 naming the workers, and leaves no run folder that
    would block the corrected rerun (a review of the capacity check found it marked first)."""
    import subprocess
    import sys

    import yaml

    from tests.trainables.train.train_helpers import make_exp

    exp = make_exp(tiny_world, scaling={"num_workers": 1, "use_gpu": True, "accelerator_type": "H100"})  # fmt: skip
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json")))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"LAYERSWAP_ALLOW_CPU": "1"}  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "layerswap.cli", "train", str(f), "--out", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-2000:]
    assert "1 worker(s) of {CPU: 8, GPU: 1, accelerator_type:H100: 0.001} do not fit this Ray cluster" in run.stderr  # fmt: skip
    assert not (tmp_path / "run" / "train" / exp.name).exists()
