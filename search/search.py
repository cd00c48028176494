"""The merge search driver: Ray Tune + OptunaSearch (TPE) over layer-swap recipes, proxy-scored.

Run `layerswap search EXPERIMENT.yaml [--out RUN] [--resume]`; the function is `run_search`.
Rows land in RUN/search/trials.parquet as trials finish; the study lives in RUN/search/study.db.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import ray

from layerswap.search.expert_store import choose_store, start_stores, stop_stores
from layerswap.search.optuna_tune import ErrorNotes
from layerswap.search.pool import include_paths, model_depth, model_ids_file, resolve_pool
from layerswap.search.reconcile import NEVER_RAN, reconcile, requeue_lost
from layerswap.search.results import TrialStore
from layerswap.search.search_dir import (
    check_contents,
    check_decoding,
    check_search_dir,
    pool_contents,
    pool_decoding,
    search_identity,
    write_contents,
    write_decoding,
)
from layerswap.search.searcher import STATES, LayerswapSearch, make_sampler
from layerswap.search.trial import check_proxy_scales
from layerswap.search.trial_fit import check_trials_fit, trial_demand
from layerswap.search.tune_trial import NODE_PATHS_KEY, TrialSpec, merge_trial
from layerswap.spaces.errors import RunFailed
from layerswap.spaces.local_inputs import search_inputs
from layerswap.spaces.search_experiment import SearchExperiment, SearchSettings
from layerswap.spaces.search_space import ExpertPool, warm_start
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.model_ids import saved_digests
from layerswap.trainables.node_paths import NodePathError, described, run_lock, start_checked
from layerswap.trainables.outputs import write_marker
from layerswap.trainables.ray_session import cluster_line, init_ray, tune_output
from layerswap.trainables.train.ray_capacity import node_room


@dataclass
class SearchResult:
    run_dir: Path
    trials_path: Path
    study_path: Path
    n_trials: int
    best: list[dict] = field(default_factory=list)
    splits_read: set[tuple[str, str]] = field(default_factory=set)
    lost: int = 0  # trials Ray lost, short of search.num_samples: --resume runs them


def lost_line(lost: int) -> str:
    """The line a search with lost trials ends with (it is not finished)."""
    return (
        f"search: {lost} trial(s) lost to Ray (their process or node died; see their rows' "
        "error): not counted toward search.num_samples; --resume (or --continue) runs them again"
    )


# How a search starts Ray: its trials' logs and Ray's dashboard and log setup stay out.
_RAY_INIT = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}


def _trial_dirname(trial) -> str:
    return f"trial_{trial.trial_id}"  # the default names folders after the whole config


def run_search(
    experiment: SearchExperiment,
    run_dir: str | Path,
    resume: bool = False,
    *,
    progress: bool = True,
    verbose: bool = False,
    before_writing: Callable[[], None] | None = None,
) -> SearchResult:
    """Run (or resume) the proxy-scored merge search of one experiment.

    Args:
        experiment: the validated experiment.
        run_dir: RUN; writes RUN/search/{trials.parquet,study.db,experiment.json,splits_read.json,
            model_ids.json,decoding.json,contents.json}.
        resume: continue an interrupted search (finished trials are kept, not repeated).
        progress: print one line per finished trial.
        verbose: also Ray's, Tune's and Optuna's own notices (see ray_session.tune_output).
        before_writing: called once every check has passed, before the first write into
            RUN/search (the CLI unmarks a finished search there: a refused --resume keeps it).
    Returns:
        SearchResult (paths, trial count, top-k rows, every split read by the proxy stage).
    """
    run_dir = Path(run_dir).resolve()
    sdir = run_dir / "search"
    store = TrialStore(sdir / "trials.parquet")
    db = sdir / "study.db"
    exp = experiment
    check_proxy_scales(exp)  # before anything is written: a wrong scale fails every trial
    check_search_dir(exp, sdir, store, db, resume)
    pool = resolve_pool(exp)
    decoding = pool_decoding(pool)  # what its trials decode with: a --resume must not mix two
    check_decoding(sdir, decoding, resume)
    # What its trials scored: a --resume must not mix two versions of an expert either. The
    # run's saved file digests: a resume hashes only files changed since (read, not written yet).
    with saved_digests(model_ids_file(run_dir), save=False):
        check_contents(sdir, pool_contents(pool), resume)
    depth = model_depth(pool)
    # With a world its trials read RUN/search/tasks: RUN counts, as the search's lock there (the
    # CLI holds it; a direct call holds none, and RUN is then not checked).
    inputs = [*search_inputs(exp, pool), *([run_lock(sdir)] if exp.world is not None else [])]
    if exp.search.num_samples > store.spent():  # trials will run: every node must see the inputs
        start_checked(inputs, verbose=verbose, **_RAY_INIT)
        check_trials_fit(exp.search)  # before anything is written: refused, RUN stays as it was
    if before_writing is not None:
        before_writing()
    sdir.mkdir(parents=True, exist_ok=True)
    write_marker(sdir, "search", search_identity(exp))
    # Proxies spelled out: what this search optimised, whatever later defaults become.
    atomic_write_text(sdir / "experiment.json", exp.explicit().model_dump_json(indent=1))
    atomic_write_text(sdir / "pool.json", pool.model_dump_json(indent=1))
    write_decoding(sdir, decoding)
    with saved_digests(model_ids_file(run_dir)):  # saves the pool's digests for the next --resume
        write_contents(sdir, pool_contents(pool))  # from the cache: no file is read again
    spec = TrialSpec(
        exp.model_dump_json(), pool.model_dump_json(), tuple(include_paths(exp, sdir)), depth,
        node_inputs=tuple(described(inputs)),  # each trial's node checks too (a later one)
    )  # fmt: skip

    # Recipe ids hash the experts: once per run, not again on --resume or in promotion.
    with tune_output(verbose), saved_digests(model_ids_file(run_dir)):
        storage, fresh = _open_study(exp, db, store, progress)
        remaining = exp.search.num_samples - store.spent()  # a lost trial spent nothing
        searcher = None
        if remaining > 0:
            searcher = _make_searcher(exp, pool, depth, store, storage, fresh, progress)
            _run_tuner(exp, searcher, spec, sdir, remaining, progress, verbose)
    store = TrialStore(sdir / "trials.parquet")
    splits = _write_splits(sdir, store)
    lost = max(0, exp.search.num_samples - store.spent())
    if lost and progress:
        print(lost_line(lost))
    best = store.best(exp.promote.top_k)
    if not best and len(store) > lost:  # every trial that ran failed on its own: nothing to promote
        raise RunFailed(none_scored_line(store))
    return SearchResult(run_dir, store.path, db, len(store), best, splits, lost=lost)


def none_scored_line(store: TrialStore) -> str:
    """Why a search whose every trial failed ends without promotion (and unfinished)."""
    failed = [r for r in store.rows if r["status"] == "failed"]
    errors = list(dict.fromkeys(str(r.get("error") or "?").splitlines()[0] for r in failed))
    shown = "; ".join(errors[:3]) + (f"; and {len(errors) - 3} other error(s)" if len(errors) > 3 else "")  # fmt: skip
    return (
        f"search: none of the {len(store)} trial(s) in {store.path} scored ({len(failed)} failed: "
        f"{shown}); nothing to promote. Fix the cause, then start over with --overwrite"
    )


SEARCH_OUTPUTS = ("search", "promotion", "best", "leaderboard.md")  # under RUN


def search_outputs(run_dir: Path) -> list[Path]:
    """What a search and its promotion write under RUN (what `--overwrite` replaces)."""
    return [Path(run_dir) / name for name in SEARCH_OUTPUTS]


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
        lost = requeue_lost(study, store) if exp.search.num_samples > store.spent() else 0
        if progress:
            print(
                f"search: resuming {store.spent()} finished trial(s), {n} interrupted re-queued"
                + (f", {lost} lost to Ray re-queued" if lost else "")
            )
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
    sampler = make_sampler(exp)
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
    searcher.study.set_user_attr("proxies", json.dumps([p.model_dump() for p in exp.proxy_list]))
    return searcher


def _run_tuner(
    exp: SearchExperiment,
    searcher: LayerswapSearch,
    spec: TrialSpec,
    sdir: Path,
    remaining: int,
    progress: bool = True,
    verbose: bool = False,
) -> None:
    """Run the remaining trials with Ray Tune, as many at once as the nodes' CPUs and GPUs allow."""
    import dataclasses

    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    if not ray.is_initialized():
        init_ray(verbose=verbose, **_RAY_INIT)
    if progress:
        print(f"search: {cluster_line()}")
    limit, resources = _trial_resources(exp, ray.nodes())
    store, why = choose_store(exp.search.expert_store, searcher.pool, resources)
    # A fresh key per run: no store of an earlier run of this folder can serve this one.
    key = f"{search_identity(exp)}-{hashlib.sha256(str(sdir).encode()).hexdigest()[:8]}-{uuid.uuid4().hex[:8]}"  # fmt: skip
    spec = dataclasses.replace(spec, expert_store=store, store_key=key)
    asked = limit  # trials proposed ahead of their results: a batch, or those running
    if exp.search.reproducible:
        asked = batch_size(exp.search)
        searcher.plan_batches(asked, remaining)
    # Never more in flight than the cluster holds: a trial left pending is a resource request,
    # which starts nodes on an autoscaling cluster. A batch larger than that is proposed as
    # slots free, from the same told history, so it proposes the same trials.
    at_once = min(limit, asked)
    if progress:
        order = f"in batches of {asked} told in trial order" if exp.search.reproducible else "asynchronously"  # fmt: skip
        print(f"search: {at_once} trial(s) at once ({order}), each {resources}; expert store {store} ({why})")  # fmt: skip
    trainable = tune.with_resources(tune.with_parameters(merge_trial, spec=spec), resources)
    owner = start_stores(key, searcher.pool.base) if store == "node" else None
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=at_once),
            scheduler=ErrorNotes(searcher.note_error),  # tells the trial's own error from Ray's
            num_samples=remaining,
            reuse_actors=True,
            trial_dirname_creator=_trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=f"tune-{int(time.time())}",
            storage_path=str(sdir / "tune"),
            failure_config=tune.FailureConfig(max_failures=exp.search.max_failures),
            verbose=0,
        ),
    )
    if searcher.lines is not None:  # the ETA divides by what runs at once, not by the batch
        searcher.lines.concurrency = at_once
    try:
        grid = tuner.fit()
    finally:
        if owner is not None:
            stop_stores(key)
    if searcher.waiting is not None:  # asked but never run (the budget ran out first)
        searcher.waiting[0].set_user_attr(NEVER_RAN, True)  # --resume must not run it instead
        searcher.study.tell(searcher.waiting[0], state=STATES.FAIL)
    lines = {ln for r in grid for ln in ((r.metrics or {}).get(NODE_PATHS_KEY) or "").split("\n  ")}
    if lines - {""}:  # those trials' rows say "failed"; the search ends in their one line
        raise NodePathError("\n  ".join(sorted(lines - {""})))


# At most this share of the budget runs at once unless search.max_concurrent says otherwise: TPE
# proposes each trial from the results in so far, and with as many trials at once as the budget
# (64 on 8 nodes x 8 GPUs for 64 trials) every proposal is made knowing nothing, i.e. random.
BUDGET_AT_ONCE = 0.25


def _trial_resources(exp: SearchExperiment, nodes: list[dict]) -> tuple[int, dict[str, float]]:
    """(trials at once, Ray resources per trial) for the cluster's nodes, at most
    BUDGET_AT_ONCE of search.num_samples at once (an explicit search.max_concurrent wins).

    Args:
        exp: the experiment.
        nodes: `ray.nodes()`: a trial is placed on one node, so what runs at once is the sum
            over nodes of the trials each holds, not the cluster's totals over the trial.
    Returns:
        (trials at once, never below 1: a joined cluster may still add a node that holds one,
        see check_trials_fit; {"cpu": .., "gpu": ..} as tune.with_resources takes them)
    """
    s = exp.search
    resources = {k.lower(): v for k, v in trial_demand(s).items()}  # tune.with_resources' keys
    limit = max(1, sum(node_room(trial_demand(s), nodes)))
    limit = min(limit, max(1, math.ceil(BUDGET_AT_ONCE * s.num_samples)))
    return s.max_concurrent or limit, resources


def batch_size(s: SearchSettings) -> int:
    """Reproducible mode's batch: `max_concurrent`, else BUDGET_AT_ONCE of the budget, never the
    cluster's size: the same seed and config propose the same trials on 2 cores or 64 (a batch
    larger than the cluster runs in rounds, its results told once all of it finished)."""
    return s.max_concurrent or max(1, math.ceil(BUDGET_AT_ONCE * s.num_samples))


def _write_splits(sdir: Path, store: TrialStore) -> set[tuple[str, str]]:
    """RUN/search/splits_read.json: every split the table's trials read (each row's
    `splits_read`), with those the file already lists (a table written before rows kept them).

    Returns:
        every split read so far.
    """
    splits = {tuple(s) for r in store.rows for s in json.loads(r.get("splits_read") or "[]")}
    old = sdir / "splits_read.json"
    if old.exists():
        splits |= {tuple(s) for s in json.loads(old.read_text())}
    atomic_write_text(old, json.dumps(sorted(splits)))
    return splits
