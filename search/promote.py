"""Promotion: the search's top-k recipes and the baselines get lm-eval's full evaluation.

`promote(experiment, run_dir)` after `run_search`; writes RUN/promotion/results.parquet, raw
lm-eval JSON per model and task, RUN/leaderboard.md and the best model in RUN/best/.
Models are evaluated on `promote.device` ("auto": the GPU when there is one); each raw JSON's
config.device records the device used. The evaluation is search/promote_eval.py's (models an
earlier promotion of the run evaluated the same way are kept: search/promote_kept.py), the best
model's writing search/promote_best.py's (kept when RUN/best already holds it).
Run its tests: .venv/bin/python -m pytest -q tests/search/test_promote.py
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from layerswap.search.leaderboard import leaderboard
from layerswap.search.pool import include_paths, model_depth, model_ids_file, resolve_pool
from layerswap.search.promote_best import write_best
from layerswap.search.promote_eval import Evaluation, Setup, evaluate_models
from layerswap.search.results import TrialStore, write_parquet_atomic
from layerswap.spaces.baselines import MERGED_BASELINES, expert_name, one_pair, pair_name
from layerswap.spaces.errors import RunFailed
from layerswap.spaces.recipe import LayerSwapRecipe, Recipe, SoupRecipe, TiesRecipe, parse_recipe
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool
from layerswap.spaces.task_families import heldout_task
from layerswap.spaces.zones import paper_default
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.model_ids import content_recipe_id, saved_digests
from layerswap.trainables.outputs import claim_sibling

RESULT_COLUMNS = {
    "model": pa.string(),
    "kind": pa.string(),
    "recipe_id": pa.string(),
    "task": pa.string(),
    "split": pa.string(),
    "metric": pa.string(),
    "value": pa.float64(),
    "n_items": pa.int64(),
    "raw_json": pa.string(),
}


@dataclass
class Promotion:
    results_path: Path
    leaderboard: Path
    best_dir: Path | None
    best_model: str | None
    rows: list[dict] = field(default_factory=list)


def baseline_pairs(exp: SearchExperiment, pool: ExpertPool) -> list[tuple[str, str, str]]:
    """The (task, language) expert pairs the merged baselines are built from.

    Every pair of the pool (`promote.baseline_pairs: all`, the ICLR paper's "9 pairs"), or its
    first task and first language expert (`first`). Names carry the pair (soup_uniform_t2_l1)
    whenever the pool has more than one pair, so a row says which experts it merged.

    Returns:
        [(name suffix, task expert path, language expert path)]; the suffix is "" for a pool of
        one pair.
    """
    if one_pair(len(pool.task), len(pool.language)):
        return [("", pool.task[0].path, pool.language[0].path)]
    every = [(i, j) for i in range(len(pool.task)) for j in range(len(pool.language))]
    chosen = every if exp.promote.baseline_pairs == "all" else every[:1]
    return [(pair_name("", i, j), pool.task[i].path, pool.language[j].path) for i, j in chosen]


def pair_legend(pool: ExpertPool) -> dict[str, str]:
    """{"t1": task expert path, "l1": ...}: what the merged baselines' pair names and the expert
    rows refer to (t2 is math_expert_2: spaces.baselines.expert_name; {} for a pool of one pair,
    whose baselines carry no pair in their names)."""
    if one_pair(len(pool.task), len(pool.language)):
        return {}
    legend = {f"t{i + 1}": r.path for i, r in enumerate(pool.task)}
    return legend | {f"l{j + 1}": r.path for j, r in enumerate(pool.language)}


def baselines(exp: SearchExperiment, pool: ExpertPool, depth: int) -> list[tuple[str, object]]:
    """(model name, checkpoint path or recipe) for every configured baseline.

    Args:
        exp: the search experiment (its `promote.baselines`, `baseline_pairs`, `ties_density`).
        pool: the search's expert pool.
        depth: the experts' number of layers (the paper default's zones scale with it).
    Returns:
        The base, each expert, then each merged baseline once per expert pair (baseline_pairs).
    """
    out: list[tuple[str, object]] = []
    want = exp.promote.baselines
    if "base" in want and pool.base is not None:
        out.append(("base", pool.base))
    if "experts" in want:
        for side, refs in (("task", pool.task), ("language", pool.language)):
            out += [(expert_name(side, i), r.path) for i, r in enumerate(refs)]
    pairs = baseline_pairs(exp, pool)
    for name in MERGED_BASELINES:
        if name not in want or (MERGED[name].needs_base and pool.base is None):
            continue
        build = MERGED[name].build
        out += [(name + sfx, build(exp, pool, depth, t, lang)) for sfx, t, lang in pairs]
    return out


def _soup_uniform(exp: SearchExperiment, pool: ExpertPool, depth: int, t: str, lang: str):
    return SoupRecipe(method="soup", models=[t, lang])


def _soup_magnitude(exp: SearchExperiment, pool: ExpertPool, depth: int, t: str, lang: str):
    return SoupRecipe(method="soup", models=[t, lang], weights="magnitude", base=pool.base)


def _ties(exp: SearchExperiment, pool: ExpertPool, depth: int, t: str, lang: str):
    density = exp.promote.ties_density
    return TiesRecipe(method="ties", base=pool.base, models=[t, lang], density=density)


def _paper_default(exp: SearchExperiment, pool: ExpertPool, depth: int, t: str, lang: str):
    z = paper_default(depth)  # the paper's zones, scaled to the experts' depth
    return LayerSwapRecipe(
        method="layer_swap", task_expert=t, language_expert=lang, base=pool.base,
        bottom=z.bottom, top=z.top,
    )  # fmt: skip


class _Merged(NamedTuple):
    """How one merged baseline is built from task expert `t` and language expert `lang`."""

    needs_base: bool  # magnitude weights and TIES need the base the experts share
    build: Callable[[SearchExperiment, ExpertPool, int, str, str], Recipe]


# Keyed by spaces.baselines.MERGED_BASELINES (tests/search/test_promote_pairs.py: they agree).
MERGED: dict[str, _Merged] = {
    "soup_uniform": _Merged(False, _soup_uniform),
    "soup_magnitude": _Merged(True, _soup_magnitude),
    "ties": _Merged(True, _ties),
    "paper_default": _Merged(False, _paper_default),
}


def _select(exp: SearchExperiment, cands: list[tuple[str, dict]], scores: dict) -> str | None:
    if not cands:
        return None
    if exp.promote.select_by == "target":
        return max(
            cands, key=lambda c: (scores.get((c[0], exp.target_task), -1.0), -cands.index(c))
        )[0]
    return cands[0][0]  # the search's best by proxy objective (the test split does not choose)


def promote(
    experiment: SearchExperiment,
    run_dir: str | Path,
    *,
    progress: bool = True,
    verbose: bool = False,
) -> Promotion:
    """Evaluate the top-k recipes and the baselines with lm-eval; write results and the best model.

    Args:
        experiment: the experiment the search ran.
        run_dir: RUN (reads RUN/search/trials.parquet, pool.json and model_ids.json).
        progress: print one line per evaluated model.
        verbose: also lm-eval's progress bars and INFO log (harness.evaluate's `verbose`).
    Returns:
        Promotion with the written paths, the best model's name and the result rows.
    """
    exp = experiment
    run_dir = Path(run_dir).resolve()
    # The search's digests of the experts: the baselines' and the best model's recipe ids
    # hash no expert the search (in this process or an earlier one) already hashed.
    with saved_digests(model_ids_file(run_dir)):
        setup = _set_up(exp, run_dir, progress)
        ev = evaluate_models(exp, setup, progress, verbose)
        return _write_results(exp, run_dir, setup, ev, progress)


def _load_pool(exp: SearchExperiment, run_dir: Path) -> ExpertPool:
    """The search's own expert pool (RUN/search/pool.json), else the experiment's, resolved anew."""
    pool_file = run_dir / "search" / "pool.json"
    return (
        ExpertPool.model_validate_json(pool_file.read_text())
        if pool_file.exists()
        else resolve_pool(exp)
    )


def promotion_tasks(exp: SearchExperiment) -> list[str]:
    """The target task, then each proxy's held-out test task, then the proxies' dev tasks."""
    proxies = [p.task for p in exp.proxy_list]
    tasks = [exp.target_task, *(heldout_task(t) for t in proxies), *proxies]
    return list(dict.fromkeys(tasks))


def shot_groups(exp: SearchExperiment) -> list[tuple[int | None, list[str]]]:
    """Promotion tasks grouped by few-shot count, in task order: the target at
    promote.num_fewshot (None: the task's default), each proxy's dev and held-out test task at
    its Proxy.num_fewshot, as the search scored it. lm-eval takes one count per run."""
    shots: dict[str, int | None] = {exp.target_task: exp.promote.num_fewshot}
    for p in exp.proxy_list:
        for task in (p.task, heldout_task(p.task)):
            shots.setdefault(task, p.num_fewshot)
    groups: dict[int | None, list[str]] = {}
    for task in promotion_tasks(exp):
        groups.setdefault(shots[task], []).append(task)
    return list(groups.items())


def _set_up(exp: SearchExperiment, run_dir: Path, progress: bool = False) -> Setup:
    """Read the search's pool and top-k rows; set up the tasks and the models."""
    # lazy: torch (~3 s); the study planner imports this module for promotion_tasks/baselines
    from layerswap.trainables.devices import explain_device

    # Resolved once, before anything loads: an unusable device (cuda without a GPU) is one
    # error here, not every model failing in turn.
    device, why = explain_device(exp.promote.device)
    if progress:
        print(f"[promote] on {device} ({why})", flush=True)
    pdir = run_dir / "promotion"
    claim_sibling(run_dir / "search", "promotion")  # before writing: --overwrite may replace it
    pool = _load_pool(exp, run_dir)
    depth = model_depth(pool)
    store = TrialStore(run_dir / "search" / "trials.parquet")
    cands = [(f"candidate_{r['recipe_id']}", r) for r in store.best(exp.promote.top_k)]
    tasks = promotion_tasks(exp)
    inc = include_paths(exp, pdir)
    models = _models(exp, pool, depth, cands)
    return Setup(pdir, cands, tasks, inc, pool, models, device, shot_groups(exp))


def _models(
    exp: SearchExperiment, pool: ExpertPool, depth: int, cands: list[tuple[str, dict]]
) -> list[tuple[str, str, str | None, object]]:
    """(name, kind, recipe id, checkpoint path or recipe): the candidates, then the baselines."""
    import yaml

    models: list[tuple[str, str, str | None, object]] = [
        (
            name,
            "candidate",
            row["recipe_id"],
            parse_recipe(yaml.safe_load(row["recipe_yaml"])),
        )
        for name, row in cands
    ]
    models += [
        (n, "baseline", content_recipe_id(x) if not isinstance(x, str) else None, x)
        for n, x in baselines(exp, pool, depth)
    ]
    return models


def _write_results(
    exp: SearchExperiment, run_dir: Path, setup: Setup, ev: Evaluation, progress: bool = False
) -> Promotion:
    """Write results.parquet, select and write the best model, then the leaderboard."""
    setup.pdir.mkdir(parents=True, exist_ok=True)
    results_path = setup.pdir / "results.parquet"
    write_parquet_atomic(results_path, ev.rows, RESULT_COLUMNS)
    best = _select(exp, [c for c in setup.cands if c[0] not in ev.failed], ev.scores)
    best_dir = None
    if best is not None and exp.promote.write_best:
        claim_sibling(run_dir / "search", "best")
        best_dir = write_best(dict(setup.cands)[best], run_dir / "best", progress)
    board = run_dir / "leaderboard.md"
    claim_sibling(run_dir / "search", board.name)
    atomic_write_text(
        board,
        leaderboard(
            exp,
            setup.models,
            ev.scores,
            best,
            dict(setup.cands),
            ev.failed,
            pair_legend(setup.pool),
            lora=any(r.kind == "lora" for r in (*setup.pool.task, *setup.pool.language)),
            items=ev.items,
        ),
    )
    if len(ev.failed) == len(setup.models):
        why = "; ".join(f"{n}: {r}" for n, r in ev.failed.items())
        raise RunFailed(f"promotion: every model's evaluation failed ({board} lists why): {why}")  # fmt: skip
    return Promotion(results_path, board, best_dir, best, ev.rows)
