"""Merge search and expert sweep on a 3-node Ray cluster on one machine (ray.cluster_utils).

A head without CPUs (the driver) and two worker nodes: trials spread over both workers, each
node reads each expert from disk once, the results equal a one-node run's with the same seed,
and losing a worker mid-search loses and repeats no trial.
Run: .venv/bin/python -m pytest -q tests/search/test_multinode_search.py   (slow: ~3 min)
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from audit_hook import sitecustomize as audit
from search_fixtures import experiment, make_experts

from layerswap.trainables.atomic import read_parquet

pytestmark = pytest.mark.slow

# Recipes given outright (magnitude weights, so none repeats the uniform warm start): the
# trials' recipes do not depend on which finished first, so two runs can be compared row by row.
POINTS = [
    {"bottom": b, "top": u, "bottom_transition": t, "weights": "magnitude"}
    for b, u, t in ((0, 0, 1), (1, 0, 0), (1, 1, 1), (2, 0, 0), (0, 1, 0))
]
KEEP = ("trial_id", "recipe_id", "status", "objective", "fidelity")


@pytest.fixture(scope="module")
def world_and_experts(tmp_path_factory):
    from layerswap.world import build_world

    world = build_world(tmp_path_factory.getbasetemp() / "tiny_world", size="tiny", progress=False)
    return world, make_experts(world, tmp_path_factory.mktemp("multinode") / "experts")


def _search(world, paths, limit: int = 8, **search):
    settings = {
        "num_samples": 1 + len(POINTS),
        "max_concurrent": 4,
        "cpus_per_trial": 0.5,  # two trial processes per 1-CPU node
        "expert_store": "node",
        "fidelity": {"screen": None},  # a screening bar depends on which trials finished first
        "points_to_evaluate": POINTS,
    }
    return experiment(
        world, paths, search=settings | search, proxy_eval={"limit": limit, "max_gen_toks": 8}
    )


def _rows(path: Path) -> list[dict]:
    return read_parquet(path).to_pylist()


def _scores(rows: list[dict]) -> dict[str, tuple]:
    proxies = sorted(k for k in rows[0] if k.startswith("proxy__"))
    return {r["trial_id"]: tuple(r[k] for k in (*KEEP, *proxies)) for r in rows}


def test_search_spreads_over_nodes_reads_experts_once_per_node_and_matches_one_node(
    world_and_experts, ray_cluster, tmp_path
):
    """Trials scheduled by (fake) GPU, half a GPU each: two trial processes per worker node."""
    from layerswap.search.search import run_search

    world, paths = world_and_experts
    exp = _search(world, paths, gpus_per_trial=0.5)
    log_dir = tmp_path / "audit"
    log_dir.mkdir()
    env = audit.environment(log_dir, [paths["task"].parent, paths["base"]])
    with ray_cluster(workers=2, cpus=1, gpus=1, env=env) as (_, nodes):
        multi = _rows(run_search(exp, tmp_path / "multi", progress=False).trials_path)
    ids = {n.node_id: name for name, n in nodes.items()}
    assert len(multi) == len(POINTS) + 1
    assert {ids[r["node_id"]] for r in multi} == {"w1", "w2"}  # both workers ran trials

    # From outside: which process on which node touched which expert. Loading an expert probes
    # its adapter_config.json first (is it LoRA?); the weights are then read by safetensors'
    # Rust code, which Python's audit hook does not see. Trial processes read the tokenizer.
    node_of = audit.read_nodes(log_dir)
    loads, trial_procs = defaultdict(list), defaultdict(set)
    for pid, _, path in audit.read_log(log_dir):
        p = Path(path)
        if p.name == "adapter_config.json":
            loads[node_of[pid], p.parent.name].append(pid)
        elif p.name == "tokenizer.json":
            trial_procs[node_of[pid]].add(pid)
    assert {n: len(p) for n, p in trial_procs.items()} == {"w1": 2, "w2": 2}
    experts = ("base", "task", "language")
    assert sorted(loads) == sorted((n, e) for n in ("w1", "w2") for e in experts)
    for node in ("w1", "w2"):
        (loader,) = {pid for e in experts for pid in loads[node, e]}  # one process per node
        assert all(len(loads[node, e]) == 1 for e in experts), dict(loads)  # each expert once
        assert loader not in trial_procs[node]  # the node's store, not a trial process

    assert {r["gpu_ids"] for r in multi} == {"0"}  # each node's one GPU, shared by two trials
    # The same search on one worker node with the two nodes' CPUs and GPUs.
    with ray_cluster(workers=1, cpus=2, gpus=2):
        one = _rows(run_search(exp, tmp_path / "one", progress=False).trials_path)
    assert _scores(multi) == _scores(one)


def test_search_survives_losing_a_worker_node_mid_search(world_and_experts, ray_cluster, tmp_path):
    """Worker w2 is removed while its trials run: Tune runs them again on w1, and the table
    ends with every trial exactly once."""
    import ray
    from ray.tune import ExperimentAnalysis

    from layerswap.search.expert_store import PREFIX
    from layerswap.search.search import run_search

    world, paths = world_and_experts
    # More items per proxy than the other test: a trial runs for seconds, long enough to lose.
    exp = _search(world, paths, limit=20, max_failures=2)
    removed = {}

    with ray_cluster(workers=2, cpus=1) as (cluster, nodes):
        w2 = nodes["w2"]

        def lose_w2_once_its_trials_run():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and "at" not in removed:
                names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
                # w2's expert store exists once a trial there has started loading experts.
                if any(n.startswith(PREFIX) and n.endswith(w2.node_id[:16]) for n in names):
                    rows = tmp_path / "run/search/trials.parquet"
                    removed["rows_before"] = len(_rows(rows)) if rows.exists() else 0
                    cluster.remove_node(w2)
                    removed["at"] = time.monotonic()
                time.sleep(0.2)

        killer = threading.Thread(target=lose_w2_once_its_trials_run, daemon=True)
        killer.start()
        res = run_search(exp, tmp_path / "run", progress=False)
        killer.join()
        survivors = {n["NodeID"] for n in ray.nodes() if n["Alive"]}

    assert "at" in removed and removed["rows_before"] < len(POINTS) + 1  # lost mid-search
    assert w2.node_id not in survivors and nodes["w1"].node_id in survivors
    rows = _rows(res.trials_path)
    assert sorted(r["trial_id"] for r in rows) == [f"{i:04d}" for i in range(len(POINTS) + 1)]
    assert len({r["recipe_id"] for r in rows}) == len(rows)  # no recipe lost or run twice
    assert all(r["status"] == "ok" for r in rows), [(r["trial_id"], r["error"]) for r in rows]
    # Tune's own record: the trials that were running on w2 failed once and ran again.
    (tune_dir,) = (tmp_path / "run/search/tune").iterdir()
    failures = [t.num_failures for t in ExperimentAnalysis(str(tune_dir)).trials]
    assert sum(failures) >= 1 and max(failures) <= exp.search.max_failures


def _sweep(world: Path):
    """A 4-trial random expert sweep of the tiny world's math expert (2 trials at once)."""
    from layerswap.spaces.train_experiment import parse_train_experiment

    return parse_train_experiment(
        {
            "name": "sweep_math",
            "base": str(world / "base"),
            "kind": "math",
            "language": "en",
            "datasets": [{"path": str(world / "data/sft/math_en.jsonl")}],
            "mode": "full",
            "hyper": {"lr": 1e-3, "max_steps": 4, "batch_size": 4, "seq_len": 64},
            "checkpoint_every_samples": 8,
            "sweep": {
                "num_samples": 4,
                "seed": 0,
                "algorithm": "random",  # the same parameters in the same order, however placed
                "params": {"hyper.lr": {"low": 1e-4, "high": 3e-3, "log": True}},
                "indicators": ["world_belebele_en_dev"],
                "limit": 8,
                "max_gen_toks": 8,
                "max_concurrent": 2,
            },
        }
    )


def test_expert_sweep_spreads_over_nodes_and_matches_one_node(
    world_and_experts, ray_cluster, ray_one_node, tmp_path
):
    from layerswap.experts.registry import read_rows
    from layerswap.experts.sweep import run_sweep

    world, _ = world_and_experts
    exp = _sweep(world)
    log_dir = tmp_path / "audit"
    log_dir.mkdir()
    env = audit.environment(log_dir, [world / "base"])
    with ray_cluster(workers=2, cpus=1, env=env) as _:
        multi = run_sweep(exp, tmp_path / "multi")
    with ray_one_node():
        one = run_sweep(exp, tmp_path / "one")
    assert set(multi.trials.values()) == set(one.trials.values()) == {"ok"}
    # Training processes on both worker nodes read the base (from outside: the audit hook).
    node_of = audit.read_nodes(log_dir)
    readers = {node_of[pid] for pid, _, p in audit.read_log(log_dir) if p.endswith("config.json")}
    assert readers == {"w1", "w2"}

    def scores(rows: list[dict]) -> list[tuple]:
        col = "ind__world_belebele_en_dev"
        return sorted((r["hparams"], r["seed"], r["step"], r["samples"], r[col]) for r in rows)

    assert len(multi.rows) == len(one.rows) == 8  # 2 checkpoints of each of 4 trials
    assert scores(read_rows(multi.registry)) == scores(read_rows(one.registry))
