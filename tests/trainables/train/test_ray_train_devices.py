"""A Ray Train GPU run checks each worker's CUDA like a local run: the one-line DeviceUnusable
naming scaling.use_gpu (not retried), or, with LAYERSWAP_ALLOW_CPU=1, a CPU run over gloo.

Ray Train's get_device handed a worker cuda:N unchecked, and the backend was NCCL however the
workers' torch was built: with Ray's fake GPUs here (a fake-GPU red-team) that failed as "Distributed
package doesn't have NCCL built in", then "Torch not compiled with CUDA enabled", naming nothing.
Run: .venv/bin/python -m pytest -q tests/trainables/train/test_ray_train_devices.py  (slow: 2 Ray fits)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager

import pytest

from layerswap.trainables.train.ray_train import process_group_backend


def test_the_backend_follows_the_gpu_nccl_and_the_cpu_opt_in(monkeypatch):
    import torch
    import torch.distributed as dist

    monkeypatch.delenv("LAYERSWAP_ALLOW_CPU", raising=False)
    assert process_group_backend(False) == "gloo"
    # This CPU-only torch has no NCCL: gloo, so the workers can say why they have no GPU.
    assert not dist.is_nccl_available() and process_group_backend(True) == "gloo"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)  # a CUDA build, as on a GPU node
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert process_group_backend(True) == "cpu:gloo,cuda:nccl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # its driver too old, say
    assert process_group_backend(True) == "cpu:gloo,cuda:nccl"  # the workers' check says so
    monkeypatch.setenv("LAYERSWAP_ALLOW_CPU", "1")
    assert process_group_backend(True) == "gloo"  # allowed onto the CPU: NCCL cannot start


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
def test_a_gpu_worker_without_cuda_says_so_or_runs_on_the_cpu_when_allowed(tiny_world, tmp_path):
    from layerswap.trainables.devices import DeviceUnusable
    from layerswap.trainables.train.ray_train import train_with_ray
    from tests.trainables.train.train_helpers import make_exp

    exp = make_exp(
        tiny_world,
        hyper={"max_steps": 2},
        scaling={"num_workers": 1, "use_gpu": True, "cpus_per_worker": 1},
        failure={"max_failures": 2},
        storage_path=str(tmp_path / "store"),
    )
    with _fake_gpu_ray(allow_cpu=False):
        with pytest.raises(DeviceUnusable, match=r"scaling\.use_gpu asks for a GPU, but torch .* sees no usable CUDA GPU"):  # fmt: skip
            train_with_ray(exp)
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
