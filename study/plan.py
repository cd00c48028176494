"""Plan a whole study offline: resolve its names, count its runs, trials and evaluations, and
estimate device-hours per stage from the model shapes and a throughput profile.

`plan_study(load_study("spaces/examples/real_study.yaml"))` returns a StudyPlan (plain data) with
four stages: (1) expert training (each config, × its sweep's trials), (2) indicator scoring of
the sweeps' checkpoints, (3) merge-search trials, (4) promotion (top-k recipes + baselines on
the target and proxy test tasks). `format_study_plan(plan)` (study/report.py) is what
`layerswap plan` prints.
Names are resolved without network: model configs (spaces' path rule, the HF cache, built-in
copies), lm-eval task names (search/preflight_tasks.py's finder), dataset sources
(trainables.train.sources). What cannot be known offline is listed, never guessed silently.
The cost model: study/estimate.py (FLOPs, evaluation), study/training.py (training runs:
padding, communication, checkpoints). Tests: .venv/bin/pytest -q tests/study/
"""

from __future__ import annotations

from layerswap.search import preflight_tasks
from layerswap.search.fidelity import policy_of
from layerswap.search.promote import promotion_tasks, shot_groups
from layerswap.spaces.base import same_model
from layerswap.spaces.languages import same_language
from layerswap.spaces.search_space import ExpertPool
from layerswap.spaces.study import LoadedStudy, Profile, StudyExpert, StudySearch, load_profiles
from layerswap.spaces.task_families import is_world_task
from layerswap.spaces.train_experiment import TrainExperiment, world_dir
from layerswap.study import estimate as est
from layerswap.study import training
from layerswap.study.report import STAGES, Row, Stage, StudyPlan
from layerswap.study.storage import fmt_bytes


class _Ctx:
    """What the stage builders share: the profile, the plan being filled, caches of lookups."""

    def __init__(self, loaded: LoadedStudy, prof: Profile, plan: StudyPlan):
        self.loaded, self.prof, self.plan = loaded, prof, plan
        self.models: dict[str, object] = {}  # base -> ModelShape (None: no config)
        self.texts: dict = {}  # lm-eval config text, read once for every task lookup
        self.tasks_seen: set[str] = set()

    def model(self, base: str | None, where: str):
        """The ModelShape of `base` from its config (cached), or None with a problem recorded."""
        if base is None:
            return None
        if base not in self.models:
            # lazy: torch (~3 s), only for a base the plan has not sized yet
            from layerswap.trainables.train.model_shape import load_model_config, model_shape

            try:
                cfg, origin = load_model_config(base)
                self.models[base] = model_shape(cfg)
                self.plan.resolved.append(f"model {base}: {origin}")
            except ValueError as e:
                self.models[base] = None
                self.plan.problems.append(f"{where}: {e}")
        return self.models[base]

    def shape(self, task: str, world: str | None, where: str):
        """The task's TaskShape with `items` filled in, or None (recorded as unknown)."""
        shape = est.task_shape(task, self.loaded.study.tasks)
        if shape is not None and shape.items is None and is_world_task(task):
            try:
                shape = shape.model_copy(update={"items": est.world_items(task, world)})
            except ValueError as e:  # a world task of no family: its items cannot be counted
                self.plan.problems.append(f"{where}: {e}")
                return None
        if shape is None or shape.items is None:
            self.plan.unknowns.append(f"{where}: task {task}: no items/token shape known; give it under the study's tasks:")  # fmt: skip
            return None
        if task not in self.tasks_seen:
            self.tasks_seen.add(task)
            mc = f", {shape.choices} options" if shape.choices else ", generation"
            mc += f" ({shape.answer_tokens:g} steps a batch to the stop strings)" if shape.answer_tokens and not shape.choices else ""  # fmt: skip
            self.plan.resolved.append(f"task shape {task}: {shape.items} items, {shape.prompt_tokens:g} prompt + {shape.shot_tokens:g}/shot tokens{mc}")  # fmt: skip
            self.plan.resolved.append(f"task shapes {shape.note}")
        return shape

    def find_tasks(self, names: list[tuple[str, str]], world: str | None, include_path=()) -> None:  # fmt: skip
        """Check task names (search.preflight_tasks.find_tasks); problems and what was found go to the plan."""
        problems, found = preflight_tasks.find_tasks(names, world, self.texts, list(include_path))
        self.plan.problems += problems
        self.plan.resolved += found


# ---------------------------------------------------------------------------- stage 1 and 2


def _rows(ex: StudyExpert, ctx: _Ctx) -> list[int] | None:
    """Rows of each dataset: local files counted (the trainer's reader), Hub sources from the
    study's `rows`, else their `limit`; None when one cannot be known."""
    # lazy: torch (~3 s); `layerswap plan` loads it only to count local rows
    from layerswap.trainables.train.data import load_pairs
    from layerswap.trainables.train.sft_records import resolve_language
    from layerswap.trainables.train.sources import get_source

    rows: list[int] | None = []
    for i, ds in enumerate(ex.experiment.datasets):
        where = f"{ex.label}: datasets[{i}]"
        n = None
        if ds.source is None:
            try:
                n = len(load_pairs(ds))
                ctx.plan.resolved.append(f"dataset {ds.path}: {n} rows (counted)")
            except ValueError as e:
                ctx.plan.problems.append(f"{where}: {e}")
        else:
            try:
                src = get_source(ds.source)
                lang = f", {resolve_language(ds.language).code}" if ds.language else ""
                ctx.plan.resolved.append(f"dataset {ds.source}: {src.hub_id} (Hub{lang}), read when training starts")  # fmt: skip
            except ValueError as e:
                ctx.plan.problems.append(f"{where}: {e}")
            n = ex.rows or ds.limit
            if n is None:
                ctx.plan.unknowns.append(f"{where}: {ds.label}: rows cannot be counted offline; give rows: in the study")  # fmt: skip
            elif ex.rows is None:
                ctx.plan.warnings.append(f"{where}: {ds.label}: {n} rows taken from its limit (the source must have that many)")  # fmt: skip
        rows = None if rows is None or n is None else [*rows, n]
    return rows


def _where_train(exp: TrainExperiment) -> str:
    s, sw = exp.scaling, exp.sweep
    on = f"{s.num_workers} x {s.accelerator_type or 'GPU'}" if s.use_gpu else f"{s.num_workers} CPU worker(s) x {s.cpus_per_worker:g} CPU"  # fmt: skip
    return f"{on} ({s.strategy}) per run" + (f"; {sw.num_samples} trial(s), {sw.max_concurrent} at a time" if sw else "")  # fmt: skip


def _train_row(ex: StudyExpert, ctx: _Ctx) -> tuple[Row, float]:
    """Stage-1 row of one expert entry, and the checkpoints its runs write in all."""
    exp, sweep = ex.experiment, ex.experiment.sweep
    rows = _rows(ex, ctx)
    runs = sweep.num_samples if sweep else 1
    variants, bad = training.cost_variants(exp)
    ctx.plan.problems += [f"{ex.label}: {b}" for b in bad]
    tps = ex.tokens_per_sample or exp.hyper.seq_len
    model = ctx.model(exp.base, f"{ex.label}: base")
    per = [training.run_estimate(model, v, rows, tps, ctx.prof) for v in variants] if model else []  # fmt: skip
    notes = []
    if ex.tokens_per_sample is None:
        notes.append(f"tokens/sample = seq_len {exp.hyper.seq_len} (an upper bound; give tokens_per_sample)")  # fmt: skip
    if rows is None and exp.hyper.max_steps is not None:
        notes.append("validation passes not counted (dataset rows unknown)")
    if len(per) > 1:
        notes.append(f"per-run counts averaged over {len(per)} swept variants of {', '.join(p for p in sweep.params if p in training.COST_PARAMS)}")  # fmt: skip
    figs, where = list(training.TRAIN_FIGURES), _where_train(exp)
    if exp.scaling.use_gpu != (ctx.prof.kind == "gpu"):
        ctx.plan.warnings.append(f"{ex.label}: trains on {'GPUs' if exp.scaling.use_gpu else 'CPUs'}, estimated with the {ctx.plan.profile} profile's {ctx.prof.kind} figures")  # fmt: skip
    gpus = exp.scaling.num_workers if exp.scaling.use_gpu else 0
    kw = {"notes": notes, "gpus": gpus, "accelerator": exp.scaling.accelerator_type}
    if not per or any(p is None for p in per):
        return Row(exp.name, {"runs": runs}, where, None, figs, storage=None, **kw), 0.0
    ctx.plan.resolved.append(f"sample lengths {training.LENGTHS}")
    m = training.mean_estimate(per)
    notes += _run_notes(m, exp, tps, runs, ctx.plan.unit)
    counts = {"runs": runs, "samples/run": m["samples"], "tokens/run": m["tokens"], "steps/run": m["steps"], "ckpts/run": m["checkpoints"]}  # fmt: skip
    costs = {k: m[k] for k in training.COSTS}
    row = Row(exp.name, counts, where, runs * m["device_hours"], figs, storage=runs * m["stored"], costs=costs, **kw)  # fmt: skip
    return row, runs * m["checkpoints"]


def _run_notes(m: dict, exp: TrainExperiment, tps: float, runs: int, unit: str) -> list[str]:
    """A run's step and checkpoints, in words (m: training.mean_estimate)."""
    sz, n, ckpts = m["sizes"], exp.scaling.num_workers, m["checkpoints"]
    if n == 1:
        what = "one worker, no collectives"
    elif exp.scaling.strategy == "fsdp":
        what = f"FSDP: {sz.gather_dtype} weights all-gathered for forward and backward, {sz.reduce_dtype} gradients reduce-scattered, every micro-batch"  # fmt: skip
    else:
        what = f"DDP: {sz.reduce_dtype} gradients all-reduced once a step"
    if exp.is_lora:
        dtype = f"the LoRA adapter in {sz.save_dtype}, as PEFT writes it"
    else:
        other = "float32" if exp.precision.checkpoint_dtype == "base" else "the base's dtype"
        alt = f"; {other}: {fmt_bytes(sz.weights_other)}" if sz.weights_other != sz.weights else ""  # fmt: skip
        dtype = f"{sz.save_dtype}: precision.checkpoint_dtype {exp.precision.checkpoint_dtype}{alt}"
    keeps = "every checkpoint" if exp.resume_state == "all" else "the newest checkpoint only"
    ms = {k: f"{m[k] * 1e3:,.0f} ms" for k in ("compute_s", "comm_s", "step_s")}
    step = f"step per {'GPU' if exp.scaling.use_gpu else 'worker'}: compute {ms['compute_s']} (rows of {tps:g} tokens padded to {m['row_tokens']:,.0f}: the longest of {exp.micro_batch * n} sets the pace), communication {fmt_bytes(m['comm_bytes'])} = {ms['comm_s']} ({what}); step {ms['step_s']}"  # fmt: skip
    kept = f"checkpoints: {ckpts:g} x {fmt_bytes(sz.weights)} weights ({dtype}) + {fmt_bytes(sz.resume)} resume state (AdamW, masters) kept by {keeps}: {fmt_bytes(m['stored'])} a run, {fmt_bytes(runs * m['stored'])} for {runs}"  # fmt: skip
    each = max(1.0, ckpts)
    synced = f" ({fmt_bytes(sz.synced)} of it fsynced)" if sz.synced else ""
    writes = f"checkpoint writes: {fmt_bytes(m['written'] / each)} each{synced}, {m['write_s'] / each:,.0f} s each: {runs * m['write_hours']:,.2f} {unit} of the row"  # fmt: skip
    return [step, kept, writes]


def _indicator_row(ex: StudyExpert, ckpts: float, ctx: _Ctx) -> Row | None:
    """Stage-2 row: the sweep scores its checkpoints on the expert kind's indicators."""
    exp, sw = ex.experiment, ex.experiment.sweep
    if sw is None:
        return None
    try:
        world = world_dir(exp)
        tasks = sw.tasks_for(exp.kind, exp.language, world=world is not None)
    except ValueError as e:
        ctx.plan.problems.append(f"{ex.label}: sweep: {e}")
        return None
    w = str(world) if world else None
    ctx.find_tasks([(f"{ex.label}: indicator", t) for t in tasks], w)
    # Sweep trials reserve CPUs only (experts/sweep.py run_sweep), so `auto` scores on the CPU.
    device = "cuda" if sw.device == "cuda" else "cpu"
    if device == "cpu" and ctx.prof.kind == "gpu":
        ctx.plan.warnings.append(f"{ex.label}: indicators score on the CPU (sweep.device {sw.device}: sweep trials hold no GPU), where the {ctx.plan.profile} figures do not apply; set device: cuda")  # fmt: skip
    gpus = 1 if device == "cuda" else 0
    scored = ckpts if sw.checkpoints == "all" else (sw.num_samples if ckpts else 0)
    batch = est.auto_batch(device) if sw.batch_size == "auto" else sw.batch_size
    shapes = [ctx.shape(t, w, f"{ex.label}: indicator") for t in tasks]
    model = ctx.model(exp.base, f"{ex.label}: base")
    counts = {"checkpoints": scored, "tasks": len(tasks), "evaluations": scored * len(tasks)}
    where = f"each sweep trial, on {device}, batch {batch}: {', '.join(tasks)}"
    figs = ["decode_bytes_per_s", "decode_step_overhead_s", "prefill_flops_per_s"]
    if model is None or None in shapes:
        return Row(exp.name, counts, where, None, figs, gpus=gpus)
    secs, high, items, figs, notes = _evals(est.model_cost(model, exp), [(s, sw.num_fewshot) for s in shapes], sw.limit, sw.max_gen_toks, batch, ctx.prof, sw.backend == "lm_eval")  # fmt: skip
    counts["items/ckpt"] = items
    return Row(exp.name, counts, where, scored * secs / 3600, sorted(figs), hours_high=scored * high / 3600 if notes else None, notes=notes, gpus=gpus)  # fmt: skip


def _evals(cost: est.ModelCost, shapes: list, limit, gen_toks: int, batch: int, prof: Profile, lm_eval: bool) -> tuple[float, float, int, set, list[str]]:  # fmt: skip
    """est.evals_cost decoding to the stop strings and, as the upper bound, to max_gen_toks:
    (seconds, upper-bound seconds, items, figures, a note when they differ)."""
    secs, items, figs = est.evals_cost(cost, shapes, limit, gen_toks, batch, prof, row_per_option=lm_eval)  # fmt: skip
    high, _, _ = est.evals_cost(cost, shapes, limit, gen_toks, batch, prof, row_per_option=lm_eval, to_stop=False)  # fmt: skip
    steps = sorted({est.decode_steps(sh, k, gen_toks) for sh, k in shapes if not sh.choices})
    if high <= secs:
        return secs, high, items, figs, []
    note = f"decoding: {', '.join(f'{x:g}' for x in steps)} steps a batch to the tasks' stop strings (task shapes: answer_tokens); up to the upper bound (<=) if every batch decodes max_gen_toks {gen_toks}"  # fmt: skip
    return secs, high, items, figs, [note]


# ---------------------------------------------------------------------------- stage 3 and 4


def _pool_sizes(s: StudySearch, ctx: _Ctx, scored: dict[str, float]) -> tuple[int, int, str | None]:
    """(task experts, language experts, base) the search's pool will hold."""
    exp = s.experiment
    if exp.experts is None:
        return len(exp.task_experts), len(exp.language_experts), exp.base
    src, lang = exp.experts, exp.experts.language or exp.language
    # A study may hold several models: a search merges only experts of its own base (the rule of
    # search.pool.registry_picks, which the search applies to the registry's rows).
    ours = [e for e in ctx.loaded.experts if exp.base is None or same_model(exp.base, e.experiment.base)]  # fmt: skip
    of_base = f" of base {exp.base}" if exp.base else ""
    sides = []
    for kind, language in (("math", None), ("language", lang)):
        mine = [e for e in ours if e.experiment.kind == kind and e.experiment.sweep is not None and (language is None or same_language(language, e.experiment.language))]  # fmt: skip
        if not mine:
            ctx.plan.problems.append(f"{s.label}: experts.registry: no {kind} expert of this study{of_base}{' in ' + language if language else ''} has a sweep, so none reaches the registry")  # fmt: skip
        rows = sum(scored.get(e.label, 0) for e in mine)
        sides.append(max(1, min(src.top_k, int(rows))))
    bases = {e.experiment.base for e in ctx.loaded.experts}
    return sides[0], sides[1], exp.base or (bases.pop() if len(bases) == 1 else None)


def _search_rows(s: StudySearch, ctx: _Ctx, scored: dict[str, float]) -> tuple[Row | None, Row | None]:  # fmt: skip
    """Stage-3 and stage-4 rows of one search."""
    exp = s.experiment
    names = [(f"{s.label}: {'target' if t == exp.target_task else 'proxy'}", t) for t in promotion_tasks(exp)]  # fmt: skip
    ctx.find_tasks(names, exp.world, exp.include_path)
    n_task, n_lang, base = _pool_sizes(s, ctx, scored)
    model = ctx.model(base, f"{s.label}: base")
    if model is None:
        ctx.plan.unknowns.append(f"{s.label}: no base model config to size the merged model by")
        return None, None
    cost = est.model_cost(model)
    pool = (n_task, n_lang, base)
    return _trial_row(s, cost, ctx), _promotion_row(s, cost, model.layers, pool, ctx)


def _trial_row(s: StudySearch, cost: est.ModelCost, ctx: _Ctx) -> Row:
    """Stage-3 row: num_samples trials, each composing a candidate and scoring the proxies."""
    exp, st, prof = s.experiment, s.experiment.search, ctx.prof
    g = st.gpus_per_trial
    device = "cuda" if g > 0 else "cpu"
    if device == "cpu" and prof.kind == "gpu":
        ctx.plan.warnings.append(f"{s.label}: gpus_per_trial 0: trials run on CPUs, where the {ctx.plan.profile} figures do not apply")  # fmt: skip
    pe, n = exp.proxy_eval, st.num_samples
    batch = est.auto_batch(device) if pe.batch_size == "auto" else pe.batch_size
    tasks = [(p.task, p.num_fewshot) for p in exp.proxy_list]
    shapes = [(ctx.shape(t, exp.world, f"{s.label}: proxy"), k) for t, k in tasks]
    counts = {"trials": n, "proxies": len(tasks), "evaluations": n * len(tasks)}
    on = f"{g:g} GPU/trial" if g > 0 else f"CPU, {st.torch_threads} thread(s)/trial"
    where = f"{on}, experts per {st.expert_store}, batch {batch}: {', '.join(t for t, _ in tasks)}"
    figs = ["decode_bytes_per_s", "decode_step_overhead_s", "merge_bytes_per_s", "prefill_flops_per_s", "trial_overhead_s"]  # fmt: skip
    if any(sh is None for sh, _ in shapes):
        return Row(exp.name, counts, where, None, figs, gpus=g)
    ev, ev_high, items, _, decode = _evals(cost, shapes, pe.limit, pe.max_gen_toks, batch, prof, False)  # fmt: skip
    counts["items/trial"] = items
    fixed = prof.trial_overhead_s.value + cost.weight_bytes / prof.merge_bytes_per_s.value
    hours = n * est.trial_device_hours(fixed + ev, g, st.torch_threads, prof)
    high = n * est.trial_device_hours(fixed + ev_high, g, st.torch_threads, prof) if decode else None  # fmt: skip
    notes = ["compose: the whole model each trial (an upper bound: a trial moves only the tensors that changed)", *decode]  # fmt: skip
    low, (whole, share) = None, policy_of(st.fidelity, st.multi_objective).floor(st.fidelity)
    if whole is not None and n > whole:
        low = hours - (n - whole) * est.trial_device_hours((1 - share) * ev, g, st.torch_threads, prof)  # fmt: skip
        notes.append(f"fidelity {st.fidelity.policy} ({share:g} of the items first): down to the lower bound (>=) if every trial after the first {whole} stops there")  # fmt: skip
    return Row(exp.name, counts, where, hours, figs, hours_low=low, hours_high=high, notes=notes, gpus=g)  # fmt: skip


def _promotion_row(s: StudySearch, cost: est.ModelCost, depth: int, pool: tuple, ctx: _Ctx) -> Row:  # fmt: skip
    """Stage-4 row: the top_k recipes and the baselines (search.promote.baselines) on every
    promotion task, one lm-eval run per few-shot group."""
    # lazy: promotion loads torch; planning needs only its baseline list
    from layerswap.search.promote import baselines

    exp, pr, prof = s.experiment, s.experiment.promote, ctx.prof
    n_task, n_lang, base = pool
    stand_in = ExpertPool.from_paths([f"task{i}" for i in range(n_task)], [f"language{i}" for i in range(n_lang)], base)  # fmt: skip
    n_base = len(baselines(exp, stand_in, depth))
    models = min(pr.top_k, exp.search.num_samples) + n_base
    device = "cpu" if pr.device == "cpu" or (pr.device == "auto" and prof.kind == "cpu") else "cuda"  # fmt: skip
    batch = est.auto_batch(device) if pr.batch_size == "auto" else pr.batch_size
    gpus = 1 if device == "cuda" else 0
    tasks = [(t, shots or 0) for shots, group in shot_groups(exp) for t in group]
    shapes = [(ctx.shape(t, exp.world, f"{s.label}: promotion"), k) for t, k in tasks]
    counts = {"models": models, "baselines": n_base, "tasks": len(tasks), "evaluations": models * len(tasks)}  # fmt: skip
    where = f"the search driver's node, {device}, lm-eval batch {batch}: {', '.join(t for t, _ in tasks)}"  # fmt: skip
    notes = [f"pool: {n_task} task x {n_lang} language expert(s)"]
    if pr.num_fewshot is None:
        notes.append("target at its task's default shots, counted as 0")
    figs = ["decode_bytes_per_s", "decode_step_overhead_s", "merge_bytes_per_s", "prefill_flops_per_s"]  # fmt: skip
    if any(sh is None for sh, _ in shapes):
        return Row(exp.name, counts, where, None, figs, notes=notes, gpus=gpus)
    ev, ev_high, items, _, decode = _evals(cost, shapes, pr.limit, pr.max_gen_toks, batch, prof, True)  # fmt: skip
    counts["items/model"] = items
    compose = cost.weight_bytes / prof.merge_bytes_per_s.value
    high = models * (ev_high + compose) / 3600 if decode else None
    stored = cost.weight_bytes if pr.write_best else 0.0
    if pr.write_best:
        notes.append(f"writes the best model (promote.write_best): {fmt_bytes(stored)}")
    return Row(exp.name, counts, where, models * (ev + compose) / 3600, figs, hours_high=high, storage=stored, notes=notes + decode, gpus=gpus)  # fmt: skip


# ---------------------------------------------------------------------------- the plan


def plan_study(loaded: LoadedStudy, profile: str | None = None, profiles: dict[str, Profile] | None = None) -> StudyPlan:  # fmt: skip
    """Resolve, count and estimate a whole study.

    Args:
        loaded: the study (spaces.study.load_study).
        profile: the throughput profile's name (default: the study's `profile`).
        profiles: the profiles to choose from (default: spaces/throughput.yaml).
    Returns:
        the StudyPlan; its `problems` are non-empty when something named does not resolve.
    Raises:
        ValueError: an unknown profile name (listing the known ones).
    """
    profiles = profiles if profiles is not None else load_profiles()
    name = profile or loaded.study.profile
    if name not in profiles:
        raise ValueError(f"profile {name!r}: unknown (known: {', '.join(sorted(profiles))})")
    prof = profiles[name]
    plan = StudyPlan(loaded.study.name, str(loaded.path), name, prof.model_dump(mode="json"), prof.unit)  # fmt: skip
    ctx = _Ctx(loaded, prof, plan)
    train, ind = Stage("train", STAGES["train"]), Stage("indicators", STAGES["indicators"])
    scored: dict[str, float] = {}
    for ex in loaded.experts:
        row, ckpts = _train_row(ex, ctx)
        train.rows.append(row)
        if (r := _indicator_row(ex, ckpts, ctx)) is not None:
            ind.rows.append(r)
            scored[ex.label] = r.counts["checkpoints"]
    search, promo = Stage("search", STAGES["search"]), Stage("promotion", STAGES["promotion"])
    for s in loaded.searches:
        t, p = _search_rows(s, ctx, scored)
        search.rows += [t] if t else []
        promo.rows += [p] if p else []
    plan.stages = [train, ind, search, promo]
    plan.resolved = sorted(dict.fromkeys(plan.resolved))
    return plan
