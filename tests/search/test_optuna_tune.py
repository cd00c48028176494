"""The OptunaSearch internals behind search/optuna_tune.py: fails loudly, naming the installed
Ray version, when a release changes what the merge search relies on."""

from __future__ import annotations

import optuna
import ray

from layerswap.search.optuna_tune import OptunaTuneSearch

CHANGED = (
    f"ray {ray.__version__}: OptunaSearch no longer keeps its study and trials as "
    "search/optuna_tune.py expects; re-check the adapter against this Ray release"
)


def _space(trial):
    trial.suggest_int("b", 0, 3)


def _searcher() -> OptunaTuneSearch:
    return OptunaTuneSearch(
        space=_space, metric="objective", mode="max", sampler=optuna.samplers.TPESampler(seed=0)
    )


def test_study_and_trials_are_reachable():
    s = _searcher()
    params = s.suggest("t1")
    assert isinstance(s.study, optuna.Study), CHANGED
    ot = s.optuna_trial("t1")
    assert isinstance(ot, optuna.Trial), CHANGED
    assert ot.params == params, CHANGED


def test_bind_unbind_and_completion_bookkeeping():
    s = _searcher()
    s.suggest("t1")
    ot = s.optuna_trial("t1")
    s.unbind("t1")
    s.bind("t2", ot)
    assert s.optuna_trial("t2") is ot, CHANGED
    assert not s.is_completed("t2"), CHANGED
    s.mark_completed("t2")
    assert s.is_completed("t2"), CHANGED
    # OptunaSearch's own completion path honours the mark: it does not tell Optuna twice
    s.study.tell(ot, 1.0)
    s.on_trial_complete("t2", {"objective": 0.5})
    assert [t.value for t in s.study.trials] == [1.0], CHANGED
