"""One copy of the experts per Ray node, shared by every trial process on it (Ray's object store).

The driver starts the search's owner actor (`start_stores`); a trial asks `node_loader(key)` for
a loader (trainables.merge.live.Loader), and the first ask on a node has the owner start a small
actor pinned to that node; it reads each checkpoint once (LoRA adapters
folded into the base), packs it into one byte buffer and puts it into the node's shared-memory
object store. Every trial process on the node then maps that same buffer (zero copy: numpy
arrays come out of Ray's store as views) and reads its tensors from it. The driver picks the
policy (`choose_store`) and ends the actors (`stop_stores`); a driver that is killed takes them
with it. Used by search/tune_trial.py.
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from layerswap.spaces.search_space import ExpertPool
from layerswap.trainables.merge.live import ExpertCache, Loader
from layerswap.trainables.storage import file_sizes

PREFIX = "layerswap-experts"
NAMESPACE = "layerswap"  # named actors live here, whatever namespace the driver's job has
ALIGN = 64  # every tensor starts on a 64-byte boundary, so any dtype can view its bytes
Index = list[tuple[str, str, tuple[int, ...], int, int]]  # (name, dtype, shape, offset, nbytes)


def pack(state: dict[str, torch.Tensor]) -> tuple[Index, np.ndarray]:
    """A state dict as one uint8 buffer [total bytes] and the index to view it back."""
    index, off = [], 0
    for name, t in state.items():
        n = t.numel() * t.element_size()
        index.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), off, n))
        off += -(-n // ALIGN) * ALIGN
    buf = np.empty(max(off, 1), dtype=np.uint8)
    flat = torch.from_numpy(buf)
    for (_, _, _, o, n), t in zip(index, state.values(), strict=True):
        flat[o : o + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    return index, buf


def unpack(index: Index, buf: np.ndarray) -> dict[str, torch.Tensor]:
    """Tensors viewing `buf` (no copy). A buffer from Ray's store is read-only shared memory:
    the live model only reads its parameters, and anything merged is a new tensor."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        flat = torch.from_numpy(buf)
    return {
        name: flat[o : o + n].view(getattr(torch, dtype)).reshape(shape)
        for name, dtype, shape, o, n in index
    }


@ray.remote(num_cpus=0, max_concurrency=1)
class _NodeStore:
    """The experts of one search on one node; calls run one at a time, so each loads once."""

    def __init__(self, base: str | None):
        self.cache = ExpertCache(base)
        self.objects: dict[str, ray.ObjectRef] = {}
        self.loaded: list[str] = []  # refs read from disk, in order (tests check one each)

    def get(self, ref: str) -> list[ray.ObjectRef]:
        if ref not in self.objects:
            state = self.cache.get(ref)
            index, buf = pack(state)
            obj = ray.put((index, buf, sorted(self.cache.nonfinite[ref])))
            self.objects[ref] = obj
            self.loaded.append(ref)
            # Keep only the shared copy: a LoRA expert folds into these base views later.
            self.cache.states[ref] = unpack(*ray.get(obj)[:2])
        return [self.objects[ref]]  # in a list: Ray hands the ref over without resolving it

    def loads(self) -> list[str]:
        return list(self.loaded)


@ray.remote(num_cpus=0, max_concurrency=1)
class _Stores:
    """Starts and owns the node stores of one search. The driver starts it as an ordinary
    (non-detached) actor, so it and every store it started end with the driver's job however
    the driver ends (Ray's fate sharing: an actor dies with its owner). Detached stores started
    by trials outlived a killed driver, held their experts' memory until `ray down`, and served
    a later run the old weights (a red-team reproduced it)."""

    def __init__(self, key: str, base: str | None):
        self.key, self.base = key, base
        self.stores: dict[str, tuple[ray.actor.ActorHandle, int]] = {}  # node -> (store, renewals)

    def store(self, node_id: str, dead: int | None = None) -> list:
        """[this node's store, its generation]; `dead`: the generation a trial found dead."""
        gen = self.stores[node_id][1] if node_id in self.stores else -1
        if gen < 0 or dead == gen:  # the first ask here, or the store died (e.g. OOM-killed)
            gen += 1
            name = store_name(self.key, node_id, gen)
            actor = _NodeStore.options(
                name=name,
                namespace=NAMESPACE,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(self.base)
            self.stores[node_id] = (actor, gen)
        return list(self.stores[node_id])  # a list: Ray hands the handle over as it is

    def stop(self) -> int:
        for actor, _ in self.stores.values():
            ray.kill(actor)
        return len(self.stores)


def store_name(key: str, node_id: str, generation: int = 0) -> str:
    """A node store's actor name (ends in the node id, which tests and `ray list actors` show)."""
    again = f"-r{generation}" if generation else ""
    return f"{PREFIX}-{key}{again}-{node_id[:16]}"


def stores_name(key: str) -> str:
    return f"{PREFIX}-{key}"


def start_stores(key: str, base: str | None):
    """Start the owner of search `key`'s node stores on the driver's node. Call it from the
    driver and keep the handle until `stop_stores(key)`; trials find it by name.

    Args:
        key: names this search's stores; unique per run (search.py adds a nonce), so no later
            run can meet a store of an earlier one.
        base: the base model folder a LoRA expert folds into (None: no LoRA experts).
    Returns:
        the owner actor's handle.
    """
    node = ray.get_runtime_context().get_node_id()
    return _Stores.options(
        name=stores_name(key),
        namespace=NAMESPACE,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote(key, base)


def node_loader(key: str) -> Loader:
    """A loader reading the experts from this node's store (see module docstring); the store
    is started by search `key`'s owner actor (`start_stores`) on first use."""
    owner = ray.get_actor(stores_name(key), namespace=NAMESPACE)
    node = ray.get_runtime_context().get_node_id()
    actor, gen = ray.get(owner.store.remote(node))
    held: list = []  # the object refs this process maps

    def load(ref: str):
        nonlocal actor, gen
        try:
            [obj] = ray.get(actor.get.remote(ref))
        except ray.exceptions.RayActorError:  # the store died: the owner starts another once
            actor, gen = ray.get(owner.store.remote(node, dead=gen))
            [obj] = ray.get(actor.get.remote(ref))
        index, buf, bad = ray.get(obj)
        held.append(obj)
        return unpack(index, buf), set(bad)

    return load


def stop_stores(key: str) -> int:
    """End search `key`'s node stores and their owner (their shared copies go with them).

    Returns:
        how many node stores there were.
    """
    try:
        owner = ray.get_actor(stores_name(key), namespace=NAMESPACE)
    except ValueError:  # never started, or already gone with its driver
        return 0
    try:  # bounded: this runs while a signal ends the command, when Ray may not answer
        n = ray.get(owner.stop.remote(), timeout=5)
    except Exception:  # the stores end with their owner anyway
        n = 0
    ray.kill(owner)
    _wait_gone(key, timeout_s=10.0)
    return n


def _wait_gone(key: str, timeout_s: float) -> None:
    """Wait (bounded) until no actor of search `key`'s stores is still named: `ray.kill` returns
    before the actor is gone, and a next search of the same key that started meanwhile found the
    dying store by its name (a test saw it listed after stop_stores, and the next search hang).
    Past the bound, one stderr line names the actors still listed: a later hang on one of them
    is then explained, not silent."""
    prefix = f"{stores_name(key)}-"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            named = ray.util.list_named_actors(all_namespaces=True)
        except Exception:  # Ray going down with the command: nothing left to wait for
            return
        left = sorted(
            a.get("name", "")
            for a in named
            if a.get("namespace") == NAMESPACE
            and (a.get("name") == stores_name(key) or a.get("name", "").startswith(prefix))
        )
        if not left:
            return
        if time.monotonic() >= deadline:
            print(
                f"layerswap: expert store actors still listed {timeout_s:g} s after stop "
                f"(namespace {NAMESPACE}): {', '.join(left)}; a next search in this Ray "
                "session may wait on them",
                file=sys.stderr,
            )
            return
        time.sleep(0.1)


def expert_bytes(pool: ExpertPool) -> int:
    """Bytes the experts take in memory, from file sizes (a LoRA expert folds to the base's)."""
    # lazy: torch (~3 s); the preflight sizes the experts without it
    from layerswap.trainables.merge.lora import is_lora_adapter

    def size(path: str | None) -> int:  # a checkpoint's top-level weights, local or a URI
        if not path:
            return 0
        files = file_sizes(path).items()
        return sum(n for rel, n in files if "/" not in rel and rel.endswith(".safetensors"))

    refs = [pool.base, *(r.path for r in (*pool.task, *pool.language))]
    base = size(pool.base)
    return sum(base if r and is_lora_adapter(r) else size(r) for r in dict.fromkeys(refs))


def choose_store(
    setting: str, pool: ExpertPool, trial: dict[str, float] | None = None
) -> tuple[str, str]:
    """The expert store the trials use, and why ("node" or "process").

    "auto" takes "node" when the experts fit the smallest object store of the nodes a trial can
    run on (with 10 % to spare), else "process". Needs a connected Ray.

    Args:
        setting: search.expert_store ("auto", "node" or "process").
        pool: the experts.
        trial: one trial's resources ({"cpu": .., "gpu": ..}); a node with fewer (a CPU-less
            head, a CPU node in a GPU search) hosts no trial and its store does not count.
    """
    need = expert_bytes(pool)
    gb = 1 << 30
    want = {"CPU": (trial or {}).get("cpu", 0), "GPU": (trial or {}).get("gpu", 0)}
    stores = [
        n["Resources"].get("object_store_memory", 0)
        for n in ray.nodes()
        if n.get("Alive") and all(n["Resources"].get(k, 0) >= v for k, v in want.items())
    ]
    smallest = min(stores) if stores else 0
    what = f"experts {need / gb:.2f} GiB, smallest node object store {smallest / gb:.2f} GiB"
    if setting == "node" and need * 1.1 > smallest:
        return setting, (
            f"{what}; search.expert_store is 'node' although they do not fit: Ray will spill "
            "to disk or fail (raise the object store size, e.g. `ray start "
            "--object-store-memory`, or use 'process')"
        )
    if setting != "auto":
        return setting, f"{what}; search.expert_store is {setting!r}"
    if need * 1.1 <= smallest:
        return "node", f"{what}: one shared copy per node"
    return "process", f"{what}: too small, so each trial process loads its own copy"
