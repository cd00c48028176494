"""Adapter over Ray Tune's OptunaSearch internals (ray 2.60): its Optuna study and trials.

OptunaSearch keeps the study and the Optuna trial behind each Tune trial in private attributes
(`_ot_study`, `_ot_trials`, `_completed_trials`); the merge search needs them to tell Optuna the
truth about screened-out and failed trials, and to hold a proposal back while an identical
recipe runs. They are reached only here; tests/search/test_optuna_tune.py fails loudly, naming
the installed Ray version, when a release changes them.
"""

from __future__ import annotations

import os

import optuna
from ray import cloudpickle
from ray.exceptions import RayError, RayTaskError
from ray.tune.schedulers import FIFOScheduler
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


class ErrorNotes(FIFOScheduler):
    """Tune's default (FIFO) scheduler that first hands a failed trial's exception to `note`.

    Tune tells the searcher only `error=True`; its controller calls the scheduler's
    `on_trial_error(controller, trial)` just before (ray 2.60, TuneController.
    _process_trial_failure), with the error already pickled in the trial's local folder
    (`trial.get_pickled_error()` reads the storage copy, synced only later).

    Args:
        note: called as note(trial_id, exception or None) for each trial Tune gives up on.
    """

    def __init__(self, note):
        super().__init__()
        self.note = note

    def on_trial_error(self, tune_controller, trial) -> None:
        exc = None
        try:
            if trial.pickled_error_file and os.path.exists(trial.pickled_error_file):
                with open(trial.pickled_error_file, "rb") as f:
                    exc = cloudpickle.load(f)
        except Exception:  # an unreadable error file: the trial still ends, unexplained
            pass
        self.note(trial.trial_id, exc)
        super().on_trial_error(tune_controller, trial)


def trial_error(exc: BaseException | None) -> tuple[bool, str]:
    """Whether a failed Tune trial's exception is the trial's own, and its one-line text.

    The trial's own: an exception its code raised (RayTaskError over a non-Ray cause). Anything
    else (its actor or node died, an OOM kill, a Ray error inside it, none recorded) is Ray's.

    Returns:
        (own, "Type: first line of the message").
    """
    if exc is None:
        return False, "Ray ended the trial before it reported (see the Ray logs)"
    cause = exc.cause if isinstance(exc, RayTaskError) else None
    own = cause is not None and not isinstance(cause, RayError)
    shown = cause if own else exc
    lines = [ln.strip() for ln in str(shown).splitlines() if ln.strip()]
    return own, f"{type(shown).__name__}: {lines[0] if lines else ''}"
