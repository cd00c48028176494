"""Ray Train on a 3-node Ray cluster on one machine: the node running the training worker is
removed mid-run, and the run resumes from its last checkpoint on the surviving node with every
step exactly once.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_node_loss.py   (slow: ~1 min)
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

AUDIT = Path(__file__).parents[2] / "search"  # tests/search/audit_hook lives there


def _experiment(world: Path, tmp: Path, log: Path):
    """12 steps of 8 samples, a checkpoint after steps 4, 8 and 12, slow enough to lose a node
    between the checkpoints at steps 4 and 8."""
    from tests.trainables.train.train_helpers import make_exp

    return make_exp(
        world,
        name="node_loss",
        checkpoint_every_samples=32,
        storage_path=str(tmp / "store"),
        failure={"max_failures": 2},
        debug={"step_log": str(log), "step_delay_s": 0.4},
    )


def _readers(audit, audit_dir: Path) -> set[str]:
    """The nodes whose processes read the base's config.json (training workers load the base)."""
    node_of = audit.read_nodes(audit_dir)
    return {node_of[pid] for pid, _, p in audit.read_log(audit_dir) if p.endswith("config.json")}


def test_training_resumes_on_a_surviving_node(tiny_world, ray_cluster, tmp_path, monkeypatch):
    import ray

    monkeypatch.syspath_prepend(str(AUDIT))
    from audit_hook import sitecustomize as audit

    from layerswap.trainables.train import find_checkpoints, read_manifest
    from layerswap.trainables.train.ray_train import train_with_ray

    log, audit_dir = tmp_path / "steps.jsonl", tmp_path / "audit"
    audit_dir.mkdir()
    exp = _experiment(tiny_world, tmp_path, log)
    env = audit.environment(audit_dir, [tiny_world / "base"])
    lost = {}

    with ray_cluster(workers=2, cpus=1, env=env) as (cluster, nodes):

        def remove_the_training_node():
            # An error here would otherwise die with the thread and leave only `lost == {}`.
            try:
                # Until training ends, not a fixed deadline: on a loaded machine Ray's start-up
                # alone took minutes (a 180 s deadline ran out before step 5).
                while not trained.is_set():
                    steps = [json.loads(x)["step"] for x in log.read_text().splitlines()] if log.exists() else []  # fmt: skip
                    readers = _readers(audit, audit_dir) if steps and steps[-1] >= 5 else set()
                    lost["readers seen"] = sorted(readers)
                    if len(readers) == 1:  # the worker's node, from outside
                        (name,) = readers
                        lost.update(node=name, at_step=steps[-1])
                        cluster.remove_node(nodes[name])
                        return
                    time.sleep(0.1)
            except Exception as e:  # reported by the assertion below
                lost["error"] = repr(e)

        trained = threading.Event()
        remover = threading.Thread(target=remove_the_training_node, daemon=True)
        remover.start()
        try:
            res = train_with_ray(exp)
        finally:
            trained.set()
            remover.join()
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}

    assert res.error is None, res.error
    assert 5 <= lost.get("at_step", -1) < 8, lost
    assert {name for name, n in nodes.items() if n.node_id in alive} == {"w1", "w2"} - {
        lost["node"]
    }
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    first = [r["step"] for r in rows if r["start"] == 0]
    second = [r["step"] for r in rows if r["start"] != 0]
    assert {r["start"] for r in rows if r["start"] != 0} == {4}  # resumed from samples_32
    # attempt one up to its checkpoint + attempt two: every step exactly once
    assert [s for s in first if s <= 4] + second == list(range(1, 13))
    assert _readers(audit, audit_dir) == {"w1", "w2"}  # the second attempt ran on the survivor
    ckpts = find_checkpoints(res.path)
    assert [c.name for c in ckpts] == ["samples_000000032", "samples_000000064", "samples_000000096"]  # fmt: skip
    assert read_manifest(res.checkpoint)["step"] == 12
