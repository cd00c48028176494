"""Whether a Ray Train run's workers, or a search's trials, fit the Ray cluster they run on,
said before `fit()`.

A run whose workers no node can hold (an `accelerator_type: H100` on H200s, 8 CPUs a GPU worker
on a smaller node) waits in Ray's queue forever and prints nothing. `train_with_ray` asks
`check_capacity` first (an expert sweep too, for its nested runs), and the merge search asks
`refuse_or_wait` with its own trial shape (search/search.py): on a Ray this command started
nothing will add nodes, so the run is refused in one line; on a joined cluster an autoscaler may
still add them, so it says what it waits for. The per-node rule is `node_room`, for both.
Tests: tests/trainables/train/test_ray_capacity.py
"""

from __future__ import annotations

import math
import sys

import ray

from layerswap.spaces.train_settings import Scaling
from layerswap.trainables.ray_session import started_here


def worker_demand(s: Scaling) -> dict[str, float]:
    """What one worker asks Ray for (as trainer_for's ScalingConfig, accelerator label included)."""
    need = {"CPU": s.cpus_per_worker}
    if s.use_gpu:
        need["GPU"] = 1.0
        if s.accelerator_type:
            need[f"accelerator_type:{s.accelerator_type}"] = 0.001  # Ray's own label share
    return need


def node_room(need: dict[str, float], nodes: list[dict]) -> list[int]:
    """How many bundles of `need` each alive node holds at once, by its total resources.

    A bundle is placed on one node: a cluster of two 1-CPU nodes holds no 2-CPU bundle although
    its totals say 2 CPUs, so capacity is never judged from `ray.cluster_resources()`.

    Args:
        need: Ray resources of one bundle (a worker, a trial), e.g. {"CPU": 2, "GPU": 0.5}.
        nodes: `ray.nodes()`.
    Returns:
        one count per alive node, in order (empty when none is alive).
    """
    # + 1e-9: 1 // 0.1 == 9 in floats, and ten 0.1-GPU trials do share one GPU
    return [
        min(math.floor(n.get("Resources", {}).get(k, 0) / v + 1e-9) for k, v in need.items())
        for n in nodes
        if n.get("Alive")
    ]


def alive_resources(nodes: list[dict]) -> list[dict]:
    """The total resources of each alive node of `ray.nodes()`."""
    return [n.get("Resources", {}) for n in nodes if n.get("Alive")]


def describe_nodes(nodes: list[dict]) -> str:
    """The alive nodes of `ray.nodes()` in words ("1 CPU; 1 CPU, 1 GPU H100"), or "none"."""
    return "; ".join(_describe(have) for have in alive_resources(nodes)) or "none"


def placement_problem(s: Scaling, nodes: list[dict]) -> str | None:
    """Why `s.num_workers` workers cannot all be placed on these nodes at once, or None.

    Args:
        s: the run's scaling settings.
        nodes: `ray.nodes()` (alive ones count, by their total resources).
    Returns:
        one line naming the demand and the nodes, or None when they fit.
    """
    need = worker_demand(s)
    room = sum(node_room(need, nodes))
    if room >= s.num_workers:
        return None
    want = ", ".join(f"{k}: {v:g}" for k, v in need.items())
    return (
        f"scaling: {s.num_workers} worker(s) of {{{want}}} do not fit this Ray cluster "
        f"(room for {room}; its nodes: {describe_nodes(nodes)})"
    )


def _describe(have: dict) -> str:
    kinds = [k.split(":", 1)[1] for k in have if k.startswith("accelerator_type:")]
    gpus = f", {have['GPU']:g} GPU {'/'.join(kinds)}".rstrip() if have.get("GPU") else ""
    return f"{have.get('CPU', 0):g} CPU{gpus}"


def refuse_or_wait(problem: str, waits_for: str, fix: str = "") -> None:
    """Refuse (ValueError) a run the connected Ray cannot place, or say on stderr what it waits for.

    Args:
        problem: the one line naming what does not fit.
        waits_for: what a joined cluster's autoscaler would have to add ("a node that fits").
        fix: what the user can change, appended to a refusal ("lower it").
    Raises:
        ValueError(problem) on a Ray this command started: nothing will add a node to it.
    """
    if started_here():
        raise ValueError(f"{problem}; {fix}" if fix else problem)
    print(f"{problem}: waiting for the autoscaler to add {waits_for} (Ctrl-C to stop)", file=sys.stderr, flush=True)  # fmt: skip


def check_capacity(s: Scaling) -> None:
    """Refuse (ValueError) or announce on stderr a run whose workers no node can hold now.

    Args:
        s: the run's scaling settings; needs a connected Ray.
    """
    if (problem := placement_problem(s, ray.nodes())) is not None:
        refuse_or_wait(problem, "a node that fits")
