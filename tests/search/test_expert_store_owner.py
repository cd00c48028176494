"""A search's node stores end with its driver, however the driver ends (here: SIGKILL).

Run: .venv/bin/python -m pytest -q tests/search/test_expert_store_owner.py   (slow: a Ray cluster)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import save_file

DRIVER = """
import sys, time, ray
from layerswap.search.expert_store import node_loader, start_stores
ray.init(address=sys.argv[1], log_to_driver=False)
owner = start_stores("killed", None)

@ray.remote(num_cpus=1)
def trial(expert):
    return float(next(iter(node_loader("killed")(expert)[0].values())).double().sum())

print(ray.get(trial.remote(sys.argv[2])), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_killed_driver_takes_its_node_stores_with_it(ray_cluster, tmp_path):
    """SIGKILL the search driver while a node holds its experts: the store ends with it, so it
    frees the node's memory and no later run can read those (maybe since rewritten) weights."""
    import ray

    from layerswap.search.expert_store import NAMESPACE

    expert = tmp_path / "expert"
    expert.mkdir()
    (expert / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": torch.ones(4)}, str(expert / "model.safetensors"))

    def stores() -> list[str]:
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]  # fmt: skip

    with ray_cluster(workers=1, cpus=1) as (cluster, _):
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, cluster.address, str(expert)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            # A trial has read the expert from its node's store.
            assert float(driver.stdout.readline()) == 4.0
            assert any("killed" in n for n in stores())
            driver.kill()
            driver.wait(timeout=30)
            deadline = time.monotonic() + 60
            while stores() and time.monotonic() < deadline:
                time.sleep(0.5)
            assert stores() == []
        finally:
            driver.kill()
            driver.wait(timeout=30)
