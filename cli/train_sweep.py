"""An expert sweep's run folder for `layerswap train` (cli/train.py): RUN/train/<name> replaced only
on --overwrite, resumed by `train --continue` when it holds an unfinished sweep of the same
experiment, and SWEEP_FINISHED written there once the sweep has run its course, which `train
--continue` reads to skip it; and the check, before any trial trains, that the indicator tasks its
trials are scored on can read their data offline.

Run its tests: .venv/bin/python -m pytest -q tests/cli/test_train.py tests/cli/test_rerun_commands.py
tests/cli/test_sweep_continue.py
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from layerswap.experts.sweep_tuner import cannot_restore, restore_problem
from layerswap.spaces.train_experiment import (
    TrainExperiment,
    experiment_identity,
    experiment_json,
    world_dir,
)
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.evaluate.tasks import task_data_problem
from layerswap.trainables.outputs import (
    OutputError,
    check_output,
    read_marker,
    replacing,
    write_marker,
    writing,
)


def sweep_data_problem(exp: TrainExperiment) -> str | None:
    """Why the sweep's scoring would fail for task data missing from the local cache, or None:
    checked before training, since each trial evaluates only once it has trained (hours at 8B).

    Args:
        exp: the experiment, with its `sweep:` block.
    Returns:
        one line naming each indicator task whose data is not in the local cache.
    """
    world = world_dir(exp)
    tasks = exp.sweep.tasks_for(exp.kind, exp.language, world=world is not None)
    return task_data_problem(tasks, world, [])


# In RUN/train/<name> of a sweep that ran its course (every trial ended, failed ones included).
SWEEP_FINISHED = "sweep_finished.json"


def finished_sweep(exp: TrainExperiment, folder: Path) -> dict | None:
    """The record a sweep of `exp` left in `folder` when it ran its course, else None (none
    ran, it was interrupted, or it is another experiment's).

    Returns:
        {"identity", "trials": {trial_id: status}, "rows", "registry"}, or None.
    """
    try:
        rec = json.loads((folder / SWEEP_FINISHED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    same = isinstance(rec, dict) and rec.get("identity") == experiment_identity(exp)
    return rec if same else None


def _check_resumable(exp: TrainExperiment, folder: Path, cont: bool) -> None:
    """Refuse to resume the sweep in `folder` unless `--continue` asks to and it is this
    experiment's (not finished: the caller skips a finished one) with its Tune state there.

    Raises:
        OutputError: another experiment's sweep is there (or, without --continue, any sweep),
            which only --overwrite may replace; with --continue it names what changed.
        SweepStateError: the same experiment's, but its Tune state is missing or unreadable.
    """
    if not cont:
        raise OutputError(
            f"{folder}: an expert sweep of {exp.name} exists; pass --overwrite to run it again "
            "(its registry rows go with it) or choose another --out"
        )
    if (read_marker(folder) or {}).get("identity") != experiment_identity(exp):
        what = _sweep_changes(exp, folder)
        # Tune restores a sweep with the settings it started with (Tuner.restore takes no new
        # num_samples, search space or searcher): a resume of a changed sweep is refused.
        raise OutputError(
            f"{folder}: holds an unfinished expert sweep of a different experiment (config "
            f"changed){'; its checkpoints differ in ' + what if what else ''}; a sweep resumes "
            "only as it started (num_samples and the sweep: block included); pass --overwrite to "
            "run it again (its registry rows go with it) or choose another --out"
        )
    if (problem := restore_problem(folder, exp.sweep.algorithm)) is not None:
        raise cannot_restore(folder, problem)


def _sweep_changes(exp: TrainExperiment, folder: Path) -> str:
    """What differs between `exp` and the experiment the sweep in `folder` trained, as the
    plain run's refusal names it (run.changes), read from a trial's newest checkpoint manifest:
    its swept parameters and trial seed are the trial's own, so they are not counted. "" when no
    trial wrote a checkpoint yet."""
    # lazy: torch (trainables/train/state.py imports it); --help stays fast
    from layerswap.trainables.train.run import changes
    from layerswap.trainables.train.state import find_checkpoints, read_manifest

    found = find_checkpoints(folder)  # every trial's, by step
    if not found:
        return ""
    old = read_manifest(found[-1]).get("experiment") or {}
    now = experiment_json(exp)
    for dotted in [*((old.get("sweep") or {}).get("params") or {}), "hyper.seed"]:
        _set_dotted(old, dotted, _get_dotted(now, dotted))
    return changes(old, exp)


def _get_dotted(data: dict, dotted: str) -> object:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _set_dotted(data: dict, dotted: str, value: object) -> None:
    *head, last = dotted.split(".")
    for part in head:
        data = data.get(part) if isinstance(data, dict) else None
    if isinstance(data, dict) and last in data:
        data[last] = value


def sweep_folder(exp: TrainExperiment, run_dir: Path, overwrite: bool, cont: bool = False):
    """The sweep's folder RUN/train/<name>, to run the sweep in. An earlier sweep there is
    resumed on --continue when it is the same experiment's and unfinished (its folder, rows and
    marker kept as they are), else replaced only on --overwrite, its registry rows dropped with
    it (never a mix of old and new rows).

    Returns:
        (a context manager to run the sweep in, whether it resumes the sweep there).
    """
    # lazy: pyarrow (0.26 s measured), only for a sweep that runs; --help stays fast
    from layerswap.experts.registry import append_rows, drop_rows_under, registry_path

    folder = run_dir / "train" / exp.name
    replaced = folder.exists() and any(folder.iterdir())
    if replaced and not overwrite:
        _check_resumable(exp, folder, cont)
        return writing(folder), True  # one writer; an interrupt leaves it resumable again
    if replaced:
        check_output(folder, "train", overwrite=True)

    @contextmanager
    def run():
        reg = registry_path(run_dir)
        with writing(folder), replacing([folder]):  # one writer per sweep folder
            removed = drop_rows_under(reg, folder)
            try:
                folder.mkdir(parents=True, exist_ok=True)
                write_marker(folder, "train", experiment_identity(exp))
                yield
            except BaseException:
                if replaced:  # the old sweep is put back: the new one's rows go with its folder
                    drop_rows_under(reg, folder)
                if removed:  # and the old one's rows come back
                    append_rows(reg, removed)
                raise

    return run(), False


def run_sweep_recorded(exp: TrainExperiment, run_dir: Path, verbose: bool = False, resume: bool = False) -> int:  # fmt: skip
    """An experiment with a `sweep:` block: the expert sweep (`resume`: the interrupted one in
    its folder, restored), its record (SWEEP_FINISHED) once it ran its course, then its top
    experts printed; both cover every trial of the sweep, those before a resume included.

    Returns:
        0 when every trial finished, 1 when some failed (their rows are still kept).
    """
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.experts.sweep import run_sweep

    # Tune's verbosity: 1 is its default
    res = run_sweep(exp, run_dir, verbose=int(verbose), resume=resume)
    failed = sorted(t for t, s in res.trials.items() if s != "ok")
    # Ran its course (failed trials too: running it again would meet them again): `--continue`
    # skips it. Written inside the sweep's folder, which is kept only if the command ends here.
    record = {"identity": experiment_identity(exp), "trials": res.trials, "rows": len(res.rows)}
    record["registry"] = str(res.registry)
    atomic_write_text(run_dir / "train" / exp.name / SWEEP_FINISHED, json.dumps(record, indent=1))
    print(
        f"expert sweep {exp.name}: {len(res.trials)} trials, {len(res.rows)} checkpoints "
        f"scored in {res.seconds:.0f}s -> {res.registry}"
    )
    col = f"ind__{res.metric_task}"
    for i, r in enumerate(res.best, 1):
        print(f"  #{i} {res.metric_task}={r[col]:.4f} step {r['step']} trial {r['trial_id']}: {r['path']}")  # fmt: skip
    if failed:
        print(f"  failed trials: {', '.join(failed)}")
    return 1 if failed else 0
