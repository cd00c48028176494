"""A training run in cloud storage (s3://, gs://, file://), read and written through pyarrow.fs,
so that a run there follows the rules a local run folder does (trainables/train/run.py).

Layout of STORAGE/<name>/ (the run):
- `.layerswap.json`, the marker, as in a local run folder (trainables/outputs.py): kind "train",
  the experiment's identity, and `generation`: where Ray's run lives. "" is the run folder
  itself (every run that no --overwrite replaced); `gen-<tag>` is a subfolder that an
  --overwrite starts in. An object store has no rename, and copying aside ~100 GB checkpoints
  is no option, so the new run gets a fresh Ray run there instead: Ray restores nothing of the
  old one, and the old one is deleted only once the new one finishes (`replaces` names it
  meanwhile; a failed or interrupted new run is removed and the old marker put back).
- Ray's run: checkpoint folders (each with its manifest, trainables/train/state.py) and Ray's own
  bookkeeping (checkpoint_manager_snapshot.json, .validate_storage_marker).

One writer: `writer_lock` is a lock on the driver's host (flock, trainables/locks.py). An object
store has no atomic create-if-absent that pyarrow offers, so two drivers on different hosts
writing one s3:// or gs:// run are not detected; a file:// run is locked beside its folder, as a
local run is.

Run its tests: .venv/bin/python -m pytest -q tests/trainables/train/test_uri_rerun.py
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath

from layerswap.spaces.train_experiment import (
    TrainExperiment,
    experiment_identity,
    records_experiment,
)
from layerswap.trainables.merge.checkpoint import CheckpointError
from layerswap.trainables.outputs import MARKER, marker
from layerswap.trainables.storage import cache_dir, filesystem, join, read_text, scheme

MANIFEST = "layerswap_train.json"  # trainables.train.state.MANIFEST (that module imports torch)
STATE_DIR = "trainer_state"
STATE = f"{STATE_DIR}/state.json"


__all__ = ["scheme"]  # re-exported for the callers' messages


def writer_lock(run_uri: str) -> Path:
    """The local path whose lock (`outputs.writing`) the one writer of `run_uri` holds: a
    file:// run's own folder; else a name in the cache (per URI and S3 endpoint), which keeps out
    a second writer on this host only."""
    _, path = filesystem(run_uri)
    if scheme(run_uri) == "file":
        return Path(path)
    where = "\0".join([run_uri.rstrip("/"), os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""])  # fmt: skip
    tag = hashlib.sha256(where.encode()).hexdigest()[:20]
    return cache_dir() / "run-locks" / f"{tag}-{PurePosixPath(path).name[:40]}"


def _entries(uri: str) -> list:
    """pyarrow FileInfo of the entries directly in the folder `uri` ([] when there is none)."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return []
    return fs.get_file_info(pafs.FileSelector(path, recursive=False))


def run_started(run_uri: str) -> bool:
    """Whether the run folder in the store holds anything (an object store has no empty folder)."""
    return bool(_entries(run_uri))


def read_store_marker(run_uri: str) -> dict | None:
    """The run's marker, or None when layerswap did not write one (or it is unreadable)."""
    try:
        m = json.loads(read_text(join(run_uri, MARKER)))
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("kind") == "train" else None


def write_store_marker(run_uri: str, m: dict) -> None:
    """Write the run's marker: one object put (whole or absent), atomically renamed for file://."""
    import pyarrow.fs as pafs

    fs, path = filesystem(run_uri)
    data = (json.dumps(m, indent=1) + "\n").encode("utf-8")
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(path, recursive=True)
        tmp = f"{path}/.{MARKER}.tmp-{os.getpid()}"
        with fs.open_output_stream(tmp) as f:
            f.write(data)
        fs.move(tmp, f"{path}/{MARKER}")
        return
    with fs.open_output_stream(f"{path}/{MARKER}") as f:
        f.write(data)


def delete_marker(run_uri: str) -> None:
    """Remove the run's marker (a run written before URI runs were marked goes back to none)."""
    fs, path = filesystem(join(run_uri, MARKER))
    if _exists(fs, path):
        fs.delete_file(path)


def new_marker(identity: str, generation: str, replaces: str | None = None) -> dict:
    """The marker of a run of `identity` whose Ray run lives in `generation` (see module doc)."""
    m = marker("train", identity) | {"generation": generation}
    return m | ({"replaces": replaces} if replaces is not None else {})


def ray_run(run_uri: str, generation: str) -> tuple[str, str]:
    """(storage_path, name) of Ray's run for a generation of the run `run_uri`."""
    if not generation:
        parent, _, name = run_uri.rstrip("/").rpartition("/")
        return parent, name
    return run_uri, generation


def _uploaded(uri: str, m: dict) -> bool:
    """Whether every model file the manifest lists is in the store at its size. Ray uploads a
    checkpoint's files in no fixed order (one by one in listing order on S3, in parallel on
    gs:// and file://), so the manifest may arrive before the weights. A manifest written before
    it listed its files is taken at its word."""
    import pyarrow.fs as pafs

    files = m.get("files")
    if not isinstance(files, dict):
        return True
    fs, path = filesystem(uri)
    infos = fs.get_file_info([f"{path}/{rel}" for rel in files])
    return all(
        i.type == pafs.FileType.File and i.size == size
        for i, size in zip(infos, files.values(), strict=True)
    )


def checkpoints(folder_uri: str) -> list[tuple[str, dict]]:
    """The complete checkpoints directly in a Ray run folder, oldest first: (URI, manifest).
    Complete: its manifest and every model file it lists, at its size, are in the store."""
    import pyarrow.fs as pafs

    found = []
    for info in _entries(folder_uri):
        if info.type != pafs.FileType.Directory or PurePosixPath(info.path).name.startswith("."):
            continue
        uri = join(folder_uri, PurePosixPath(info.path).name)
        try:
            m = json.loads(read_text(join(uri, MANIFEST)))
        except (OSError, ValueError):
            continue  # not a checkpoint, or one whose upload did not finish
        if isinstance(m, dict) and isinstance(m.get("step"), int) and _uploaded(uri, m):
            found.append((uri, m))
    return sorted(found, key=lambda c: (c[1]["step"], c[0]))


def stored_identity(run_uri: str, m: dict | None) -> str | None:
    """The identity of the experiment the run holds: its marker's, else (a run written before
    URI runs were marked) its newest checkpoint's manifest's; None when neither says."""
    if m is not None:
        return m.get("identity")
    found = checkpoints(run_uri)
    return experiment_identity(found[-1][1].get("experiment") or {}) if found else None


def last_checkpoint(folder_uri: str) -> tuple[str | None, bool]:
    """The newest checkpoint of a Ray run folder and whether the run finished (its step is the
    last), as run.last_checkpoint says of a local one."""
    found = checkpoints(folder_uri)
    if not found:
        return None, False
    try:
        state = json.loads(read_text(join(found[-1][0], STATE)))
    except (OSError, ValueError):
        return found[-1][0], False
    total = state.get("total_steps")
    return found[-1][0], total is not None and state.get("step", 0) >= total


def delete_except(run_uri: str, keep: set[str]) -> None:
    """Delete every entry directly in the run folder whose name is not in `keep`."""
    import pyarrow.fs as pafs

    fs, _ = filesystem(run_uri)
    for info in _entries(run_uri):
        if PurePosixPath(info.path).name in keep:
            continue
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(info.path)
        else:
            fs.delete_file(info.path)


def delete_generation(run_uri: str, generation: str) -> None:
    """Delete a generation's Ray run: a subfolder of the run (never "", the run itself)."""
    if generation:
        fs, path = filesystem(join(run_uri, generation))
        if _exists(fs, path):
            fs.delete_dir(path)


def _exists(fs, path: str) -> bool:
    import pyarrow.fs as pafs

    return fs.get_file_info(path).type != pafs.FileType.NotFound


def drop_older_resume_state(folder_uri: str) -> int:
    """`resume_state: newest` in the store: every checkpoint of a Ray run folder but the newest
    loses its resume state (AdamW moments, fp32 masters, FSDP's shards: ~6x the weights), as
    state.drop_resume_state does on disk; its state.json says so first, so a stop halfway
    leaves a checkpoint that says it cannot be resumed, never one resumed with half its state.

    Returns:
        the number of objects deleted.
    """
    import pyarrow.fs as pafs

    fs, _ = filesystem(folder_uri)
    deleted = 0
    for uri, _m in checkpoints(folder_uri)[:-1]:
        _, sd = filesystem(join(uri, STATE_DIR))
        try:
            state = json.loads(read_text(join(uri, STATE)))
        except (OSError, ValueError):
            continue
        files = [i for i in fs.get_file_info(pafs.FileSelector(sd, recursive=True, allow_not_found=True)) if i.type == pafs.FileType.File]  # fmt: skip
        doomed = [i.path for i in files if PurePosixPath(i.path).name != "state.json"]
        if not doomed and not state.get("resumable", True):
            continue
        if state.get("resumable", True):
            with fs.open_output_stream(f"{sd}/state.json") as f:
                f.write(json.dumps({**state, "resumable": False}, indent=1, sort_keys=True).encode())  # fmt: skip
        for p in doomed:
            fs.delete_file(p)
        deleted += len(doomed)
        if _exists(fs, f"{sd}/dcp"):
            fs.delete_dir(f"{sd}/dcp")
    return deleted


def check_restored(exp: TrainExperiment, restored: str, where: str) -> None:
    """Refuse a checkpoint Ray restored that another experiment wrote (the driver checks the
    run's marker first, trainables/train/run.py; this is the worker's own check of what it got).

    Raises:
        CheckpointError naming the checkpoint: continuing it would train another experiment's
        weights and optimizer state under this one's name.
    """
    try:
        recorded = json.loads((Path(restored) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # no manifest: nothing says whose it is
        raise CheckpointError(f"{where}: Ray restored it, but it has no readable {MANIFEST} ({e})") from None  # fmt: skip
    recorded = (recorded.get("experiment") if isinstance(recorded, dict) else None) or {}
    if not records_experiment({"experiment": recorded}, exp):
        raise CheckpointError(
            f"{where}: Ray restored a checkpoint of another experiment (its manifest's identity "
            f"{experiment_identity(recorded)}, this one's {experiment_identity(exp)}); refusing "
            "to continue it: pass --overwrite to start over"
        )


def drop_older_in_store(store_run: str, rank: int, world: int) -> None:
    """`resume_state: newest` in a store: once every rank's upload of a checkpoint is done, rank
    0 strips the older checkpoints' resume state there (Ray's own upload has no hook for it)."""
    if world > 1:
        # lazy: torch.distributed only in a worker of a multi-worker group
        import torch.distributed as dist

        dist.barrier()  # every rank reported (and uploaded) this checkpoint
    if rank == 0:
        drop_older_resume_state(store_run)
