"""Whether one merge-search trial fits a node of the Ray cluster, said before any trial starts.

A trial is placed on one node: with `search.cpus_per_trial: 2` on two 1-CPU nodes (2 CPUs in
total, which is all Tune's own warning compares) no trial is ever placed and the search waits
forever, silently. `run_search` calls `check_trials_fit` once Ray is up and before it writes
anything; the per-node rule is trainables/train/ray_capacity.node_room, which training uses too.
Tests: tests/search/test_trial_fit.py
"""

from __future__ import annotations

import ray

from layerswap.spaces.search_experiment import SearchSettings
from layerswap.trainables.train.ray_capacity import (
    alive_resources,
    describe_nodes,
    node_room,
    refuse_or_wait,
)

# The search setting each Ray resource of a trial comes from: what a refusal names.
TRIAL_FIELDS = {"CPU": "search.cpus_per_trial", "GPU": "search.gpus_per_trial"}


def trial_demand(s: SearchSettings) -> dict[str, float]:
    """What one trial asks Ray for, by Ray's resource names (the keys of TRIAL_FIELDS)."""
    return {"CPU": s.cpus_per_trial} | ({"GPU": s.gpus_per_trial} if s.gpus_per_trial > 0 else {})


def trial_fit_problem(s: SearchSettings, nodes: list[dict]) -> tuple[str, str] | None:
    """Why no node of the cluster can hold one trial, or None when some node can.

    Args:
        s: the search settings.
        nodes: `ray.nodes()` (alive ones count, by their total resources).
    Returns:
        (one line naming the setting(s), the value(s) and the largest node's room, what to
        change), or None.
    """
    need = trial_demand(s)
    if any(node_room(need, nodes)):
        return None
    have = alive_resources(nodes)
    most = {k: max((h.get(k, 0) for h in have), default=0) for k in need}
    # The settings no node has enough for; each fits some node but none both: name them all.
    short = [k for k in need if need[k] > most[k] + 1e-9] or list(need)
    asked = " and ".join(f"{TRIAL_FIELDS[k]} {need[k]:g}" for k in short)
    largest = ", ".join(f"{most[k]:g} {k}" for k in short)
    fix = "lower it" if len(short) == 1 else "lower them"
    if short == ["GPU"] and not most["GPU"]:
        fix = "set it to 0 to search on CPUs"
    why = (
        f"{asked}: no node of this Ray cluster holds one trial "
        f"(the largest has {largest}; its nodes: {describe_nodes(nodes)})"
    )
    return why, fix


def check_trials_fit(s: SearchSettings) -> None:
    """Before any trial starts: refuse (ValueError) a search no node of the connected Ray can
    place one trial of (it would wait in Tune's queue forever, silently; Tune's own warning
    compares the cluster's totals), or on a joined cluster say that it waits for the autoscaler.

    Args:
        s: the search settings; needs a connected Ray.
    """
    if (problem := trial_fit_problem(s, ray.nodes())) is not None:
        why, fix = problem
        refuse_or_wait(why, "a node that holds one trial", fix)
