"""The merge search's TPE sampler, seeded per trial: `make_sampler(exp)`.

Per trial, not once per process: a resumed search, a re-run trial or a run cut elsewhere proposes
what an uninterrupted one would. Tests: .venv/bin/python -m pytest -q tests/search/test_sampler.py
"""

from __future__ import annotations

import warnings

import numpy as np
import optuna

from layerswap.spaces.search_experiment import SearchExperiment


class TrialSeededTPE(optuna.samplers.TPESampler):
    """TPE whose random draws for each trial are seeded from (seed, the trial's position).

    One seeded stream would make a trial's proposal depend on how many draws came before it in
    this process: a resumed run (a new process) or a re-queued trial would part ways with an
    uninterrupted one. Seeded per trial, a proposal depends only on the seed, its position and
    what the study was told before it. The position is the trial's number less the trials run
    again under a later number before it (interrupted or lost: `rerun_of`), so a re-run takes
    its original's place. Reaches TPESampler's private `_rng` and `_random_sampler` (Optuna
    5.0; tests/search/test_sampler.py fails loudly if they change).
    """

    def __init__(self, *, seed: int, **kw):
        super().__init__(seed=seed, **kw)
        self.base_seed = seed

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        super().before_trial(study, trial)
        reruns = [t.user_attrs.get("rerun_of") for t in study.get_trials(deepcopy=False)]
        k = trial.number - sum(r is not None and int(r) < trial.number for r in reruns)
        state = np.random.SeedSequence([self.base_seed, k]).generate_state(2)
        self._rng.rng.seed(int(state[0]))
        self._random_sampler._rng.rng.seed(int(state[1]))


def make_sampler(exp: SearchExperiment) -> optuna.samplers.TPESampler:
    """TPE for small conditional integer/categorical spaces, run in parallel.

    multivariate + group model the conditional parameters jointly (per sub-space);
    constant_liar keeps concurrent workers from proposing the same point; few random
    startup trials because budgets are tens of trials; seeded per trial (TrialSeededTPE).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return TrialSeededTPE(
            seed=exp.search.seed,
            multivariate=True,
            group=True,
            constant_liar=True,
            n_startup_trials=max(3, min(10, exp.search.num_samples // 5)),
        )
