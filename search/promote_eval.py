"""Promotion's evaluation: every model lm-eval scores (or an earlier promotion's results kept),
its raw result per task and its result rows.

`evaluate_models(exp, setup, progress)` runs after search/promote.py's set-up: it reads back what
an earlier promotion of the run evaluated the same way (search/promote_kept.py), builds the live
model and the tokenizer only if some model is left to evaluate, and writes
RUN/promotion/lm_eval/<model>/<task>.json for each model as soon as it is done.
Run its tests: .venv/bin/python -m pytest -q tests/search/test_promote.py
tests/search/test_promote_kept.py tests/search/test_promote_resume_cost.py
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from layerswap.search.promote_kept import KEY, fingerprints, kept_raws, raw_path, tasks_digest
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool
from layerswap.spaces.task_families import task_split
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.evaluate.scoring import score_key
from layerswap.trainables.storage import local_copy

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


@dataclass
class Setup:
    """What promotion evaluates, and with what: read from the search's run folder. The tokenizer
    and the live model are built the first time a model is evaluated: a resumed promotion that
    keeps every model (search/promote_kept.py) loads no weights."""

    pdir: Path  # RUN/promotion
    cands: list[tuple[str, dict]]  # (model name, trials.parquet row), the search's best first
    tasks: list[str]
    include_path: list[str]
    pool: ExpertPool
    models: list[tuple[str, str, str | None, object]]  # (name, kind, recipe id, path or recipe)
    device: str = "cpu"  # resolved promote.device: where every model is evaluated
    # (few-shot count, tasks): one lm-eval run per distinct count (see shot_groups)
    groups: list[tuple[int | None, list[str]]] = field(default_factory=list)

    @cached_property
    def tokenizer(self) -> object:
        """The tokenizer every model is evaluated with: the first full task expert's (else the
        base's, for LoRA experts)."""
        # lazy: transformers (~2 s), unneeded when every model is kept
        from transformers import AutoTokenizer

        pool = self.pool
        ref = pool.task[0].path if pool.task[0].kind == "full" else pool.base
        return AutoTokenizer.from_pretrained(str(local_copy(ref)))

    @cached_property
    def live(self) -> object:
        """One trainables.merge.live.LiveModel, re-pointed at every model in turn."""
        # lazy: torch (~3 s); the study planner imports promote.py
        from layerswap.trainables.devices import check_cpu_size
        from layerswap.trainables.merge.live import ExpertCache, LiveModel

        # Composed on the device it is evaluated on: evaluate's move finds nothing to move.
        live = LiveModel(ExpertCache(self.pool.base), self.pool, self.device)
        check_cpu_size(sum(p.numel() for p in live.model.parameters()), self.device, "promotion")
        return live


@dataclass
class Evaluation:
    """The evaluation's outcome: result rows, score per (model, task), models that failed."""

    rows: list[dict] = field(default_factory=list)
    scores: dict[tuple[str, str], float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # model -> why its evaluation failed
    # task -> (items scored, items in its split or None): the leaderboard's headers say when a
    # score rests on fewer items than the split has (promote.limit)
    items: dict[str, tuple[int, int | None]] = field(default_factory=dict)


def evaluate_models(
    exp: SearchExperiment, setup: Setup, progress: bool, verbose: bool = False
) -> Evaluation:
    """Run lm-eval on every model not kept from an earlier promotion; write its raw JSON per
    task and collect every model's rows."""
    ev = Evaluation()
    found = _kept_results(exp, setup, ev)
    if any(raws is None for _, raws in found.values()):
        # Built here, once, not inside a model's try: a model too large for the CPU stops the
        # promotion with its one message instead of failing (and loading) model after model.
        _ = setup.live
    batches: dict[int, object] = {}  # group index -> EvalBatch, estimated at the first model
    # recipe id -> (model, raws): a baseline that is a candidate's recipe (the paper default is
    # the search's first trial) is the same model, evaluated once: an 8B lm-eval run saved.
    by_recipe: dict[str, tuple[str, dict]] = {}
    for name, kind, rid, what in setup.models:
        if name not in found:  # its fingerprint failed: already in ev.failed
            continue
        t0 = time.perf_counter()
        prints, raws = found[name]
        took = "kept from the earlier promotion" if raws is not None else None
        if raws is None and rid in by_recipe:
            took = f"the same recipe as {by_recipe[rid][0]}: its results"
            raws = by_recipe[rid][1]
        if raws is None:
            try:
                raws = _evaluate_model(exp, setup, batches, what, progress, verbose)
            except Exception as e:  # a broken baseline (e.g. a NaN expert) must not stop promotion
                _failed(ev, name, e)
                continue
        if rid is not None:
            by_recipe.setdefault(rid, (name, raws))
        _record_model(ev, setup, raws, name, kind, rid, what, prints)
        if progress:
            took = took or f"{time.perf_counter() - t0:.1f}s"
            print(
                f"promotion: {name:<24} target {exp.target_task} = {ev.scores[(name, exp.target_task)]:.4f} ({took})",
                flush=True,
            )
    return ev


def _failed(ev: Evaluation, name: str, e: Exception) -> None:
    ev.failed[name] = f"{type(e).__name__}: {e}"
    print(f"promotion: {name}: failed: {ev.failed[name]}", flush=True)


def _kept_results(exp: SearchExperiment, setup: Setup, ev: Evaluation) -> dict[str, tuple]:
    """Model name -> (its per-task fingerprints, the raw results an earlier promotion of this run
    wrote for it the same way, or None: it is evaluated). Taken for every model before any is
    evaluated, so that nothing is loaded when every model is kept."""
    found: dict[str, tuple] = {}
    task_files = tasks_digest(exp, setup.include_path)
    for name, _, _, what in setup.models:
        try:
            prints = fingerprints(
                exp, what, setup.groups, setup.device, task_files, setup.pool.base
            )
        except Exception as e:  # e.g. a baseline's checkpoint that is gone: that model fails
            _failed(ev, name, e)
            continue
        found[name] = (prints, kept_raws(setup.pdir, name, prints))
    return found


def _evaluate_model(
    exp: SearchExperiment, setup: Setup, batches: dict, what: object, progress: bool, verbose: bool
) -> dict[str, dict]:
    """One model on the live model, every shot group; returns task -> the lm-eval result."""
    live = setup.live
    live.load_ref(what) if isinstance(what, str) else live.load(what)
    raws = {}
    for g, (shots, tasks) in enumerate(setup.groups):
        raw = _evaluate_group(exp, setup, batches, g, shots, tasks, progress, verbose)
        raws.update(dict.fromkeys(tasks, raw))
    return raws


def _evaluate_group(exp, setup: Setup, batches: dict, g: int, shots, tasks: list[str], progress: bool, verbose: bool) -> dict:  # fmt: skip
    """lm-eval on the live model for one few-shot group, at a batch the device holds (estimated
    once per group, halved on out-of-memory and kept for the next models)."""
    # lazy: torch and lm-eval, as in Setup.live
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
    ev: Evaluation, setup: Setup, raws: dict[str, dict], name: str, kind: str, rid: str | None,
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
        counts = (raw.get("n-samples") or {}).get(task, {})
        n = counts.get("effective")
        if n is not None and task not in ev.items:
            ev.items[task] = (n, counts.get("original"))
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
