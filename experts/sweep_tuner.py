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
from typing import Any

from layerswap.experts.sweep_setup import SweepSetup
from layerswap.spaces.errors import RunFailed
from layerswap.spaces.sweep import Choice, SweepConfig

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


# The searcher's own state beside it, by algorithm: Tune restores the searcher from the newest
# of each (ray 2.60: tune/search/search_generator.py, searcher.py, basic_variant.py; pickles
# all, whatever the suffix). Without them a restored searcher starts over and runs num_samples
# new trials.
SEARCHER_GLOBS = {
    "optuna": ("search_gen_state-*.json", "searcher-state-*.pkl"),
    "random": ("basic-variant-state-*.json",),
}


class SweepStateError(ValueError):
    """An unfinished sweep whose Tune state cannot be restored (missing or unreadable)."""


def _newest(folder: Path, pattern: str) -> Path | None:
    """The file Tune restores from: the greatest name matching `pattern`, as Tune picks it."""
    found = sorted(folder.glob(pattern))
    return found[-1] if found else None


def saved_trials(folder: Path) -> set[str]:
    """The trial ids the newest experiment state in `folder` names (read without Ray).

    Args:
        folder: the sweep's folder, RUN/train/<name>/.
    Returns:
        the trial ids.
    Raises:
        ValueError: there is no state, or it is not the JSON Tune writes (e.g. cut mid-copy).
    """
    state = _newest(folder, STATE_GLOB)
    if state is None:
        raise ValueError(f"no {STATE_GLOB}")
    try:
        data = json.loads(state.read_text(encoding="utf-8"))
        if not isinstance(data.get("runner_data"), dict):
            raise ValueError("no runner_data")
        return {json.loads(trial[0])["trial_id"] for trial in data["trial_data"]}
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(f"{state.name} cannot be read ({type(e).__name__}: {e})") from None


def restore_problem(folder: Path, algorithm: str) -> str | None:
    """Why the Tune experiment in `folder` cannot be restored, or None: read without Ray (the
    CLI refuses before Ray starts). Tune itself, finding its state unreadable inside fit(),
    logs it and starts the sweep over, forgetting every trial (it raises only with fail_fast):
    so the newest experiment state is parsed here, and the searcher's state files must be there
    (make_tuner loads them as Tune will, once Ray is imported).

    Args:
        folder: the sweep's folder, RUN/train/<name>/ (Tune's experiment folder).
        algorithm: the sweep's search algorithm (SEARCHER_GLOBS).
    Returns:
        a phrase naming what is missing or unreadable, or None.
    """
    globs = (TUNER_FILE, STATE_GLOB, *SEARCHER_GLOBS[algorithm])
    missing = [g for g in globs if not any(f.stat().st_size for f in folder.glob(g) if f.is_file())]  # fmt: skip
    if missing:
        return f"its Ray Tune state ({', '.join(missing)}) is missing"
    try:
        saved_trials(folder)
    except ValueError as e:
        return f"its Ray Tune state is unreadable: {e}"
    return None


def _load_searcher_state(folder: Path, algorithm: str) -> None:
    """Unpickle the newest searcher state files as Tune's restore will (ray.cloudpickle).

    Raises:
        SweepStateError: one is cut short, or names a class that is gone.
    """
    import ray.cloudpickle as cloudpickle  # lazy: Ray is imported by the caller already

    for pattern in SEARCHER_GLOBS[algorithm]:
        f = _newest(folder, pattern)
        try:
            with open(f, "rb") as fh:
                cloudpickle.load(fh)
        except Exception as e:  # EOFError, UnpicklingError, AttributeError of a moved class
            raise cannot_restore(folder, f"its Ray Tune state is unreadable: {f.name} ({type(e).__name__}: {e})") from None  # fmt: skip


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


def check_resumed(folder: Path, named: set[str], trials: set[str]) -> None:
    """After a resumed sweep: every trial its saved state named must be among its results.
    Tune starts a sweep over when it cannot restore it (logged, not raised): then the old
    trials are missing, and their registry rows must not be taken for lost ones.

    Args:
        folder: the sweep's folder.
        named: the trial ids its saved state named before fit() (saved_trials).
        trials: the trial ids of the resumed sweep's results.
    Raises:
        RunFailed: some are missing; no registry row has been touched.
    """
    if missing := sorted(named - trials):
        raise RunFailed(
            f"{folder}: Ray Tune did not restore this sweep's trials {', '.join(missing)} (it "
            "started the sweep over: its log says why, with --verbose); their registry rows and "
            "checkpoints are kept, no sweep_finished.json is written; pass --overwrite to run "
            "the sweep again or choose another --out"
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
    """The driver callback appending trials' rows to `path` (absolute: Tune pickles it into
    tuner.pkl, and a resume may run from another folder)."""
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
        max_failures: Tune's FailureConfig.max_failures (a restored Tuner keeps the first run's).
        verbose: Tune's verbosity (a restored Tuner takes this one too).
        resume: restore the Tuner in setup.storage/name instead of starting one.
    Returns:
        the Tuner, ready to fit().
    Raises:
        SweepStateError: `resume` and the Tune state is missing or cannot be read.
    """
    from ray import tune

    os.environ.setdefault(STATE_PERIOD_ENV, STATE_PERIOD_S)
    registry = Path(registry).resolve()
    if resume:
        folder = Path(setup.storage) / name
        if (problem := restore_problem(folder, setup.sweep.algorithm)) is not None:
            raise cannot_restore(folder, problem)
        _load_searcher_state(folder, setup.sweep.algorithm)
        try:
            tuner = tune.Tuner.restore(
                str(folder), trainable=trainable, resume_unfinished=True, resume_errored=True
            )
        except Exception as e:  # a truncated pickle, a state of another trainable, ...
            raise cannot_restore(folder, f"its Ray Tune state cannot be read ({type(e).__name__}: {e})") from None  # fmt: skip
        # Tune restores the RunConfig pickled at the first run as is (only its name and storage
        # path are updated; ray 2.60 tune/impl/tuner_internal.py _restore_from_path_or_uri, no
        # public way to pass one): its callback would append to the first run's registry path
        # (relative to that run's cwd), and its verbosity would be the first run's. This run's
        # replace them (a Ray without this private attribute fails here, loudly).
        run_config = tuner._local_tuner.get_run_config()
        run_config.callbacks = [_append_callback(registry)]
        run_config.verbose = verbose
        return tuner
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
