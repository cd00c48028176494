"""search/optuna_private.py against the pinned Optuna: fails loudly when Optuna moves the trial
id or where enqueue_trial keeps its params.

Run: .venv/bin/python -m pytest -q tests/search/test_optuna_private.py
"""

from __future__ import annotations

import optuna

from layerswap.search.optuna_private import live_trial, queued_params


def test_optuna_is_the_pinned_version():
    assert optuna.__version__ == "5.0.0", "re-check search/optuna_private.py, then move the pin"


def test_a_stored_trial_reports_and_is_told_through_its_live_handle():
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"x": 3})
    asked = study.ask()
    asked.suggest_int("x", 0, 9)
    study.ask().suggest_int("x", 0, 9)  # a second RUNNING trial: the handle must pick the first
    frozen = study.get_trials(deepcopy=False)[0]
    assert queued_params(frozen) == {"x": 3}
    assert queued_params(study.get_trials(deepcopy=False)[1]) is None
    handle = live_trial(study, frozen)
    handle.report(0.25, step=4)
    study.tell(handle, 0.5)
    done = study.get_trials(deepcopy=False)[0]
    assert (done.state, done.value, done.intermediate_values) == (
        optuna.trial.TrialState.COMPLETE, 0.5, {4: 0.25},
    )  # fmt: skip
    assert study.get_trials(deepcopy=False)[1].state == optuna.trial.TrialState.RUNNING
