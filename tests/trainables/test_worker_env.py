"""Every Ray process gets the driver's Hugging Face / layerswap variables (ray_session.worker_env),
on a real multi-node `ray.cluster_utils.Cluster` whose worker nodes started before the driver set
them, as on a `ray up` cluster where workers inherit nothing from the shell that runs layerswap.

Run: .venv/bin/python -m pytest -q tests/trainables/test_worker_env.py
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from layerswap.trainables.ray_session import WORKER_ENV, init_ray, worker_env

SEEN = (
    "HF_TOKEN",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "LAYERSWAP_ALLOW_CPU",
    "UNRELATED_SECRET",
)


def test_worker_env_takes_the_named_variables_and_layerswaps_own():
    env = {"HF_TOKEN": "t", "HF_HUB_OFFLINE": "0", "LAYERSWAP_X": "1", "HOME": "/h", "PATH": "/b"}
    assert worker_env(env) == {"HF_TOKEN": "t", "HF_HUB_OFFLINE": "0", "LAYERSWAP_X": "1"}
    assert "HF_TOKEN" in WORKER_ENV and "HF_HUB_OFFLINE" in WORKER_ENV


@pytest.fixture
def cluster_then_driver_env(monkeypatch):
    """A head (0 CPUs) and one worker node, started BEFORE the driver's variables are set."""
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="lse", dir="/tmp")
    os.makedirs(os.path.join(tmp, "ray"))
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    for k in SEEN:
        monkeypatch.delenv(k, raising=False)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "temp_dir": tmp, "include_dashboard": False})  # fmt: skip
    cluster.add_node(num_cpus=1)
    monkeypatch.setenv("HF_TOKEN", "hf_only_the_driver_has_it")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the user wants the Hub
    monkeypatch.setenv("LAYERSWAP_ALLOW_CPU", "1")
    monkeypatch.setenv("UNRELATED_SECRET", "not for workers")
    try:
        yield cluster
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def _reader():
    """A function reporting what a layerswap worker sees after layerswap's own offline default
    has run (made here, so Ray ships it by value: workers cannot import a test module)."""
    names = SEEN

    def read():
        import os

        from layerswap.trainables.evaluate.lm_eval_api import offline_defaults

        offline_defaults()
        return {k: os.environ.get(k) for k in names}

    return read


WANT = {
    "HF_TOKEN": "hf_only_the_driver_has_it",
    "HF_HUB_OFFLINE": "0",  # not forced offline: the user's choice reached the worker
    "HF_DATASETS_OFFLINE": "1",  # unset by the user: layerswap's offline default, as before
    "LAYERSWAP_ALLOW_CPU": "1",
    "UNRELATED_SECRET": None,  # only the named variables travel
}


def test_a_task_and_a_tune_trial_on_another_node_see_the_drivers_variables(cluster_then_driver_env):
    import ray
    from ray import tune

    init_ray(address=cluster_then_driver_env.address, log_to_driver=False)
    assert ray.get(ray.remote(num_cpus=1)(_reader()).remote()) == WANT

    read = _reader()

    def trial(config):
        tune.report(read())

    grid = tune.Tuner(
        trial,
        run_config=tune.RunConfig(storage_path=os.environ["RAY_TMPDIR"], verbose=0),
    ).fit()
    got = grid[0].metrics
    assert {k: got.get(k) for k in SEEN} == WANT


@pytest.mark.slow
def test_a_ray_train_worker_on_another_node_sees_the_drivers_variables(cluster_then_driver_env):
    import ray
    from ray import train
    from ray.train.torch import TorchTrainer

    init_ray(address=cluster_then_driver_env.address, log_to_driver=False)

    read = _reader()
    seen = Path(os.environ["RAY_TMPDIR"]) / "train_worker_env.json"  # one machine: shared disk

    def loop():
        seen.write_text(json.dumps(read()))

    TorchTrainer(
        loop,
        scaling_config=train.ScalingConfig(num_workers=1, use_gpu=False),
        run_config=train.RunConfig(storage_path=os.environ["RAY_TMPDIR"]),
    ).fit()
    assert json.loads(seen.read_text()) == WANT
    assert ray.is_initialized()
