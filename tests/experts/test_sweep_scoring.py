"""experts/scoring.py: a GPU sweep scores its checkpoints on a GPU Ray reserves for it (not on
cuda:0 of whatever node the trial landed on), an in-trial GPU run reserves its GPU as a trial,
and scoring halves an int batch on out-of-memory.

Run: .venv/bin/python -m pytest -q tests/experts/test_scoring.py
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch

from layerswap.experts.scoring import (
    HEAD_NODE,
    score_backing_off,
    score_reserved,
    scoring_resources,
    trial_resources,
)
from layerswap.experts.sweep import SweepSetup
from layerswap.spaces.sweep import SweepConfig


def _setup(use_gpu: bool, executor: str, accelerator: str | None = None, **sweep) -> SweepSetup:
    return SweepSetup(
        experiment={"scaling": {"use_gpu": use_gpu, "accelerator_type": accelerator}},
        sweep=SweepConfig(**sweep),
        tasks=["t"], metric_task="t", include_path=None, int_params=set(),
        executor=executor, storage="unused",
    )  # fmt: skip


def test_who_reserves_the_gpu():
    gpu_nested = _setup(True, "ray_train")
    assert scoring_resources(gpu_nested) == {"num_gpus": 1, "num_cpus": 1.0}
    # The TorchTrainer's workers hold the GPUs; the trial driving it stays on the head node.
    assert trial_resources(gpu_nested) == {"cpu": 0, HEAD_NODE: 0.001}
    # Asked for the CPU, or a CPU run: CPUs reserved for scoring, not taken unreserved from the
    # head node where the trial sits.
    assert scoring_resources(_setup(True, "ray_train", device="cpu")) == {"num_cpus": 1.0}
    assert scoring_resources(_setup(False, "ray_train", cpus_per_trial=2)) == {"num_cpus": 2.0}
    assert scoring_resources(_setup(False, "in_trial")) is None
    assert trial_resources(_setup(False, "in_trial", cpus_per_trial=2)) == {"cpu": 2.0}
    assert trial_resources(_setup(True, "in_trial")) == {"cpu": 1.0, "gpu": 1}  # trains on it


def test_out_of_memory_halves_an_int_batch(capsys):
    seen = []

    def score(setup, checkpoints, trial_id, params):
        seen.append(setup.sweep.batch_size)
        if setup.sweep.batch_size > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return [{"batch": setup.sweep.batch_size}]

    assert score_backing_off(score, _setup(True, "ray_train", batch_size=16), [], "t1", {}) == [{"batch": 2}]  # fmt: skip
    assert seen == [16, 8, 4, 2]
    assert "out of memory scoring at batch 16; retrying at 8" in capsys.readouterr().out


def _reporter():
    """A score function that says which GPUs Ray gave the process it ran in (made here so Ray
    ships it by value: workers cannot import a test module)."""

    def score(setup, checkpoints, trial_id, params):
        import ray

        return [{"gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid()}]

    return score


@pytest.fixture(scope="module")
def one_fake_gpu():
    import ray

    tmp = tempfile.mkdtemp(prefix="lsx", dir="/tmp")
    ray.init(num_cpus=2, num_gpus=1, resources={"accelerator_type:H100": 1}, _temp_dir=tmp, include_dashboard=False, log_to_driver=False)  # fmt: skip
    yield
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def test_a_gpu_sweep_scores_in_a_task_holding_a_gpu_of_its_own(one_fake_gpu):
    (row,) = score_reserved(_reporter(), _setup(True, "ray_train"), [], "t1", {})
    assert row["gpu_ids"] == ["0"] and row["pid"] != os.getpid()
    (row,) = score_reserved(_reporter(), _setup(False, "in_trial"), [], "t1", {})
    assert row["gpu_ids"] == [] and row["pid"] == os.getpid()  # a CPU sweep scores in place


def test_scoring_asks_for_the_gpu_kind_the_experts_trained_on(one_fake_gpu):
    """scaling.accelerator_type reaches the scoring task: it runs on a node of that kind (this
    one is labelled H100) and waits for one otherwise (an autoscaler would start one)."""
    import ray

    (row,) = score_reserved(_reporter(), _setup(True, "ray_train", "H100"), [], "t1", {})
    assert row["gpu_ids"] == ["0"]
    opts = scoring_resources(_setup(True, "ray_train", "L40S"))
    assert opts == {"num_gpus": 1, "num_cpus": 1.0, "accelerator_type": "L40S"}

    def pid():
        return os.getpid()

    ready, _ = ray.wait([ray.remote(**opts)(pid).remote()], timeout=3)
    assert ready == []  # no L40S here: not placed on the H100 node
    assert "accelerator_type" not in scoring_resources(_setup(True, "ray_train", "H100", device="cpu"))  # fmt: skip


def test_a_trial_driving_ray_train_scores_outside_its_placement_group(one_fake_gpu, tmp_path):
    """Inside a Tune trial with the resources a ray_train sweep trial holds, the scoring task
    gets its GPU (or CPUs): Ray had tried to fit it into the trial's placement group, whose one
    bundle holds neither ("Cannot schedule score_backing_off with the placement group")."""
    from ray import tune

    score, setups = _reporter(), {g: _setup(g, "ray_train") for g in (True, False)}

    def trial(config):  # shipped by value with what it names (workers cannot import this module)
        (row,) = score_reserved(score, setups[config["gpu"]], [], "t1", {})
        tune.report({"gpu_ids": ",".join(row["gpu_ids"])})

    tuner = tune.Tuner(
        tune.with_resources(trial, trial_resources(_setup(True, "ray_train"))),
        param_space={"gpu": tune.grid_search([True, False])},
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    got = {r.config["gpu"]: (r.error, r.metrics.get("gpu_ids")) for r in tuner.fit()}
    assert got == {True: (None, "0"), False: (None, "")}, got


def test_head_node_resource_is_rays():
    """HEAD_NODE mirrors a private Ray constant (pinned Ray version): fail loudly if it moves."""
    import ray
    from ray._common.constants import HEAD_NODE_RESOURCE_NAME

    assert ray.__version__ == "2.60.0", "re-check HEAD_NODE against this Ray, then move the pin"
    assert HEAD_NODE == HEAD_NODE_RESOURCE_NAME
