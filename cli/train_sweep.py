"""An expert sweep's run folder for `layerswap train` (cli/train.py): RUN/train/<name> replaced only
on --overwrite, resumed by `train --continue` when it holds an unfinished sweep of the same
experiment, and SWEEP_FINISHED written there once the sweep has run its course with a scored
checkpoint, which `train --continue` reads to skip it (a sweep that scored none stays
resumable); SWEEP_DATA, the dataset files' content it trains on, which `--continue` compares
with the files as they are (refused when one changed: never a registry of two datasets); the old
sweep's registry rows, kept in its set-aside folder while an --overwrite
runs (ROWS_ASIDE, put back with it); and the check, before any trial trains, that the indicator
tasks its trials are scored on can read their data offline.

Run its tests: .venv/bin/python -m pytest -q tests/cli/test_train.py tests/cli/test_rerun_commands.py
tests/cli/test_sweep_continue.py tests/cli/test_sweep_overwrite_kill.py
tests/cli/test_train_sweep.py tests/cli/test_sweep_data_changed.py
"""

from __future__ import annotations

import functools
import json
import sys
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
from layerswap.trainables.data_fingerprint import KEY as DATA_KEY
from layerswap.trainables.data_fingerprint import data_change, data_fingerprint
from layerswap.trainables.evaluate.tasks import task_data_problem
from layerswap.trainables.outputs import (
    OutputError,
    check_output,
    read_marker,
    replacing,
    write_marker,
    writing,
)
from layerswap.trainables.storage import is_under


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


# In RUN/train/<name> of a sweep that ran its course (every trial ended, failed ones included)
# with at least one scored checkpoint: a sweep of no registry row gave the searches nothing, so it
# is never finished (`--continue` resumes it and Tune retries its failed trials).
SWEEP_FINISHED = "sweep_finished.json"


def finished_sweep(exp: TrainExperiment, folder: Path) -> dict | None:
    """The record a sweep of `exp` left in `folder` when it ran its course, else None (none
    ran, it was interrupted, it is another experiment's, or it scored no checkpoint: a record of
    0 rows, as versions before this rule wrote for a sweep whose trials all failed).

    Returns:
        {"identity", "trials": {trial_id: status}, "rows", "registry"}, or None.
    """
    try:
        rec = json.loads((folder / SWEEP_FINISHED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    same = isinstance(rec, dict) and rec.get("identity") == experiment_identity(exp)
    return rec if same and rec.get("rows") else None


# In RUN/train/<name>, written when the sweep starts (beside its marker): the content of the
# dataset files its trials train on (trainables/data_fingerprint.py); SWEEP_FINISHED copies
# it. A sweep started before this file existed has none: a resume records the files as its
# trials' checkpoints were checked to hold.
SWEEP_DATA = "sweep_data.json"


def _record_data(exp: TrainExperiment, folder: Path) -> None:
    atomic_write_text(folder / SWEEP_DATA, json.dumps(data_fingerprint(exp), indent=1))


def _recorded_data(folder: Path) -> dict | None:
    try:
        rec = json.loads((folder / SWEEP_DATA).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def check_sweep_data(exp: TrainExperiment, folder: Path, finished: dict | None = None) -> None:
    """Refuse to skip or resume the sweep in `folder` when one of its dataset files changed
    since it trained (data_fingerprint.data_change: the rule a plain run's rerun follows), before
    any work. The files are hashed only when something recorded is there to compare with.

    Args:
        exp: the experiment.
        folder: RUN/train/<name>.
        finished: its SWEEP_FINISHED record; None: an unfinished sweep, compared with its
            SWEEP_DATA and with every checkpoint its trials wrote (a sweep started before
            SWEEP_DATA has only those).
    Raises:
        OutputError: one line naming each changed file and --overwrite.
    """
    if finished is not None:
        recorded = [finished.get(DATA_KEY)]
    else:
        # lazy: torch (trainables/train/state.py imports it); only for a sweep about to resume
        from layerswap.trainables.train.state import find_checkpoints, read_manifest

        recorded = [_recorded_data(folder)] + [read_manifest(c).get(DATA_KEY) for c in find_checkpoints(folder)]  # fmt: skip
    now = functools.cache(lambda: data_fingerprint(exp))  # hashed once, if at all
    for rec in recorded:
        if what := data_change(rec, now, trained="the sweep"):
            raise OutputError(
                f"{folder}: {what}; its experts were trained on the old data, so the sweep is "
                "neither finished nor continued on the new (a registry of experts of two "
                "datasets): pass --overwrite to run it again on the data as it is now (its "
                "registry rows go with it)"
            )


def _check_resumable(exp: TrainExperiment, folder: Path, cont: bool) -> None:
    """Refuse to resume the sweep in `folder` unless `--continue` asks to and it is this
    experiment's (not finished: the caller skips a finished one) with its Tune state there.

    Raises:
        OutputError: another experiment's sweep is there (or, without --continue, any sweep),
            which only --overwrite may replace; with --continue it names what changed.
            Or a dataset file changed since the sweep trained (check_sweep_data).
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
    check_sweep_data(exp, folder)
    if (problem := restore_problem(folder, exp.sweep.algorithm)) is not None:
        raise cannot_restore(folder, problem)


def _sweep_changes(exp: TrainExperiment, folder: Path) -> str:
    """What differs between `exp` and the experiment the sweep in `folder` trained, as the
    plain run's refusal names it (rerun_rule.changes), read from a trial's newest checkpoint manifest:
    its swept parameters and trial seed are the trial's own, so they are not counted. "" when no
    trial wrote a checkpoint yet."""
    # lazy: torch (trainables/train/state.py imports it); --help stays fast
    from layerswap.trainables.train.rerun_rule import changes
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


# In a sweep's folder that `train --overwrite` sets aside (`.NAME.replaced-PID-*`): the registry
# rows the sweep had, which the new sweep drops from the registry. Written (atomically) before
# they are dropped, and read back whenever the folder is in place again: put back on an error or
# interrupt, or moved back by hand after a SIGKILL (the stale lock's hint), so the registry
# lists the sweep the folder holds, never the other's nor none. A kill at any instant leaves the
# old rows in the registry or in this file, whichever folder the user keeps.
ROWS_ASIDE = "registry_rows_set_aside.parquet"


def put_back_rows(run_dir: Path, folder: Path) -> None:
    """Give the sweep folder `folder` back its registry rows when it holds ROWS_ASIDE (it is an
    old sweep back in place after its replacement failed or was killed): the registry's rows
    under it (the replacement's) become the saved ones, then the file goes. Under the folder's
    lock (re-entrant); a kill midway leaves the file, and running it again gives the same.

    Args:
        run_dir: RUN, whose experts/registry.parquet lists the sweep's experts.
        folder: RUN/train/<name>.
    """
    saved = folder / ROWS_ASIDE
    if not saved.is_file():
        return
    # lazy: pyarrow (0.26 s measured), only for a sweep that runs; --help stays fast
    from layerswap.experts.registry import append_rows, drop_rows_under, read_rows, registry_path

    with writing(folder):
        if not saved.is_file():
            return
        rows, reg = read_rows(saved), registry_path(run_dir)
        drop_rows_under(reg, folder)
        if rows:
            append_rows(reg, rows)
        saved.unlink()
        print(f"{folder}: put back its {len(rows)} registry rows, which an --overwrite run that did not finish had set aside")  # fmt: skip


def sweep_folder(exp: TrainExperiment, run_dir: Path, overwrite: bool, cont: bool = False):
    """The sweep's folder RUN/train/<name>, to run the sweep in. An earlier sweep there is
    resumed on --continue when it is the same experiment's and unfinished (its folder, rows and
    marker kept as they are), else replaced only on --overwrite, its registry rows dropped with
    it (never a mix of old and new rows; ROWS_ASIDE keeps them until the new sweep finishes).

    Returns:
        (a context manager to run the sweep in, whether it resumes the sweep there).
    """
    folder = run_dir / "train" / exp.name
    replaced = folder.exists() and any(folder.iterdir())
    if replaced and not overwrite:
        _check_resumable(exp, folder, cont)
    elif replaced:
        check_output(folder, "train", overwrite=True)

    @contextmanager
    def resume():
        with writing(folder):  # one writer; an interrupt leaves it resumable again
            put_back_rows(run_dir, folder)
            if _recorded_data(folder) is None:  # started before SWEEP_DATA: checked just now
                _record_data(exp, folder)
            yield

    @contextmanager
    def run():
        # lazy: pyarrow (0.26 s measured), only for a sweep that runs; --help stays fast
        from layerswap.experts.registry import (
            drop_rows_under,
            read_rows,
            registry_path,
            write_registry,
        )

        reg = registry_path(run_dir)
        with writing(folder):  # one writer per sweep folder
            put_back_rows(run_dir, folder)  # an old sweep moved back by hand: its rows first
            if folder.exists() and any(folder.iterdir()):  # its rows go aside with it
                mine = [r for r in read_rows(reg) if is_under(r["path"], folder)]
                write_registry(folder / ROWS_ASIDE, mine)
            try:
                with replacing([folder]):
                    drop_rows_under(reg, folder)
                    folder.mkdir(parents=True, exist_ok=True)
                    write_marker(folder, "train", experiment_identity(exp))
                    _record_data(exp, folder)  # what its trials train on, for --continue
                    yield
            except BaseException:
                put_back_rows(run_dir, folder)  # replacing put the old sweep back: its rows too
                raise

    return (resume(), True) if replaced and not overwrite else (run(), False)


def run_sweep_recorded(exp: TrainExperiment, run_dir: Path, verbose: bool = False, resume: bool = False) -> int:  # fmt: skip
    """An experiment with a `sweep:` block: the expert sweep (`resume`: the interrupted one in
    its folder, restored), its record (SWEEP_FINISHED) once it ran its course, then its top
    experts printed; both cover every trial of the sweep, those before a resume included.

    Returns:
        0 when every trial finished, 1 when some failed (their rows are still kept) or no
        checkpoint was scored (then it is not recorded finished: `--continue` resumes it).
    """
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.experts.sweep import run_sweep

    # Tune's verbosity: 1 is its default
    res = run_sweep(exp, run_dir, verbose=int(verbose), resume=resume)
    failed = sorted(t for t, s in res.trials.items() if s != "ok")
    if not res.rows:
        return _no_expert(exp, run_dir, res.trials, failed)
    # Ran its course (failed trials too: running it again would meet them again): `--continue`
    # skips it. Written inside the sweep's folder, which is kept only if the command ends here.
    record = {"identity": experiment_identity(exp), "trials": res.trials, "rows": len(res.rows)}
    record["registry"] = str(res.registry)
    record[DATA_KEY] = _recorded_data(run_dir / "train" / exp.name)  # as the sweep started
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


def _no_expert(exp: TrainExperiment, run_dir: Path, trials: dict, failed: list[str]) -> int:
    """A sweep that ran its course without scoring a checkpoint: not recorded finished (its
    searches would find no expert of it), one line on stderr naming its failed trials and what
    to run. Its folder and Tune state stay, so `--continue` resumes it: Tune's restore
    (experts/sweep_tuner.py make_tuner, resume_errored) runs each failed trial once more, from its
    newest checkpoint or, with none, from the start.

    Returns:
        1.
    """
    folder = run_dir / "train" / exp.name
    why = f"its trials {', '.join(failed)} failed (their errors are above)" if failed else "every checkpoint was left unscored (see above)"  # fmt: skip
    again = "; after fixing the cause, run it again with --continue (it retries the failed trials) or --overwrite (it starts over)" if failed else "; --overwrite runs it again"  # fmt: skip
    print(
        f"layerswap: expert sweep {exp.name}: {len(trials)} trials, no checkpoint scored, so no "
        f"expert registered and the sweep is not finished: {why}{again} ({folder})",
        file=sys.stderr,
    )
    return 1
