"""Whether a Ray Train run's workers fit the Ray cluster it runs on, said before `fit()`.

A run whose workers no node can hold (an `accelerator_type: H100` on H200s, 8 CPUs a GPU worker
on a smaller node) waits in Ray's queue forever and prints nothing. `train_with_ray` asks
`check_capacity` first (an expert sweep too, for its nested runs): on a Ray this command started
nothing will add nodes, so the run is refused in one line; on a joined cluster an autoscaler may
still add them, so it says what it waits for. Tests: tests/trainables/train/test_ray_capacity.py
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


def placement_problem(s: Scaling, nodes: list[dict]) -> str | None:
    """Why `s.num_workers` workers cannot all be placed on these nodes at once, or None.

    Args:
        s: the run's scaling settings.
        nodes: `ray.nodes()` (alive ones count, by their total resources).
    Returns:
        one line naming the demand and the nodes, or None when they fit.
    """
    need = worker_demand(s)
    room = 0
    for n in nodes:
        if not n.get("Alive"):
            continue
        have = n.get("Resources", {})
        room += min(math.floor(have.get(k, 0) / v + 1e-9) for k, v in need.items())
    if room >= s.num_workers:
        return None
    want = ", ".join(f"{k}: {v:g}" for k, v in need.items())
    seen = "; ".join(_describe(n.get("Resources", {})) for n in nodes if n.get("Alive")) or "none"
    return (
        f"scaling: {s.num_workers} worker(s) of {{{want}}} do not fit this Ray cluster "
        f"(room for {room}; its nodes: {seen})"
    )


def _describe(have: dict) -> str:
    kinds = [k.split(":", 1)[1] for k in have if k.startswith("accelerator_type:")]
    gpus = f", {have['GPU']:g} GPU {'/'.join(kinds)}".rstrip() if have.get("GPU") else ""
    return f"{have.get('CPU', 0):g} CPU{gpus}"


def check_capacity(s: Scaling) -> None:
    """Refuse (ValueError) or announce on stderr a run whose workers no node can hold now.

    Args:
        s: the run's scaling settings; needs a connected Ray.
    """
    if (problem := placement_problem(s, ray.nodes())) is None:
        return
    if started_here():  # nothing will add a node to a Ray this command started
        raise ValueError(problem)
    print(f"{problem}: waiting for the autoscaler to add a node that fits (Ctrl-C to stop)", file=sys.stderr, flush=True)  # fmt: skip
