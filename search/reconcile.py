"""What --resume does to the merge search's Optuna study before asking anything: `reconcile`
finishes the trials an interrupted driver left RUNNING, `requeue_lost` queues Ray's lost ones.

The table (RUN/search/trials.parquet) is the truth: a trial with a row is told what the running
search would have told; one without is queued to run again in its place (`rerun_of`, which the
seeded sampler counts). Tests: .venv/bin/python -m pytest -q tests/search/test_search_crash.py
"""

from __future__ import annotations

import warnings

import optuna

from layerswap.search.optuna_private import live_trial, queued_params
from layerswap.search.results import TrialStore, params_of
from layerswap.search.searcher import STATES, tell
from layerswap.search.tune_trial import served_result

# The user attr of a proposal the search asked for but never ran (the budget ran out while it
# waited for its twin): told FAIL, it holds no row, and is no interrupted trial to run again.
NEVER_RAN = "never_ran"


def requeue_lost(study: optuna.Study, store: TrialStore) -> int:
    """Queue each lost row's recipe to run again (once: the queued trial names it `rerun_of`).

    Returns:
        how many lost trials were queued now.
    """
    queued = {t.user_attrs.get("rerun_of") for t in study.get_trials(deepcopy=False)}
    fresh = [r for r in store.lost() if r["trial_id"] not in queued]
    for r in fresh:
        study.enqueue_trial(params_of(r), user_attrs={"rerun_of": r["trial_id"]})
    return len(fresh)


def reconcile(study: optuna.Study, store: TrialStore) -> int:
    """After an interrupted driver: finish RUNNING Optuna trials from the table, re-queue the rest.

    A trial with a row is told what the running search would have told (its rung values, a
    served row's source status). One without a row is re-queued (`rerun_of` names it), then told
    FAIL: a kill in between leaves it RUNNING and this re-queues it once; a FAIL trial with no
    row and no re-run (left so by an earlier version) is re-queued too, unless it never ran
    (`NEVER_RAN`: asked, then left when the budget ran out). Every step is idempotent,
    so a kill anywhere in here is finished by the next --resume.

    Returns:
        how many interrupted trials were re-queued (their params run again under new numbers).
    """
    rows = {r["trial_id"]: r for r in store.rows}
    trials = study.get_trials(deepcopy=False)
    rerun = {t.user_attrs.get("rerun_of") for t in trials}
    requeued = 0
    for t in trials:
        number, row = f"{t.number:04d}", rows.get(f"{t.number:04d}")
        if t.state == STATES.RUNNING and row is not None:
            with warnings.catch_warnings():  # a rung reported before the kill is kept as it was
                warnings.simplefilter("ignore")
                # an optuna.Trial, so `tell` reports the rungs as the live search does
                tell(study, live_trial(study, t), row, _served(store, row))
        elif row is None and t.state in (STATES.RUNNING, STATES.FAIL):
            if number not in rerun and not t.user_attrs.get(NEVER_RAN):
                study.enqueue_trial(_drawn(t), user_attrs={"rerun_of": number})
                requeued += 1
            if t.state == STATES.RUNNING:
                study.tell(t.number, state=STATES.FAIL)
    return requeued


def _drawn(trial: optuna.trial.FrozenTrial) -> dict:
    """The params an interrupted trial runs again with: those it was queued with (a warm-start
    point, a re-run), else all it drew (the searcher names its recipe only once it has), else
    none: a kill between two of its draws left some, and fixing those would shift the seeded
    sampler's draws for the rest; asked afresh in its place it draws what it drew before."""
    if (fixed := queued_params(trial)) is not None:
        return fixed
    return dict(trial.params) if "recipe_id" in trial.user_attrs else {}


def _served(store: TrialStore, row: dict) -> dict | None:
    """What a served (duplicate) row's trial reported, rebuilt from its source row; else None."""
    source = store.evaluated(row["recipe_id"]) if row["status"] == "duplicate" else None
    return served_result(source) if source is not None else None
