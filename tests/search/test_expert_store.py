"""The per-node expert store and GPU trials on a CPU machine whose Ray advertises fake GPUs.

Run: .venv/bin/python -m pytest -q tests/search/test_expert_store.py   (slow: Ray, a search)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from search_fixtures import experiment, make_experts

from layerswap.search.expert_store import choose_store, pack, unpack
from layerswap.search.search import _trial_resources
from layerswap.spaces.search_space import ExpertPool, ExpertRef


def test_pack_round_trip_is_exact():
    g = torch.Generator().manual_seed(0)
    state = {
        "w": torch.randn(5, 7, generator=g).to(torch.bfloat16),
        "t": torch.randn(4, 6, generator=g).t(),  # not contiguous
        "i": torch.arange(11),
        "s": torch.tensor(3.5),  # 0-dim
        "e": torch.empty(0, 3, dtype=torch.float16),
    }
    index, buf = pack(state)
    out = unpack(index, buf)
    assert list(out) == list(state)
    for name, t in state.items():
        assert out[name].dtype == t.dtype and torch.equal(out[name], t), name
    assert all(o % 64 == 0 for _, _, _, o, _ in index)


def _nodes(*shapes: tuple[float, float]) -> list[dict]:
    """Fake `ray.nodes()`: one alive node per (CPUs, GPUs)."""
    return [{"Alive": True, "Resources": {"CPU": c} | ({"GPU": g} if g else {})} for c, g in shapes]


def test_resources_follow_gpus_per_trial(tmp_path):
    world = tmp_path / "w"
    paths = {k: tmp_path / k for k in ("base", "task", "language")}
    exp = experiment(
        world, paths, search={"max_concurrent": None, "gpus_per_trial": 0.5, "num_samples": 64}
    )
    assert _trial_resources(exp, _nodes((8, 1))) == (2, {"cpu": 1.0, "gpu": 0.5})
    assert _trial_resources(exp, _nodes((1, 4))) == (1, {"cpu": 1.0, "gpu": 0.5})
    cpu_only = experiment(world, paths, search={"max_concurrent": None, "num_samples": 64})
    assert _trial_resources(cpu_only, _nodes((3, 0))) == (3, {"cpu": 1.0})
    # 8 nodes x 8 GPUs for a 64-trial budget: 16 at once (a quarter), not 64 proposed blind
    big = experiment(
        world, paths, search={"max_concurrent": None, "gpus_per_trial": 1, "num_samples": 64}
    )
    assert _trial_resources(big, _nodes(*[(64, 8)] * 8)) == (16, {"cpu": 1.0, "gpu": 1})
    small = experiment(world, paths, search={"max_concurrent": None, "num_samples": 6})
    assert _trial_resources(small, _nodes((8, 0)))[0] == 2  # ceil(6 / 4)
    mine = experiment(world, paths, search={"max_concurrent": 40, "num_samples": 64})
    assert _trial_resources(mine, _nodes((64, 0)))[0] == 40  # the user's own setting wins
    with pytest.raises(ValueError, match=r"gpus_per_trial 1\.5"):
        experiment(world, paths, search={"gpus_per_trial": 1.5})


@pytest.fixture(scope="module")
def world_and_experts(tmp_path_factory):
    from layerswap.world import build_world

    world = build_world(tmp_path_factory.getbasetemp() / "tiny_world", size="tiny", progress=False)
    return world, make_experts(world, tmp_path_factory.mktemp("store") / "experts")


@pytest.fixture(scope="module")
def fake_gpu_ray():
    """A local Ray with 2 CPUs and 1 GPU it does not have (CUDA is absent on this machine): trials
    given that GPU run on the CPU through the explicit opt-in (trainables/devices.py)."""
    import ray

    tmp = tempfile.mkdtemp(prefix="lsg", dir="/tmp")
    os.environ["LAYERSWAP_ALLOW_CPU"] = "1"
    ray.init(num_cpus=2, num_gpus=1, _temp_dir=tmp, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    os.environ.pop("LAYERSWAP_ALLOW_CPU", None)
    shutil.rmtree(tmp, ignore_errors=True)


def _mapping(pid: int, addr: int) -> tuple[str, str]:
    """(file, inode) of the memory mapping holding `addr` in process `pid`, read from /proc."""
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            parts = line.split()
            return (parts[5] if len(parts) > 5 else "[anonymous]"), parts[4]
    raise AssertionError(f"{addr:#x} is not mapped in {pid}")


@pytest.mark.slow
def test_two_trial_processes_share_one_load(world_and_experts, fake_gpu_ray):
    import ray

    from layerswap.search.expert_store import (
        NAMESPACE,
        node_loader,
        start_stores,
        stop_stores,
        store_name,
    )
    from layerswap.trainables.merge.live import ExpertCache

    _, paths = world_and_experts

    @ray.remote(num_cpus=1)
    class Trial:  # stands in for a Tune trial process
        def load(self, refs):
            import os

            load = node_loader("t1")
            self.states = {r: load(r)[0] for r in refs}
            return os.getpid(), {r: next(iter(s.values())).data_ptr() for r, s in self.states.items()}  # fmt: skip

        def sums(self):
            return {r: [float(t.double().sum()) for t in s.values()] for r, s in self.states.items()}  # fmt: skip

    refs = [str(paths["base"]), str(paths["task"])]
    owner = start_stores("t1", str(paths["base"]))
    trials = [Trial.remote(), Trial.remote()]
    seen = ray.get([t.load.remote(refs) for t in trials])
    assert seen[0][0] != seen[1][0]  # two processes
    for ref in refs:
        maps = [_mapping(pid, ptrs[ref]) for pid, ptrs in seen]
        # Both processes read the tensor from the same shared-memory file of Ray's object store.
        assert maps[0] == maps[1] and "plasma" in maps[0][0], maps
    node = ray.get_runtime_context().get_node_id()
    store = ray.get_actor(store_name("t1", node), namespace=NAMESPACE)
    assert ray.get(store.loads.remote()) == refs  # each read from disk once on this node
    local = ExpertCache(str(paths["base"]))
    want = {r: [float(t.double().sum()) for t in local.get(r).values()] for r in refs}
    assert ray.get(trials[0].sums.remote()) == want
    assert stop_stores("t1") == 1
    del owner
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]  # fmt: skip


def test_auto_store_choice_names_sizes(world_and_experts, fake_gpu_ray):
    _, paths = world_and_experts
    pool = ExpertPool(
        base=str(paths["base"]),
        task=[ExpertRef(path=str(paths["task"]))],
        language=[ExpertRef(path=str(paths["language"]))],
    )
    choice, why = choose_store("auto", pool)
    assert choice == "node" and "GiB" in why
    assert choose_store("auto", pool, {"cpu": 1, "gpu": 1})[0] == "node"
    # No node can host a trial asking for 2 GPUs: no store counts, so none is big enough.
    choice, why = choose_store("auto", pool, {"cpu": 1, "gpu": 2})
    assert choice == "process" and "object store 0.00 GiB" in why
    assert choose_store("process", pool)[0] == "process"


@pytest.mark.slow
def test_search_places_trials_by_gpu_and_runs_on_cpu_without_cuda(world_and_experts, fake_gpu_ray, tmp_path):  # fmt: skip
    import ray

    from layerswap.search.expert_store import NAMESPACE
    from layerswap.search.search import run_search

    world, paths = world_and_experts
    exp = experiment(world, paths, search={"num_samples": 4, "gpus_per_trial": 0.5})
    res = run_search(exp, tmp_path / "run", progress=False)
    rows = pq.read_table(res.trials_path).to_pylist()
    ran = [r for r in rows if r["status"] in ("ok", "pruned")]
    assert len(rows) == 4 and ran
    for r in ran:
        assert r["gpu_ids"] == "0" and r["device"] == "cpu", r  # scheduled by GPU, CPU tensors
        assert r["expert_store"] == "node" and r["placement"].startswith("cpu")
        assert r["t_move_s"] == 0.0  # on the CPU nothing is copied
    # The per-node stores end with the search.
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]  # fmt: skip


def test_expert_bytes_counts_uris_like_local_folders(world_and_experts):
    """Experts given as URIs are sized from the store's listing: counted as 0 bytes, `auto`
    chose the node store however large they were (a red-team reproduced it)."""
    from layerswap.search.expert_store import expert_bytes

    _, paths = world_and_experts

    def pool(uri: bool) -> ExpertPool:
        at = {k: (Path(v).resolve().as_uri() if uri else str(v)) for k, v in paths.items()}
        return ExpertPool(
            base=at["base"],
            task=[ExpertRef(path=at["task"])],
            language=[ExpertRef(path=at["language"])],
        )

    local = expert_bytes(pool(uri=False))
    roles = ("base", "task", "language")
    want = sum(f.stat().st_size for k in roles for f in Path(paths[k]).glob("*.safetensors"))
    assert local == want > 0
    assert expert_bytes(pool(uri=True)) == local


def test_a_store_still_listed_after_the_wait_is_named_on_stderr(monkeypatch, capsys):
    """stop_stores waits a bounded time for its actors to go; past it, one line names those
    still listed (a later search's hang on one of them is then explained)."""
    import ray

    from layerswap.search import expert_store

    listed = [
        {"namespace": expert_store.NAMESPACE, "name": expert_store.stores_name("k") + "-node1"},
        {"namespace": expert_store.NAMESPACE, "name": expert_store.stores_name("other")},
        {"namespace": "elsewhere", "name": expert_store.stores_name("k")},
    ]
    monkeypatch.setattr(ray.util, "list_named_actors", lambda all_namespaces=False: listed)
    expert_store._wait_gone("k", timeout_s=0.2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expert_store.stores_name("k") + "-node1" in err[0], err
    assert expert_store.stores_name("other") not in err[0]
    listed.clear()  # all gone: nothing said
    expert_store._wait_gone("k", timeout_s=0.2)
    assert capsys.readouterr().err == ""
