"""One expert trained where the caller asks: on Ray Train, or in this process (`--no-ray`).

`train_expert(exp, "runs/exp/train")` is what `layerswap train EXP.yaml` calls. Re-runs into an
existing run folder are explicit: one rule for a local folder and a run in a store alike
(`decide`, trainables/train/rerun_rule.py), which `rerun_plan` asks about a local folder.

Run its tests: .venv/bin/python -m pytest -q tests/trainables/train/test_uri_rerun.py
tests/cli/test_train.py
"""

from __future__ import annotations

import functools
import shutil
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

from layerswap.spaces.errors import RunFailed
from layerswap.spaces.train_experiment import (
    TrainExperiment,
    absolute_local_paths,
    experiment_identity,
    records_experiment,
)
from layerswap.trainables.data_fingerprint import resume_data_problem
from layerswap.trainables.output_checks import writable_inside
from layerswap.trainables.outputs import (
    MARKER,
    OutputError,
    OutputLocked,
    check_output,
    read_marker,
    replacing,
    write_marker,
    writing,
)
from layerswap.trainables.storage import is_uri, join
from layerswap.trainables.train import checkpoint_store as store
from layerswap.trainables.train.loop import run_training
from layerswap.trainables.train.progress import printer
from layerswap.trainables.train.rerun_rule import Rerun, changes, decide
from layerswap.trainables.train.state import (
    find_checkpoints,
    read_manifest,
    read_state,
    resume_point,
    resume_problem,
)
from layerswap.trainables.train.worker_count import one_worker, worker_hint


def last_checkpoint(run: Path) -> tuple[Path | None, bool]:
    """The run's last checkpoint and whether it is the final step's (the run finished)."""

    found = find_checkpoints(run) if run.is_dir() else []
    if not found:
        return None, False
    state = read_state(found[-1])
    return found[-1], state.get("total_steps") is not None and state["step"] >= state["total_steps"]


def continue_from(run: Path) -> Path | None:
    """The checkpoint a resumed run continues from: the newest whose resume state is intact.
    A damaged newer one is named on stderr and passed over; none intact is refused.

    Returns:
        the checkpoint, or None when the run has none yet (it starts from the beginning).
    Raises:
        ValueError naming the damaged file when no checkpoint keeps an intact resume state.
    """
    ckpt, skipped = resume_point(run)
    if not skipped:
        return ckpt
    if ckpt is None:
        raise ValueError(
            f"{skipped[0]}; no earlier checkpoint keeps its resume state (`resume_state: all` "
            "keeps every checkpoint's); pass --overwrite to start the run over"
        )
    print(f"layerswap: {skipped[0]}; resuming from the previous intact checkpoint {ckpt}", file=sys.stderr)  # fmt: skip
    return ckpt


def run_started(run: Path | str) -> bool:
    """Whether the run folder (a local one, or a run's URI in a store) holds anything: a run to
    continue (or refuse), not a fresh one."""
    if is_uri(run):
        return store.run_started(str(run))
    run = Path(run)
    return run.exists() and not (run.is_dir() and not any(run.iterdir()))


# What an expert sweep keeps in its folder (mirrors experts/sweep_tuner.TUNER_FILE and
# cli/train_sweep.SWEEP_FINISHED; tests/cli/test_train.py pins both): Tune's
# state, which its `--continue` resumes from, is worth keeping although no checkpoint is there.
SWEEP_FILES = ("tuner.pkl", "sweep_finished.json")


def _holds_sweep(run: Path) -> bool:
    return any((run / name).exists() for name in SWEEP_FILES)


def rerun_plan(exp: TrainExperiment, run: Path, *, resume: bool, overwrite: bool) -> Rerun:
    """What to do with the local run folder `run` (storage/<name>) of `exp`, or why not
    (`decide`: the rule). Which experiment the folder holds is what its newest checkpoint's
    manifest records, compared as Ray's workers compare it (records_experiment), so the driver
    never plans a resume the workers pass over; before any checkpoint, its marker's identity.

    Args:
        exp: the experiment as it will be trained (`--no-ray`: on 1 worker, worker_count.one_worker).
    """

    @functools.cache
    def newest() -> tuple[Path, dict] | None:
        """The newest checkpoint and its manifest, read once for every question below."""
        found = find_checkpoints(run)
        return (found[-1], read_manifest(found[-1])) if found else None

    def same() -> bool:
        if (ckpt := newest()) is not None:
            return records_experiment(ckpt[1], exp)
        return (read_marker(run) or {}).get("identity") == experiment_identity(exp)

    def changed() -> str:
        if (ckpt := newest()) is None:
            return ""
        path, manifest = ckpt
        old = manifest.get("experiment") or {}
        return changes(old, exp) + worker_hint(old, exp, path.parent.name == "checkpoints")

    def data() -> str | None:
        ckpt = newest()
        return resume_data_problem(exp, ckpt[1]) if ckpt is not None else None

    return decide(
        str(run),
        started=run_started(run),
        check=lambda: check_output(run, "train", overwrite=True),
        same=same,
        saved=lambda: newest() is not None or _holds_sweep(run),  # a sweep: --overwrite
        last=lambda: last_checkpoint(run),
        changed=changed,
        data=data,
        resume=resume,
        overwrite=overwrite,
    )


def train_expert(exp: TrainExperiment, storage: str, *, use_ray: bool = True, resume: bool | Path = False, overwrite: bool = False, verbose: bool = False) -> Path | str | None:  # fmt: skip
    """Train one expert into `storage/<name>/` and return its last checkpoint dir (a URI when
    `storage` is one). A local folder and a store (s3://, gs://, file://) follow one rerun rule
    (`decide`); a store run's second writer is refused on this host only, except for file://
    (trainables/train/checkpoint_store.py says why).

    Args:
        storage: Ray storage path (local folder or cloud URI; local only with use_ray=False).
        use_ray: train on Ray Train (else in this process, 1 worker).
        resume: continue the unfinished run in `storage/<name>/` (True), or, without Ray, from
            this checkpoint folder (a Path).
        overwrite: start over; the old run is set aside and dropped once the new one finishes
            (in a store: kept where it is while the new one runs in a fresh Ray run beside it).
        verbose: on Ray, also Ray's own output (its workers' and controller's logs, its
            notices); either way a progress line is printed (trainables/train/progress.py).
    """

    if not use_ray and is_uri(storage):
        raise ValueError(f"storage_path {storage}: --no-ray writes local folders only")
    if use_ray and isinstance(resume, Path):
        raise ValueError("--resume CKPT is for --no-ray; Ray resumes its own run (--resume)")
    # What a worker records in its manifests, which the rerun decision compares with: Ray's
    # workers record local paths made absolute (ray_train.trainer_for); a caller's relative ones
    # would make every rerun "a different experiment".
    exp = absolute_local_paths(exp)
    if not use_ray:  # before the rerun decision: the run is of what it trains
        exp = one_worker(exp)
    if is_uri(storage):  # a store: the same rules, its marker and checkpoints read there
        with _store_writer(join(storage, exp.name)):
            return _train_in_store(exp, storage, bool(resume), overwrite, verbose)
    run = Path(storage) / exp.name
    with writing(run):  # one writer per run: a second `train` of it is refused, naming this one
        return _train_local(exp, run, storage, use_ray, resume, overwrite, verbose)


def _train_local(exp: TrainExperiment, run: Path, storage: str, use_ray: bool, resume: bool | Path, overwrite: bool, verbose: bool) -> Path | str | None:  # fmt: skip
    """`train_expert` into a local run folder whose lock this process holds."""
    if isinstance(resume, Path) and not run.exists():
        plan = "fresh"  # a new run started from a checkpoint of another
    else:
        plan = rerun_plan(exp, run, resume=bool(resume), overwrite=overwrite)
    if plan == "done":
        ckpt, _ = last_checkpoint(run)
        print(f"{run}: this experiment is already trained; nothing to do")
        return ckpt
    if plan != "replace" and (problem := writable_inside(run)) is not None:
        raise OutputError(problem)  # a read-only run folder: refused now, not at its first write
    start = resume if isinstance(resume, Path) else None
    if isinstance(resume, Path) and (problem := resume_problem(resume)) is not None:
        raise ValueError(f"--resume {resume}: {problem}")
    if plan == "resume":
        newest_intact = continue_from(run)  # checked here, before the run is marked again
        if not use_ray:  # Ray's workers pick the same one (ray_train._newest)
            start = newest_intact
    if use_ray:
        _ray_ready(exp, verbose, run)
    fresh = not run.exists()
    with replacing([run]) if plan == "replace" else nullcontext():
        run.mkdir(parents=True, exist_ok=True)
        write_marker(run, "train", experiment_identity(exp))
        try:
            return _train(exp, storage, use_ray, start, verbose)
        except ValueError as e:
            if fresh and use_ray:
                # lazy: imports Ray, which a --no-ray run does not load
                from layerswap.trainables.node_paths import NodePathError

                if isinstance(e, NodePathError):  # a worker's node check: nothing was trained
                    shutil.rmtree(run, ignore_errors=True)
            raise


@contextmanager
def _store_writer(run_uri: str) -> Iterator[None]:
    """Hold the one-writer lock of a run in a store (store.writer_lock: on this host only,
    except for file://), or refuse naming the run and its writer."""
    lock = store.writer_lock(run_uri)
    stack = ExitStack()
    try:
        stack.enter_context(writing(lock))
    except OutputLocked as e:
        raise OutputLocked(
            str(e) if store.scheme(run_uri) == "file" else f"{run_uri}: {e}"
        ) from None
    with stack:
        yield


def _train_in_store(exp: TrainExperiment, storage: str, resume: bool, overwrite: bool, verbose: bool) -> str | None:  # fmt: skip
    """`train_expert` into a run in a store (see trainables/train/checkpoint_store.py for its
    layout), whose writer lock this process holds: the rule a local run follows (`decide`)."""
    run = join(storage, exp.name)
    old = store.read_store_marker(run)
    gen = (old or {}).get("generation") or ""
    folder = join(run, gen) if gen else run

    def check() -> None:
        if old is None and not store.checkpoints(run):  # no marker, and no checkpoint names one
            raise OutputError(
                f"{run}: exists and was not written by layerswap (no {MARKER}); refusing to "
                "replace it: remove it yourself or choose another storage_path"
            )

    def changed() -> str:
        found = store.checkpoints(folder)
        return changes(found[-1][1].get("experiment") or {}, exp) if found else ""

    def data() -> str | None:
        found = store.checkpoints(folder)
        return resume_data_problem(exp, found[-1][1]) if found else None

    want = experiment_identity(exp)
    # a generation (an --overwrite's) may sit beside older checkpoints: only a first run counts
    # as having saved none
    plan = decide(run, started=store.run_started(run), check=check, same=lambda: store.stored_identity(run, old) == want, saved=lambda: bool(gen or store.checkpoints(run)), last=lambda: store.last_checkpoint(folder), changed=changed, data=data, resume=resume, overwrite=overwrite)  # fmt: skip
    if plan == "done":
        ckpt, _ = store.last_checkpoint(folder)
        print(f"{run}: this experiment is already trained; nothing to do")
        return ckpt
    _ray_ready(exp, verbose)
    gen, replaces = _generation(plan, old)
    store.write_store_marker(run, store.new_marker(want, gen, replaces))
    try:
        where, name = store.ray_run(run, gen)
        last = _train(exp, where, True, None, verbose, name=name)
    except BaseException:
        if plan == "replace":  # as outputs.replacing: the old run is put back
            store.delete_generation(run, gen)
            if old is not None:
                store.write_store_marker(run, old)
            else:
                store.delete_marker(run)
        raise
    if replaces is not None:  # the new run finished: the old one goes (and any leftovers)
        store.delete_except(run, {MARKER, gen})
        store.write_store_marker(run, store.new_marker(want, gen))
    return last


def _generation(plan: Rerun, old: dict | None) -> tuple[str, str | None]:
    """Where Ray's run of a store run lives for `plan`, and the run it replaces (None: none).

    A new run starts in the run folder itself; --overwrite starts a fresh Ray run in a new
    subfolder (no rename in an object store, and ~100 GB checkpoints are not copied aside); a
    resumed replacement still replaces what its marker names.
    """
    if plan == "replace":
        return f"gen-{uuid.uuid4().hex[:8]}", (old or {}).get("generation") or "."
    if plan == "resume":
        return (old or {}).get("generation") or "", (old or {}).get("replaces")
    return "", None


def _ray_ready(exp: TrainExperiment, verbose: bool, run: Path | None = None) -> None:
    """Start Ray and refuse inputs (and the local run folder `run`) some node does not see,
    before the run is written to."""
    # lazy: Ray loads only for a run that uses it (`--no-ray` trains in this process)
    from layerswap.trainables.train.ray_train import start_ray

    start_ray(exp, verbose, run)


def _train(exp: TrainExperiment, storage: str, use_ray: bool, start: Path | None, verbose: bool, name: str | None = None) -> Path | str | None:  # fmt: skip
    """Run the training itself (Ray restores its own run from `storage`/`name`, default
    exp.name, when there is one), printing progress lines (trainables/train/progress.py)."""
    if not use_ray:  # exp is on one worker already (train_expert)
        res = run_training(
            exp,
            workdir=Path(storage) / exp.name,
            resume_from=start,
            report=printer(),  # the progress lines, as on Ray
        )
        return res.final_checkpoint
    # lazy: Ray loads only for a run that uses it (`--no-ray` trains in this process)
    from layerswap.trainables.train.ray_train import train_with_ray

    res = train_with_ray(exp, storage_path=storage, name=name, progress=True, verbose=verbose)
    if res.error is not None:
        # After failure.max_failures restarts: a failure to report (exit 1), not a traceback.
        raise RunFailed(f"training failed: {res.error}")
    return res.checkpoint
