"""Adapter over Ray Tune's OptunaSearch internals (ray 2.60): its Optuna study and trials.

OptunaSearch keeps the study and the Optuna trial behind each Tune trial in private attributes
(`_ot_study`, `_ot_trials`, `_completed_trials`); the merge search needs them to tell Optuna the
truth about screened-out and failed trials, and to hold a proposal back while an identical
recipe runs. They are reached only here; tests/search/test_optuna_tune.py fails loudly, naming
the installed Ray version, when a release changes them.
"""

from __future__ import annotations

import optuna
from ray.tune.search.optuna import OptunaSearch


class OptunaTuneSearch(OptunaSearch):
    """OptunaSearch with its study and per-trial Optuna trials as a small public surface."""

    @property
    def study(self) -> optuna.Study:
        """The Optuna study every trial is asked from and told to."""
        return self._ot_study

    def optuna_trial(self, trial_id: str) -> optuna.Trial:
        """The Optuna trial behind a Tune trial id (set by `suggest`)."""
        return self._ot_trials[trial_id]

    def bind(self, trial_id: str, ot_trial: optuna.Trial) -> None:
        """Make `ot_trial` (asked earlier, held back) the Optuna trial of `trial_id`."""
        self._ot_trials[trial_id] = ot_trial

    def unbind(self, trial_id: str) -> None:
        """Forget `trial_id`'s Optuna trial without telling the study (it will run later)."""
        del self._ot_trials[trial_id]

    def is_completed(self, trial_id: str) -> bool:
        """Whether `trial_id` was already reported complete (Tune may report twice)."""
        return trial_id in self._completed_trials

    def mark_completed(self, trial_id: str) -> None:
        """Record `trial_id` as reported, as OptunaSearch.on_trial_complete does."""
        self._completed_trials.add(trial_id)
