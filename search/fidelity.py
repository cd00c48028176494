"""Multi-fidelity inside a merge-search trial: which items a trial scores, and when it stops early.

A policy (`POLICIES[search.fidelity.policy]`) fixes the *rungs*, cumulative shares of every
proxy's items taken in the evaluator's seeded order (so every trial of a search is compared on
the same items), and the rule by which a trial stops after a rung short of the last:

- "none": one rung, every item.
- "screen": rungs [screen, 1]; a trial stops when even a Hoeffding upper bound of its full
  objective is below the keep_top-th best full objective so far.
- "halving": asynchronous successive halving (ASHA, Li et al. 2020) over item subsets, rungs
  [*rungs, 1] (default 1/8, 1/4, 1/2, all): a trial goes on from a rung only when its objective
  there is among the best 1/eta of every earlier trial's objective at that rung (decided once
  `eta` trials reached it).

The driver (search/searcher.py) computes each rung's *gate* from the trial table when it hands a
trial out (`gates`); the trial (search/trial.py) compares its rung value to the gate (`stops`);
benchmarks/search_replay.py replays the same two functions over a scored grid. A stopped trial is
told to Optuna as PRUNED with its rung values as intermediate values; a completed trial's
objective is always on every item.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from layerswap.spaces.search_experiment import Fidelity


@dataclass(frozen=True)
class Policy:
    """One fidelity policy.

    shares: the rungs' cumulative item shares (the last is 1.0).
    gates: the driver's rule: per non-final rung, the value a trial must reach there to go on
        (None: no decision yet), from the finished rows of the table.
    by_bound: the trial compares its Hoeffding upper bound (True) or its rung objective (False).
    floor: (trials that score every item before any gate exists, the least share of the items a
        later trial may score): what `layerswap plan` bounds a search's cost from below by.
    """

    shares: Callable[[Fidelity], list[float]]
    gates: Callable[[Fidelity, list[dict]], list[float | None]]
    by_bound: bool
    floor: Callable[[Fidelity], tuple[int | None, float]]


def _screen_gates(fid: Fidelity, rows: list[dict]) -> list[float | None]:
    full = sorted((r["objective"] for r in _scored(rows) if r["status"] == "ok"), reverse=True)
    return [full[fid.keep_top - 1] if len(full) >= fid.keep_top else None]


def _halving_gates(fid: Fidelity, rows: list[dict]) -> list[float | None]:
    seen: list[list[float]] = [[] for _ in fid.rungs]
    for r in _scored(rows):
        for i, (_, value) in enumerate(rung_values(r)[: len(fid.rungs)]):
            seen[i].append(value)
    gates: list[float | None] = []
    for values in seen:
        if len(values) < fid.eta:
            gates.append(None)  # too few trials reached the rung to rank anyone by it
        else:
            k = math.ceil(len(values) / fid.eta)  # the best 1/eta go on
            gates.append(sorted(values, reverse=True)[k - 1])
    return gates


POLICIES: dict[str, Policy] = {
    "none": Policy(
        shares=lambda fid: [1.0],
        gates=lambda fid, rows: [],
        by_bound=False,
        floor=lambda fid: (None, 1.0),  # every trial scores everything
    ),
    "screen": Policy(
        shares=lambda fid: [fid.screen, 1.0],
        gates=_screen_gates,
        by_bound=True,
        floor=lambda fid: (fid.keep_top, fid.screen),
    ),
    "halving": Policy(
        shares=lambda fid: [*fid.rungs, 1.0],
        gates=_halving_gates,
        by_bound=False,
        floor=lambda fid: (fid.eta, fid.rungs[0]),
    ),
}


def policy_of(fid: Fidelity, multi_objective: bool = False) -> Policy:
    """The policy a search runs (a multi-objective search scores every item: no scalar to rank)."""
    return POLICIES["none" if multi_objective else fid.policy]


def gates(fid: Fidelity, rows: list[dict], multi_objective: bool = False) -> list[float | None]:
    """Per non-final rung, the value a new trial must reach there to go on (None: no gate yet).

    Args:
        fid: the search's fidelity settings.
        rows: the trial table's rows so far (search.results.TrialStore.rows).
        multi_objective: the search is multi-objective (no early stop).
    """
    return policy_of(fid, multi_objective).gates(fid, rows)


def stops(policy: Policy, rung: int, value: float, bound: float, gate_values) -> bool:
    """Whether a trial stops after `rung` (not the last) given its value and bound there.

    Args:
        policy: the search's policy.
        rung: the rung just scored (0-based).
        value: the trial's objective on that rung's items.
        bound: the Hoeffding upper bound of its full objective from those items.
        gate_values: the gates the driver handed the trial (`gates`).
    """
    gate = gate_values[rung] if gate_values and rung < len(gate_values) else None
    if gate is None:
        return False
    return (bound if policy.by_bound else value) < gate


def rung_spans(shares: list[float], n_items: dict[str, int]) -> list[dict[str, tuple[int, int]]]:
    """The items each rung adds, as [start, end) positions in every proxy's seeded item order.

    A share takes the first max(1, ceil(share * n)) items (at least one per proxy, so the first
    rung ranks by every proxy). A rung that adds no item to any proxy (tiny proxies) is merged
    into the next; a proxy that gains nothing at a rung is left out of it.

    Args:
        shares: the rungs' cumulative shares, the last 1.0.
        n_items: items per proxy.
    Returns:
        per rung kept, {proxy: (start, end)} of the proxies it adds items to.
    """
    done = dict.fromkeys(n_items, 0)
    spans = []
    for share in shares:
        ends = {t: max(1, math.ceil(share * n - 1e-9)) for t, n in n_items.items()}
        span = {t: (done[t], end) for t, end in ends.items() if end > done[t]}
        if span:
            spans.append(span)
            done |= {t: end for t, (_, end) in span.items()}
    return spans


def rung_values(row: dict) -> list[tuple[int, float]]:
    """A row's (items scored, objective) per rung reached, from its `rungs` column."""
    raw = row.get("rungs")
    if not raw:
        return []
    return [(int(n), float(v)) for n, v in (json.loads(raw) if isinstance(raw, str) else raw)]


def _scored(rows: Iterable[dict]) -> list[dict]:
    """Rows that scored items themselves (not served repeats, not failures), with a value."""
    return [
        r
        for r in rows
        if r.get("status") in ("ok", "pruned")
        and (r.get("objective") is not None or r.get("rungs"))
    ]


def hoeffding_upper(mean: float, n: int, total: int, delta: float) -> float:
    """Upper confidence bound on a [0,1] population mean from n of `total` items (Serfling)."""
    if n >= total:
        return mean
    eps = math.sqrt(math.log(1 / delta) * (1 - (n - 1) / total) / (2 * n))
    return min(1.0, mean + eps)
