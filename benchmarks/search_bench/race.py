"""(a) and (b) of the merge-search benchmark: the search through Ray on a few recipes of the grid
against a merge-to-disk + lm-eval loop on the same recipes (their scores must agree), and the
share of trial time spent composing.

Used by benchmarks/bench_search.py; not run on its own.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from . import RunsFailed

# Heavy imports (torch, optuna, Ray, lm-eval, the project) sit inside the functions: the
# script's --help and its argument checks stay instant.


def race(exp, grid: list[dict], n_recipes: int, tmp: Path) -> dict:
    """(a) + (b): the search through Ray on `n_recipes` of the grid, then a merge-to-disk +
    lm-eval loop on the same recipes; their per-recipe scores must agree.

    Returns:
        {"a_throughput": ..., "b_compose_share": {"search_trials": ...}}.
    """
    import ray
    import yaml

    from layerswap.search.search import run_search
    from layerswap.spaces.recipe import parse_recipe
    from layerswap.trainables.atomic import read_parquet
    from layerswap.trainables.evaluate.harness import evaluate
    from layerswap.trainables.evaluate.scoring import task_score
    from layerswap.trainables.merge.engine import merge_to_disk

    chosen = grid[:: max(1, len(grid) // n_recipes)][:n_recipes]
    exp_a = exp.model_copy(
        update={"search": exp.search.model_copy(update={"points_to_evaluate": chosen[1:]})}
    )
    ray_tmp = tempfile.mkdtemp(prefix="lsb", dir="/tmp")
    ray.init(num_cpus=2, _temp_dir=ray_tmp, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    run_search(exp_a, tmp / "run", progress=False)
    t_search = time.perf_counter() - t0
    ray.shutdown()
    rows = read_parquet(tmp / "run" / "search" / "trials.parquet").to_pylist()
    evaluated = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] not in ("ok", "duplicate")]
    if failed or not evaluated:  # a ratio over the trials that ran would hide the ones that did not
        raise RunsFailed(
            f"(a): {len(failed)} of {len(rows)} search trials failed, {len(evaluated)} evaluated:\n"
            + "\n".join(f"  trial {r['trial_id']} ({r['status']}): {r['error']}" for r in failed)
            + f"\n(Ray's logs: {ray_tmp})"
        )
    shutil.rmtree(ray_tmp, ignore_errors=True)
    proxies = [p.task for p in exp.proxy_list]
    t0 = time.perf_counter()
    mismatches = []
    for r in evaluated:
        out = tmp / "disk" / r["recipe_id"]
        merge_to_disk(parse_recipe(yaml.safe_load(r["recipe_yaml"])), out, overwrite=True)
        tasks = str(tmp / "run" / "search" / "tasks")
        raw = evaluate(str(out), proxies, include_path=tasks, max_gen_toks=exp.proxy_eval.max_gen_toks)  # fmt: skip
        for t in proxies:
            # 1e-6: lm-eval batches the requests otherwise, so float32 log-likelihoods (and a
            # Brier score from them) may differ in their last bits (~1e-8 seen); an accuracy
            # differs by at least 1/items when an answer does.
            if abs(task_score(raw, t) - r[f"proxy__{t}"]) > 1e-6:
                mismatches.append((r["recipe_id"], t, task_score(raw, t), r[f"proxy__{t}"]))
    t_loop = time.perf_counter() - t0
    if mismatches:  # the two paths must score a recipe alike, or their speeds are not comparable
        raise RunsFailed("(a): the search and the merge-to-disk loop score recipes differently "
                         "(recipe, proxy, loop, search):\n" + "\n".join(f"  {m}" for m in mismatches))  # fmt: skip
    n = len(evaluated)
    t_trials = max(1e-9, sum(r["t_total_s"] for r in evaluated))
    return {
        "a_throughput": {
            "recipes": n,
            "search_seconds_incl_ray_setup": round(t_search, 1),
            "search_trial_seconds": round(t_trials, 2),
            "loop_seconds": round(t_loop, 1),
            "search_trials_per_hour": round(3600 * n / t_search, 1),
            "loop_trials_per_hour": round(3600 * n / t_loop, 1),
            "speedup_wall": round(t_loop / t_search, 2),
            "speedup_per_trial": round(t_loop / t_trials, 2),
        },
        "b_compose_share": {
            "search_trials": round(sum(r["t_compose_s"] for r in evaluated) / t_trials, 4)
        },
    }
