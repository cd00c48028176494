"""The two Optuna internals the search's resume relies on, in one place (pinned: optuna==5.0.0).

`live_trial(study, frozen)` gives the `optuna.trial.Trial` of a stored trial, so a resumed search
reports rung values through it as the running search does; `queued_params(frozen)` gives the
params `Study.enqueue_trial` fixed for it. tests/search/test_optuna_private.py fails loudly when
Optuna moves either.
"""

from __future__ import annotations

import optuna


def live_trial(study: optuna.Study, frozen: optuna.trial.FrozenTrial) -> optuna.trial.Trial:
    """The `Trial` handle of a stored (RUNNING) trial: what `study.ask()` returned for it.

    Args:
        study: the study holding it.
        frozen: the trial as `study.get_trials` lists it.
    Returns:
        a Trial whose `report` and `tell` act on that stored trial.
    """
    return optuna.trial.Trial(study, frozen._trial_id)  # private: the storage's trial id


def queued_params(frozen: optuna.trial.FrozenTrial) -> dict | None:
    """The params `enqueue_trial` fixed for a trial (a warm-start point, a re-run), or None."""
    fixed = frozen.system_attrs.get("fixed_params")  # private: where enqueue_trial keeps them
    return dict(fixed) if fixed is not None else None
