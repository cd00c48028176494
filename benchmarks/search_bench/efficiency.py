"""(c) of the merge-search benchmark: every recipe of a grid scored once (the table), then TPE and
random search replayed against that table: distinct evaluations to reach a top-5 % recipe.

Used by benchmarks/bench_search.py (and search_replay.py through it); not run on its own.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from . import RunsFailed

# Heavy imports (torch, optuna, Ray, lm-eval, the project) sit inside the functions: the
# script's --help and its argument checks stay instant.


def grid_table(exp, world: Path, depth: int, pool, grid: list[dict], tmp: Path, grid_from: Path | None) -> tuple[dict, dict]:  # fmt: skip
    """(c)'s table: every recipe of the grid scored once in-process (or read from `grid_from`).

    Returns:
        (recipe id -> proxy objective, {"grid_compose_share", "grid_seconds"}).
    """
    from layerswap.search.trial import TrialRunner
    from layerswap.spaces.recipe import recipe_id
    from layerswap.spaces.search_space import decode
    from layerswap.trainables.evaluate.tasks import write_world_tasks

    table, t0, tc, tt = {}, time.perf_counter(), 0.0, 1e-9
    if grid_from is not None:
        # saved as [params, objective] pairs: recipe ids name this run's expert paths
        saved = json.loads(grid_from.read_text())["grid_table"]
        table = {recipe_id(decode(p, exp.space, depth, pool)): v for p, v in saved}
        assert len(table) == len(grid), "the grid changed since that run"
        return table, {"grid_compose_share": None, "grid_seconds": 0.0}
    write_world_tasks(world, tmp / "tasks")
    runner = TrialRunner(exp, pool, [str(tmp / "tasks")])
    for i, params in enumerate(grid):
        if i % 20 == 0:
            print(f"grid: {i}/{len(grid)} ({time.perf_counter() - t0:.0f}s)", flush=True)
        rec = decode(params, exp.space, depth, pool)
        res = runner.run(rec)
        if res.status != "ok":  # (c) replays the whole table: one hole would skew every seed
            raise RunsFailed(f"(c): grid recipe {i} {res.status}: {res.error}")
        table[recipe_id(rec)] = res.objective
        tc, tt = tc + res.t_compose_s, tt + res.t_total_s
    timing = {"grid_compose_share": round(tc / tt, 4), "grid_seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    return table, timing


def replay(space, depth, pool, table: dict, sampler, budget: int, top: set, warm: dict | None):
    """Distinct evaluations until a top recipe is evaluated (None if not within budget)."""
    import optuna

    from layerswap.spaces.recipe import recipe_id
    from layerswap.spaces.search_space import decode, suggest

    study = optuna.create_study(direction="maximize", sampler=sampler)
    if warm is not None:
        study.enqueue_trial(warm)
    seen: list[str] = []
    for _ in range(budget * 20):  # repeats are served, not counted; bound the loop anyway
        t = study.ask()
        suggest(t, space, depth, pool)
        rid = recipe_id(decode(t.params, space, depth, pool))
        study.tell(t, table[rid])
        if rid not in seen:
            seen.append(rid)
            if rid in top:
                return len(seen)
        if len(seen) >= budget:
            return None
    return None


def search_efficiency(exp, depth: int, pool, table: dict, budget_share: float, seeds: int) -> dict:
    """(c): TPE (with and without the paper default enqueued) and random search replayed against
    the grid table, `seeds` seeds each: distinct evaluations to reach a top-5 % recipe.

    Args:
        exp: the search experiment (its space and sampler settings).
        depth, pool: the model's depth and the expert pool the recipes decode with.
        table: recipe id -> proxy objective, every recipe of the space.
        budget_share: the search budget as a share of the grid.
        seeds: seeds per sampler.
    Returns:
        the report's "c_search_efficiency" block.
    """
    import optuna

    from layerswap.search.searcher import make_sampler
    from layerswap.spaces.search_space import warm_start

    values = sorted(table.values(), reverse=True)
    cut = values[max(0, int(0.05 * len(values)) - 1)]
    top = {r for r, v in table.items() if v >= cut}
    budget = max(1, int(budget_share * len(table)))

    def exp_s(seed):  # the search's own sampler settings, with this budget and seed
        return exp.model_copy(
            update={"search": exp.search.model_copy(update={"seed": seed, "num_samples": budget})}
        )

    res_c = {
        "distinct_recipes": len(table),
        "top5_threshold": cut,
        "top5_count": len(top),
        "budget": budget,
    }
    for name, make, warm in (
        ("tpe", lambda s: make_sampler(exp_s(s)), warm_start(exp.space, depth, pool)),
        ("tpe_no_warm_start", lambda s: make_sampler(exp_s(s)), None),
        ("random", lambda s: optuna.samplers.RandomSampler(seed=s), None),
    ):
        hits = [replay(exp.space, depth, pool, table, make(s), budget, top, warm) for s in range(seeds)]  # fmt: skip
        found = [h for h in hits if h is not None]
        median = statistics.median([h if h is not None else budget + 1 for h in hits])
        res_c[name] = {
            "evals_to_top5": hits,
            "found": f"{len(found)}/{len(hits)}",
            "median_evals": median,
            "median_share_of_grid": round(median / len(table), 3),
        }
    return res_c
