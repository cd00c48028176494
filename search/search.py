"""The merge search driver: Ray Tune + OptunaSearch (TPE) over layer-swap recipes, proxy-scored.

Run `layerswap search EXPERIMENT.yaml [--out RUN] [--resume]`; the function is `run_search`.
Rows land in RUN/search/trials.parquet as trials finish; the study lives in RUN/search/study.db.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import optuna

from search.optuna_tune import OptunaTuneSearch
from search.results import PROXY_PREFIX, TrialStore
from search.tune_trial import META, TrialSpec, merge_trial
from spaces.recipe import ExpertSoup, dump_recipe, recipe_id
from spaces.search_experiment import SearchExperiment
from spaces.search_space import ExpertPool, ExpertRef, decode, recipe_fields, suggest, warm_start
from trainables.atomic import atomic_write_text

STATES = optuna.trial.TrialState


@dataclass
class SearchResult:
    run_dir: Path
    trials_path: Path
    study_path: Path
    n_trials: int
    best: list[dict] = field(default_factory=list)
    splits_read: set[tuple[str, str]] = field(default_factory=set)


def resolve_pool(exp: SearchExperiment) -> ExpertPool:
    """The experts: explicit paths, or the top_k of each kind from the expert registry."""
    if exp.experts is None:
        return ExpertPool.from_paths(exp.task_experts, exp.language_experts, exp.base)
    import pyarrow.parquet as pq

    from trainables.merge.lora import is_lora_adapter

    src = exp.experts
    rows = pq.read_table(src.registry).to_pylist()
    if not rows:
        raise ValueError(f"experts.registry {src.registry}: no experts")
    inds = [k for k in rows[0] if k.startswith("ind__")]
    lang = src.language or exp.language

    def pick(kind: str, indicator: str | None, default: str, language: str | None):
        ind = indicator or (default if default in inds else (inds[0] if inds else None))
        cand = [
            r for r in rows if r["kind"] == kind and (language is None or r["language"] == language)
        ]
        if not cand:
            raise ValueError(f"experts.registry {src.registry}: no {kind} experts ({language=})")
        cand.sort(key=lambda r: -(r.get(ind) if ind and r.get(ind) is not None else -math.inf))
        return [
            ExpertRef(
                path=r["path"],
                expert_id=r["expert_id"],
                # partial/simultaneous/mix runs may write adapters too: ask the folder itself
                kind="lora" if r["mode"] == "lora" or is_lora_adapter(r["path"]) else "full",
            )
            for r in cand[: src.top_k]
        ]

    task = pick("math", src.task_indicator, "ind__world_mgsm_direct_en_dev", None)
    language = pick("language", src.language_indicator, f"ind__world_belebele_{lang}_dev", lang)
    return ExpertPool(task=task, language=language, base=exp.base or rows[0].get("base"))


def model_depth(pool: ExpertPool) -> int:
    like = next((r.path for r in pool.task if r.kind == "full"), pool.base)
    if like is None:
        raise ValueError("cannot tell the depth: LoRA experts need `base`")
    cfg = json.loads((Path(like) / "config.json").read_text())
    return int(cfg["num_hidden_layers"])


def expert_id(pool: ExpertPool, ref) -> str:
    if isinstance(ref, ExpertSoup):
        return "soup(" + "+".join(expert_id(pool, r) for r in ref.soup) + ")"
    for r in (*pool.task, *pool.language):
        if r.path == ref:
            return r.expert_id or Path(r.path).name
    return Path(str(ref)).name


def include_paths(exp: SearchExperiment, run_dir: Path) -> list[str]:
    paths = list(exp.include_path)
    if exp.world is not None:
        from trainables.evaluate.tasks import write_world_tasks

        tasks = run_dir / "tasks"
        write_world_tasks(Path(exp.world), tasks)
        paths.insert(0, str(tasks))
    if not paths:
        raise ValueError("no task YAMLs: give `world` or `include_path`")
    return paths


class LayerswapSearch(OptunaTuneSearch):
    """OptunaSearch that writes each trial's row, serves repeated recipes and tells Optuna the truth.

    - one report per trial: a screened-out trial is told PRUNED (its low-fidelity value only as an
      intermediate value), a failed one FAIL, never a low-fidelity value as COMPLETE;
    - a recipe already evaluated is served from the table (status "duplicate"); one proposed
      while an identical one is running waits for it;
    - the parquet row is written before Optuna is told, so a crash in between is reconciled on
      --resume from the row.
    """

    def __init__(
        self,
        *,
        exp: SearchExperiment,
        pool: ExpertPool,
        depth: int,
        store: TrialStore,
        progress: bool,
        **kw,
    ):
        self.exp, self.pool, self.depth, self.store, self.progress = (
            exp,
            pool,
            depth,
            store,
            progress,
        )
        self.pending: dict[str, str] = {}  # recipe id -> running trial id
        self.waiting: tuple | None = None
        self.meta: dict[str, dict] = {}
        self.splits: set[tuple[str, str]] = set()
        space = partial(_space_fn, space=exp.space, depth=depth, pool=pool)
        super().__init__(space=space, **kw)

    def suggest(self, trial_id: str):
        if self.waiting is not None:
            ot_trial, params, rid = self.waiting
            if rid in self.pending:
                return None
            self.waiting = None
            self.bind(trial_id, ot_trial)
            return self._dress(trial_id, ot_trial, params, rid)
        params = super().suggest(trial_id)
        if params is None:
            return None
        ot_trial = self.optuna_trial(trial_id)
        try:
            rid = recipe_id(decode(params, self.exp.space, self.depth, self.pool))
        except Exception:  # the trial reports the decoding error as a failed row
            rid = f"invalid-{ot_trial.number}"
        if rid in self.pending:
            self.waiting = (ot_trial, params, rid)
            self.unbind(trial_id)
            return None
        return self._dress(trial_id, ot_trial, params, rid)

    def _dress(self, trial_id, ot_trial, params, rid) -> dict:
        served = self.store.evaluated(rid)
        if served is None:
            self.pending[rid] = trial_id
        ot_trial.set_user_attr("recipe_id", rid)
        self.meta[trial_id] = {"number": ot_trial.number, "recipe_id": rid, "params": params}
        fid = self.exp.search.fidelity
        reject = None if fid.screen is None else self.store.kth_best(fid.keep_top)
        return {**params, META: {"served": served, "reject_below": reject}}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        pass  # one report per trial, handled at completion

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        meta = self.meta.pop(trial_id, None)
        if meta is None or self.is_completed(trial_id):
            return
        if self.pending.get(meta["recipe_id"]) == trial_id:
            del self.pending[meta["recipe_id"]]
        row = self._row(meta, result if not error else None)
        self.store.append(row)  # first the table: --resume trusts it
        splits = (result or {}).get("splits_read") or "[]"
        self.splits |= {
            tuple(s) for s in (json.loads(splits) if isinstance(splits, str) else splits)
        }
        tell(self.study, self.optuna_trial(trial_id), row, result)
        self.mark_completed(trial_id)
        if self.progress:
            obj = row["objective"]
            obj_s = "-" if obj is None else f"{obj:.4f}"
            print(
                f"search: trial {row['trial_id']} {row['status']:<9} objective {obj_s} "
                f"recipe {row['recipe_id']} b={row['bottom']} u={row['top']} "
                f"t_b={row['bottom_transition']} t_u={row['top_transition']} "
                f"w={row['weights']} ({len(self.store)}/{self.exp.search.num_samples})",
                flush=True,
            )

    def _row(self, meta: dict, result: dict | None) -> dict:
        row = {"trial_id": f"{meta['number']:04d}", "recipe_id": meta["recipe_id"]}
        row["params"] = json.dumps(meta["params"], sort_keys=True)
        row["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        try:
            recipe = decode(meta["params"], self.exp.space, self.depth, self.pool)
            row |= {"recipe_yaml": dump_recipe(recipe), "method": recipe.method}
            row |= recipe_fields(recipe)
            row["task_expert_id"] = expert_id(self.pool, recipe.task_expert)
            row["language_expert_id"] = expert_id(self.pool, recipe.language_expert)
        except Exception as e:
            row |= {"status": "failed", "error": f"decode: {e}", "method": "layer_swap"}
            return row
        if result is None:
            return row | {"status": "failed", "error": "the trial raised (see the Ray logs)"}
        status = result.get("status", "failed")
        row["status"] = status
        row["error"] = result.get("error")
        for k in ("t_compose_s", "t_eval_s", "t_total_s"):
            row[k] = float(result.get(k) or 0.0)
        if status == "duplicate":
            row["error"] = f"served from trial {result.get('served_from')}"
            row["fidelity"] = result.get("fidelity")
            row["objective"] = result.get("objective")
            if row["objective"] is not None and not math.isfinite(row["objective"]):
                row["objective"] = None
            row |= {k: v for k, v in result.items() if k.startswith(PROXY_PREFIX)}
            return row
        row["fidelity"] = int(result.get("fidelity") or 0)
        obj = result.get("objective")
        row["objective"] = (
            obj if status == "ok" and obj is not None and math.isfinite(obj) else None
        )
        row |= {k: float(v) for k, v in result.items() if k.startswith(PROXY_PREFIX)}
        return row


def make_sampler(exp: SearchExperiment, offset: int = 0) -> optuna.samplers.TPESampler:
    """TPE for small conditional integer/categorical spaces, run in parallel.

    multivariate + group model the conditional parameters jointly (per sub-space);
    constant_liar keeps concurrent workers from proposing the same point; few random
    startup trials because budgets are tens of trials. `offset` reseeds a resumed run.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=exp.search.seed + offset,
            multivariate=True,
            group=True,
            constant_liar=True,
            n_startup_trials=max(3, min(10, exp.search.num_samples // 5)),
        )


def _trial_dirname(trial) -> str:
    return f"trial_{trial.trial_id}"  # the default names folders after the whole config


def _space_fn(trial, space, depth, pool):
    return suggest(trial, space, depth, pool)


def tell(study: optuna.Study, trial, row: dict, result: dict | None) -> None:
    """Tell Optuna the row's outcome: COMPLETE (full fidelity), PRUNED (screened out) or FAIL."""
    status = row["status"]
    if status == "duplicate":
        status = (result or {}).get("source_status") or (
            "ok" if row["objective"] is not None else "failed"
        )
    try:
        if status == "ok" and row["objective"] is not None:
            n = len(study.directions)
            if n > 1:
                values = [(result or {}).get(f"objective_{i}") for i in range(n)]
                if any(v is None for v in values):
                    proxies = {
                        k[len(PROXY_PREFIX) :]: v
                        for k, v in row.items()
                        if k.startswith(PROXY_PREFIX)
                    }
                    values = [proxies.get(p) for p in _proxy_tasks(study)]
                study.tell(trial, values)
            else:
                study.tell(trial, row["objective"])
        elif status == "pruned":
            low = (result or {}).get("low_fidelity_objective")
            number = trial if isinstance(trial, int) else trial.number
            if low is not None and math.isfinite(low) and not isinstance(trial, int):
                trial.report(low, step=int(row.get("fidelity") or 1))
            study.tell(number, state=STATES.PRUNED)
        else:
            study.tell(trial, state=STATES.FAIL)
    except Exception as e:  # e.g. already finished: the table stays the source of truth
        print(f"search: optuna tell for trial {row['trial_id']}: {e}")


def _proxy_tasks(study) -> list[str]:
    return json.loads(study.user_attrs.get("proxies", "[]"))


def reconcile(study: optuna.Study, store: TrialStore) -> int:
    """After an interrupted driver: finish RUNNING Optuna trials from the table, re-queue the rest.

    Returns:
        how many interrupted trials were re-queued (their params run again under new numbers).
    """
    rows = {r["trial_id"]: r for r in store.rows}
    requeued = 0
    for t in study.get_trials(deepcopy=False, states=(STATES.RUNNING,)):
        row = rows.get(f"{t.number:04d}")
        if row is not None:
            tell(study, t.number, row, None)
        else:
            study.tell(t.number, state=STATES.FAIL)
            study.enqueue_trial(dict(t.params))
            requeued += 1
    return requeued


def run_search(
    experiment: SearchExperiment,
    run_dir: str | Path,
    resume: bool = False,
    *,
    progress: bool = True,
) -> SearchResult:
    """Run (or resume) the proxy-scored merge search of one experiment.

    Args:
        experiment: the validated experiment.
        run_dir: RUN; writes RUN/search/{trials.parquet,study.db,experiment.json,splits_read.json}.
        resume: continue an interrupted search (finished trials are kept, not repeated).
        progress: print one line per finished trial.
    Returns:
        SearchResult (paths, trial count, top-k rows, every split read by the proxy stage).
    """
    run_dir = Path(run_dir).resolve()
    sdir = run_dir / "search"
    store = TrialStore(sdir / "trials.parquet")
    db = sdir / "study.db"
    exp = experiment
    _check_search_dir(exp, sdir, store, db, resume)
    pool = resolve_pool(exp)
    depth = model_depth(pool)
    atomic_write_text(sdir / "experiment.json", exp.model_dump_json(indent=1))
    atomic_write_text(sdir / "pool.json", pool.model_dump_json(indent=1))
    spec = TrialSpec(
        exp.model_dump_json(), pool.model_dump_json(), tuple(include_paths(exp, sdir)), depth
    )

    storage, fresh = _open_study(exp, db, store, progress)
    remaining = exp.search.num_samples - len(store)
    searcher = None
    if remaining > 0:
        searcher = _make_searcher(exp, pool, depth, store, storage, fresh, progress)
        _run_tuner(exp, searcher, spec, sdir, remaining)
    splits = _write_splits(sdir, searcher.splits if searcher is not None else set())
    store = TrialStore(sdir / "trials.parquet")
    return SearchResult(run_dir, store.path, db, len(store), store.best(exp.promote.top_k), splits)


def _check_search_dir(
    exp: SearchExperiment, sdir: Path, store: TrialStore, db: Path, resume: bool
) -> None:
    """Refuse to overwrite a search, or to resume it as a changed experiment; make RUN/search."""
    if not resume and (store.rows or db.exists()):
        raise FileExistsError(f"{sdir}: a search exists; pass --resume to continue it")
    sdir.mkdir(parents=True, exist_ok=True)
    saved = sdir / "experiment.json"
    if resume and saved.exists():
        # Only the budget and promotion may change on resume: rows must stay comparable.
        keep = {"search", "promote"}
        before = SearchExperiment.model_validate_json(saved.read_text()).model_dump(exclude=keep)
        if before != exp.model_dump(exclude=keep):
            raise ValueError(
                f"--resume: the experiment differs from {saved} (beyond search/promote)"
            )


def _open_study(
    exp: SearchExperiment, db: Path, store: TrialStore, progress: bool
) -> tuple[optuna.storages.RDBStorage, bool]:
    """The study's storage, and whether the study is new; an existing one is reconciled first.

    Returns:
        (storage, fresh); fresh is False when RUN/search/study.db already holds the study.
    """
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    fresh = not any(s.study_name == exp.name for s in optuna.get_all_study_summaries(storage))
    if not fresh:
        study = optuna.load_study(study_name=exp.name, storage=storage)
        n = reconcile(study, store)
        if progress:
            print(f"search: resuming {len(store)} finished trial(s), {n} interrupted re-queued")
    return storage, fresh


def _make_searcher(
    exp: SearchExperiment,
    pool: ExpertPool,
    depth: int,
    store: TrialStore,
    storage: optuna.storages.RDBStorage,
    fresh: bool,
    progress: bool,
) -> LayerswapSearch:
    """The TPE searcher over the study; a fresh study starts from the warm-start points."""
    multi = exp.search.multi_objective
    metric = [f"objective_{i}" for i in range(len(exp.proxy_list))] if multi else "objective"
    mode = ["max"] * len(exp.proxy_list) if multi else "max"
    sampler = make_sampler(exp, offset=len(store))
    searcher = LayerswapSearch(
        exp=exp,
        pool=pool,
        depth=depth,
        store=store,
        progress=progress,
        metric=metric,
        mode=mode,
        sampler=sampler,
        storage=storage,
        study_name=exp.name,
        points_to_evaluate=[warm_start(exp.space, depth, pool), *exp.search.points_to_evaluate]
        if fresh
        else None,
    )
    searcher.study.set_user_attr("proxies", json.dumps([p.task for p in exp.proxy_list]))
    return searcher


def _run_tuner(
    exp: SearchExperiment, searcher: LayerswapSearch, spec: TrialSpec, sdir: Path, remaining: int
) -> None:
    """Run the remaining trials with Ray Tune, as many at once as the CPUs allow."""
    import ray
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    cpus = ray.cluster_resources().get("CPU", 1)
    limit = exp.search.max_concurrent or max(1, int(cpus // exp.search.cpus_per_trial))
    trainable = tune.with_resources(
        tune.with_parameters(merge_trial, spec=spec), {"cpu": exp.search.cpus_per_trial}
    )
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=limit),
            num_samples=remaining,
            reuse_actors=True,
            trial_dirname_creator=_trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=f"tune-{int(time.time())}",
            storage_path=str(sdir / "tune"),
            verbose=0,
        ),
    )
    tuner.fit()
    if searcher.waiting is not None:  # asked but never run (the budget ran out first)
        searcher.study.tell(searcher.waiting[0], state=STATES.FAIL)


def _write_splits(sdir: Path, splits: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Add the splits this run read to those of earlier runs (RUN/search/splits_read.json).

    Returns:
        every split read so far (`splits`, updated in place).
    """
    old = sdir / "splits_read.json"
    if old.exists():
        splits |= {tuple(s) for s in json.loads(old.read_text())}
    atomic_write_text(old, json.dumps(sorted(splits)))
    return splits
