"""Promotion: the search's top-k recipes and the baselines get lm-eval's full evaluation.

`promote(experiment, run_dir)` after `run_search`; writes RUN/promotion/results.parquet, raw
lm-eval JSON per model and task, RUN/leaderboard.md and the best model in RUN/best/.
Models are evaluated on `promote.device` ("auto": the GPU when there is one); each raw JSON's
config.device records the device used.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from layerswap.search.leaderboard import leaderboard
from layerswap.search.pool import include_paths, model_depth, model_ids_file, resolve_pool
from layerswap.search.promote_kept import KEY, fingerprints, kept_raws, raw_path, tasks_digest
from layerswap.search.results import TrialStore, write_parquet_atomic
from layerswap.spaces.errors import RunFailed
from layerswap.spaces.recipe import LayerSwapRecipe, SoupRecipe, TiesRecipe, parse_recipe
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool
from layerswap.spaces.task_families import heldout_task, task_split
from layerswap.spaces.zones import paper_default
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.evaluate.scoring import score_key
from layerswap.trainables.model_ids import content_recipe_id, saved_digests
from layerswap.trainables.outputs import claim_sibling
from layerswap.trainables.storage import local_copy

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


def baselines(exp: SearchExperiment, pool: ExpertPool, depth: int) -> list[tuple[str, object]]:
    """(model name, checkpoint path or recipe) for every configured baseline."""
    t0, l0 = pool.task[0].path, pool.language[0].path
    out: list[tuple[str, object]] = []
    want = exp.promote.baselines
    if "base" in want and pool.base is not None:
        out.append(("base", pool.base))
    if "experts" in want:
        for side, refs in (("math_expert", pool.task), ("language_expert", pool.language)):
            for i, r in enumerate(refs):
                out.append((side if i == 0 else f"{side}_{i + 1}", r.path))
    if "soup_uniform" in want:
        out.append(("soup_uniform", SoupRecipe(method="soup", models=[t0, l0])))
    if "soup_magnitude" in want and pool.base is not None:
        out.append(
            (
                "soup_magnitude",
                SoupRecipe(method="soup", models=[t0, l0], weights="magnitude", base=pool.base),
            )
        )
    if "ties" in want and pool.base is not None:
        out.append(
            (
                "ties",
                TiesRecipe(
                    method="ties", base=pool.base, models=[t0, l0], density=exp.promote.ties_density
                ),
            )
        )
    if "paper_default" in want:
        z = paper_default(depth)
        out.append(
            (
                "paper_default",
                LayerSwapRecipe(
                    method="layer_swap",
                    task_expert=t0,
                    language_expert=l0,
                    base=pool.base,
                    bottom=z.bottom,
                    top=z.top,
                ),
            )
        )
    return out


# lm-eval's raw-result sections keyed by task name (the rest describe the whole run).
_PER_TASK = ("results", "configs", "samples", "n-samples", "versions", "higher_is_better", "n-shot")


def _split_raw(raw: dict, task: str) -> dict:
    """lm-eval's raw result restricted to one task (what promotion/lm_eval/<model>/<task>.json holds)."""
    out = {k: v for k, v in raw.items() if k not in (*_PER_TASK, "group_subtasks")}
    for key in _PER_TASK:
        if isinstance(raw.get(key), dict) and task in raw[key]:
            out[key] = {task: raw[key][task]}
    return out


def _evaluated_model(name: str, rid: str | None, what: object) -> dict:
    """lm-eval's `config.model` / `model_args` for one promoted model. lm-eval reads the name off
    the live model's config (`_name_or_path`), which composition inherits from the first
    checkpoint it loaded: every model would be recorded as that expert."""
    if isinstance(what, str):  # a checkpoint evaluated as it is (the base, an expert)
        return {"model": what, "model_args": f"pretrained={what}"}
    return {"model": f"layerswap:{name}", "model_args": f"recipe_id={rid}" if rid else None}


def _select(exp: SearchExperiment, cands: list[tuple[str, dict]], scores: dict) -> str | None:
    if not cands:
        return None
    if exp.promote.select_by == "target":
        return max(
            cands, key=lambda c: (scores.get((c[0], exp.target_task), -1.0), -cands.index(c))
        )[0]
    return cands[0][0]  # the search's best by proxy objective (the test split does not choose)


@dataclass
class _Setup:
    """What promotion evaluates, and with what: read from the search's run folder."""

    pdir: Path  # RUN/promotion
    cands: list[tuple[str, dict]]  # (model name, trials.parquet row), the search's best first
    tasks: list[str]
    include_path: list[str]
    tokenizer: object
    live: object  # one trainables.merge.live.LiveModel, re-pointed at every model in turn
    models: list[tuple[str, str, str | None, object]]  # (name, kind, recipe id, path or recipe)
    device: str = "cpu"  # resolved promote.device: where every model is evaluated
    # (few-shot count, tasks): one lm-eval run per distinct count (see shot_groups)
    groups: list[tuple[int | None, list[str]]] = field(default_factory=list)


@dataclass
class _Evaluation:
    """The evaluation's outcome: result rows, score per (model, task), models that failed."""

    rows: list[dict] = field(default_factory=list)
    scores: dict[tuple[str, str], float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # model -> why its evaluation failed


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
        ev = _evaluate_models(exp, setup, progress, verbose)
        return _write_results(exp, run_dir, setup, ev)


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


def _set_up(exp: SearchExperiment, run_dir: Path, progress: bool = False) -> _Setup:
    """Read the search's pool and top-k rows; set up the tasks, tokenizer, live model and models."""
    # lazy: torch (~3 s); the study planner imports this module for promotion_tasks/baselines
    from layerswap.trainables.devices import check_cpu_size, explain_device
    from layerswap.trainables.merge.live import ExpertCache, LiveModel

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
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        str(local_copy(pool.task[0].path if pool.task[0].kind == "full" else pool.base))
    )
    live = LiveModel(ExpertCache(pool.base), pool, device)  # merged where it is evaluated
    check_cpu_size(sum(p.numel() for p in live.model.parameters()), device, "promotion")
    models = _models(exp, pool, depth, cands)
    return _Setup(pdir, cands, tasks, inc, tok, live, models, device, shot_groups(exp))


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


def _evaluate_models(
    exp: SearchExperiment, setup: _Setup, progress: bool, verbose: bool = False
) -> _Evaluation:
    """Run lm-eval on every model in turn; write its raw JSON per task and collect the rows."""
    ev = _Evaluation()
    live = setup.live
    batches: dict[int, object] = {}  # group index -> EvalBatch, estimated at the first model
    task_files = tasks_digest(exp, setup.include_path)
    for name, kind, rid, what in setup.models:
        t0 = time.perf_counter()
        try:
            prints = fingerprints(exp, what, setup.groups, setup.device, task_files)
            # An earlier promotion of this run (interrupted, or resumed with another budget)
            # that evaluated this model the same way: its results stand, nothing is loaded.
            raws = kept_raws(setup.pdir, name, prints)
            kept = raws is not None
            if raws is None:
                live.load_ref(what) if isinstance(what, str) else live.load(what)
                raws = {}  # task -> the lm-eval result that scored it
                for g, (shots, tasks) in enumerate(setup.groups):
                    raw = _evaluate_group(exp, setup, batches, g, shots, tasks, progress, verbose)
                    raws.update(dict.fromkeys(tasks, raw))
        except Exception as e:  # a broken baseline (e.g. a NaN expert) must not stop promotion
            ev.failed[name] = f"{type(e).__name__}: {e}"
            print(f"promotion: {name}: failed: {ev.failed[name]}", flush=True)
            continue
        _record_model(ev, setup, raws, name, kind, rid, what, prints)
        if progress:
            took = "kept from the earlier promotion" if kept else f"{time.perf_counter() - t0:.1f}s"
            print(
                f"promotion: {name:<24} target {exp.target_task} = {ev.scores[(name, exp.target_task)]:.4f} ({took})",
                flush=True,
            )
    return ev


def _evaluate_group(exp, setup: _Setup, batches: dict, g: int, shots, tasks: list[str], progress: bool, verbose: bool) -> dict:  # fmt: skip
    """lm-eval on the live model for one few-shot group, at a batch the device holds (estimated
    once per group, halved on out-of-memory and kept for the next models)."""
    # lazy: torch and lm-eval, as in _set_up
    from layerswap.trainables.evaluate.fit import EvalBatch, backing_off, eval_batch
    from layerswap.trainables.evaluate.harness import evaluate

    model = setup.live.model
    kw = dict(include_path=setup.include_path, limit=exp.promote.limit, num_fewshot=shots)
    if g not in batches:
        batches[g] = eval_batch(model, setup.tokenizer, tasks, max_gen_toks=exp.promote.max_gen_toks, want=exp.promote.batch_size, **kw)  # fmt: skip
        if progress:
            print(f"promotion: batch for {', '.join(tasks)}: {batches[g].why}", flush=True)
    plan = batches[g]

    def run(batch):
        # The live model is composed on setup.device (LiveModel), so evaluate's move to that
        # device finds nothing to move.
        return evaluate(model, tasks, tokenizer=setup.tokenizer, max_gen_toks=exp.promote.max_gen_toks, batch_size=batch, device=setup.device, verbose=verbose, max_length=plan.max_length, **kw)  # fmt: skip

    def said(failed, nxt):
        print(f"promotion: out of memory at batch {failed}; retrying at {nxt}", flush=True)

    if plan.batch_size == "auto":  # lm-eval backs off itself
        return run("auto")
    raw, used = backing_off(run, int(plan.batch_size), said)
    if used != plan.batch_size:
        batches[g] = EvalBatch(used, plan.max_length, f"{used} after out-of-memory back-off")
    return raw


def _record_model(
    ev: _Evaluation, setup: _Setup, raws: dict[str, dict], name: str, kind: str, rid: str | None,
    what: object, prints: dict[str, dict],
) -> None:  # fmt: skip
    """One model's lm-eval results (raws: task -> result): promotion/lm_eval/<name>/<task>.json,
    its scores and rows. `what` is the checkpoint ref or the recipe the model was built from;
    `prints` the per-task fingerprints a resumed promotion checks (search/promote_kept.py)."""
    for task in setup.tasks:
        raw = raws[task]
        path = raw_path(setup.pdir, name, task)
        path.parent.mkdir(parents=True, exist_ok=True)
        split = _split_raw(raw, task)
        split["config"] = {**split.get("config", {}), **_evaluated_model(name, rid, what), KEY: prints[task]}  # fmt: skip
        atomic_write_text(path, json.dumps(split, ensure_ascii=False, indent=1))
        metric, filt = score_key(raw, task)
        value = float(raw["results"][task][f"{metric},{filt}"])
        ev.scores[(name, task)] = value
        n = (raw.get("n-samples") or {}).get(task, {}).get("effective")
        ev.rows.append(
            {
                "model": name,
                "kind": kind,
                "recipe_id": rid,
                "task": task,
                "split": task_split(task),
                "metric": f"{metric},{filt}",
                "value": value,
                "n_items": n,
                "raw_json": str(path),
            }
        )


def _write_results(
    exp: SearchExperiment, run_dir: Path, setup: _Setup, ev: _Evaluation
) -> Promotion:
    """Write results.parquet, select and write the best model, then the leaderboard."""
    setup.pdir.mkdir(parents=True, exist_ok=True)
    results_path = setup.pdir / "results.parquet"
    write_parquet_atomic(results_path, ev.rows, RESULT_COLUMNS)
    best = _select(exp, [c for c in setup.cands if c[0] not in ev.failed], ev.scores)
    best_dir = None
    if best is not None and exp.promote.write_best:
        claim_sibling(run_dir / "search", "best")
        best_dir = write_best(dict(setup.cands)[best], run_dir / "best")
    board = run_dir / "leaderboard.md"
    claim_sibling(run_dir / "search", board.name)
    atomic_write_text(
        board, leaderboard(exp, setup.models, ev.scores, best, dict(setup.cands), ev.failed)
    )
    if len(ev.failed) == len(setup.models):
        why = "; ".join(f"{n}: {r}" for n, r in ev.failed.items())
        raise RunFailed(f"promotion: every model's evaluation failed ({board} lists why): {why}")  # fmt: skip
    return Promotion(results_path, board, best_dir, best, ev.rows)


def write_best(row: dict, out: Path) -> Path:
    """Merge the best recipe to disk (weights, recipe YAML, model card) with the merge engine."""
    import yaml

    from layerswap.trainables.merge.api import merge  # lazy: torch, as in _set_up

    recipe = parse_recipe(yaml.safe_load(row["recipe_yaml"]))
    return merge(recipe, out, overwrite=True, fold=True)  # LoRA experts: full weights too
