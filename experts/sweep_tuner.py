"""The Ray Tune side of an expert sweep (experts/sweep.py): its searcher, the driver callback that
appends registry rows, and the Tuner, new or restored from the sweep's folder RUN/train/<name>/
(`layerswap train EXP --out RUN --continue` of an unfinished sweep).

Run its tests: .venv/bin/python -m pytest -q tests/experts/test_sweep.py tests/cli/test_sweep_continue.py
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerswap.spaces.sweep import Choice, SweepConfig

if TYPE_CHECKING:
    from layerswap.experts.sweep import SweepSetup

METRIC = "indicator"  # what a trial reports to the searcher: its best checkpoint's indicator so far
ROWS_KEY = "registry_rows"  # JSON rows a trial hands to the driver, which appends them
# What Tune keeps in the experiment folder and a restore reads: the Tuner (its run config, the
# searcher's kind) and the trial table with the searcher's state (ray 2.60: tune/impl/
# tuner_internal.py _TUNER_PKL, tune/execution/tune_controller.py CKPT_FILE_TMPL).
TUNER_FILE = "tuner.pkl"
STATE_GLOB = "experiment_state-*.json"
# How often (seconds) Tune saves that state: its "auto" waits at least 10 s, long enough for a
# short trial to be created, trained and registered, then lost to a kill before any save named
# it (a resumed sweep would not know it and run num_samples others). At 1 s a trial is in the
# saved state a second or two after it starts, long before its first row at any real size (the
# tests saw it); a save is a few small files. Read by Tune's
# TuneController from the environment when fit() starts; a value the user set is kept.
STATE_PERIOD_ENV, STATE_PERIOD_S = "TUNE_GLOBAL_CHECKPOINT_S", "1"


class SweepStateError(ValueError):
    """An unfinished sweep whose Tune state cannot be restored (missing or unreadable)."""


def restore_problem(folder: Path) -> str | None:
    """Why the Tune experiment in `folder` cannot be restored, or None: read without Ray (the
    CLI refuses before Ray starts); a file that is there but unreadable shows at the restore.

    Args:
        folder: the sweep's folder, RUN/train/<name>/ (Tune's experiment folder).
    Returns:
        a phrase naming what is missing, or None.
    """
    missing = [n for n in (TUNER_FILE,) if not (folder / n).is_file()]
    if not any(folder.glob(STATE_GLOB)):
        missing.append(STATE_GLOB)
    return f"its Ray Tune state ({', '.join(missing)}) is missing" if missing else None


def cannot_restore(folder: Path, why: str) -> SweepStateError:
    """The one-line refusal of an unfinished sweep that cannot be resumed.

    Args:
        folder: the sweep's folder.
        why: what is wrong with its Tune state.
    """
    return SweepStateError(
        f"{folder}: an expert sweep of {folder.name} did not finish and cannot be resumed: "
        f"{why}; pass "
        "--overwrite to run it again (its registry rows go with it) or choose another --out"
    )


def drop_untracked_rows(registry: Path, folder: Path, trials: set[str]) -> list[str]:
    """After a resumed sweep: take out the registry rows of trials its Tune state never named
    (created and registered in the moment before a kill, before Tune saved its state; the
    resumed searcher ran others in their place), so the registry's rows of this sweep are those
    of its num_samples trials. Their checkpoints stay on disk; one line names them.

    Args:
        registry: RUN/experts/registry.parquet.
        folder: the sweep's folder, RUN/train/<name>/.
        trials: the sweep's trial ids (Tune's results).
    Returns:
        the trial folders whose rows were taken out.
    """
    # lazy: pyarrow (0.26 s), only on the driver of a sweep that runs
    from layerswap.experts.registry import drop_rows_under, read_rows
    from layerswap.trainables.storage import is_under

    rows = [r for r in read_rows(registry) if is_under(r["path"], folder)]
    lost = sorted({r["trial_id"] for r in rows} - trials)
    for trial in lost:
        drop_rows_under(registry, folder / trial)
    if lost:
        where = ", ".join(str(folder / t) for t in lost)
        print(f"layerswap: trials lost with the cut sweep, not counted and no longer registered (their checkpoints are kept): {where}", file=sys.stderr)  # fmt: skip
    return [str(folder / t) for t in lost]


def _append_callback(path: Path):
    from ray.tune import Callback

    # lazy: pyarrow (0.26 s), only on the driver of a sweep that runs
    from layerswap.experts.registry import append_rows

    class AppendRows(Callback):
        """Driver side: append each reported row to the registry as it arrives (one writer;
        append_rows replaces a row whose expert_id is there, so a resumed trial adds none twice)."""

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if result.get(ROWS_KEY):
                append_rows(path, json.loads(result[ROWS_KEY]))

    return AppendRows()


@dataclass
class _Space:
    """Picklable define-by-run space (OptunaSearch pickles its state into the experiment dir)."""

    sweep: SweepConfig
    int_params: set[str]

    def __call__(self, trial) -> None:
        self.sweep.suggest(trial, self.int_params)


def searcher(setup: SweepSetup) -> tuple[Any, dict | None]:
    """The sweep's search algorithm and, for random search, its Tune param_space.

    Args:
        setup: the resolved sweep.
    Returns:
        (search_alg, param_space or None).
    """
    sweep = setup.sweep
    if sweep.algorithm == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        alg = OptunaSearch(
            space=_Space(sweep, setup.int_params), metric=METRIC, mode="max", seed=sweep.seed
        )
        return ConcurrencyLimiter(alg, max_concurrent=sweep.max_concurrent), None
    from ray import tune
    from ray.tune.search import BasicVariantGenerator

    param_space = {}
    for name, dim in sweep.params.items():
        if isinstance(dim, Choice):
            param_space[name] = tune.choice(list(dim.choices))
        elif name in setup.int_params:
            lo, hi = int(dim.low), int(dim.high) + 1  # Tune's int upper bound is exclusive
            param_space[name] = tune.lograndint(lo, hi) if dim.log else tune.randint(lo, hi)
        else:
            param_space[name] = (tune.loguniform if dim.log else tune.uniform)(dim.low, dim.high)
    alg = BasicVariantGenerator(random_state=sweep.seed, max_concurrent=sweep.max_concurrent)
    return alg, param_space


def make_tuner(setup: SweepSetup, trainable, name: str, registry: Path, *, max_failures: int, verbose: int, resume: bool):  # fmt: skip
    """A new Tuner for the sweep, or (`resume`) the interrupted one restored from its folder.

    A restored Tuner keeps its searcher's state and trial table: finished trials stay as they
    are (their rows too), unfinished ones run again under their own trial ids (and so in their
    own workdirs, where training resumes), and errored ones get one more attempt: their failure
    count is kept, so the first new error fails them for good (an interrupt can leave a trial
    errored that would otherwise have finished).

    Args:
        setup: the resolved sweep.
        trainable: the Tune trainable (with its parameters and resources).
        name: the experiment's name (Tune's experiment folder under setup.storage).
        registry: RUN/experts/registry.parquet.
        max_failures, verbose: Tune's FailureConfig.max_failures and verbosity (new Tuner).
        resume: restore the Tuner in setup.storage/name instead of starting one.
    Returns:
        the Tuner, ready to fit().
    Raises:
        SweepStateError: `resume` and the Tune state is missing or cannot be read.
    """
    from ray import tune

    os.environ.setdefault(STATE_PERIOD_ENV, STATE_PERIOD_S)
    if resume:
        folder = Path(setup.storage) / name
        if (problem := restore_problem(folder)) is not None:
            raise cannot_restore(folder, problem)
        try:
            return tune.Tuner.restore(
                str(folder), trainable=trainable, resume_unfinished=True, resume_errored=True
            )
        except Exception as e:  # a truncated pickle, a state of another trainable, ...
            raise cannot_restore(folder, f"its Ray Tune state cannot be read ({type(e).__name__}: {e})") from None  # fmt: skip
    alg, param_space = searcher(setup)
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            search_alg=alg,
            num_samples=setup.sweep.num_samples,
            metric=METRIC,
            mode="max",
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=setup.storage,
            callbacks=[_append_callback(registry)],
            failure_config=tune.FailureConfig(max_failures=max_failures),
            verbose=verbose,
        ),
    )
