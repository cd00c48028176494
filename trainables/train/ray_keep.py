"""`keep_checkpoints` on Ray's local run folder for the checkpoints Ray does not know of.

Ray deletes the checkpoints its controller registered (CheckpointConfig.num_to_keep) and refuses
to restore a run whose snapshot names one that is gone, so layerswap must not delete those. But
a driver interrupted before Ray's controller took in a checkpoint's report (it polls every ~2 s)
leaves a checkpoint Ray's snapshot does not name; the resumed run continues from it
(ray_train._resume_point), and Ray would never delete it: keep_checkpoints 2 left 3. Those
checkpoints, found by the driver before the run starts, are pruned here by the rule the plain
loop applies to its folder (state.checkpoints_up_to): the newest N of the folder stay.

Run its tests: .venv/bin/python -m pytest -q tests/trainables/train/test_ray_keep.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from layerswap.trainables.train.state import checkpoints_up_to, samples_of

SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's (CHECKPOINT_MANAGER_SNAPSHOT_FILENAME)


def untracked_checkpoints(run_dir: Path) -> list[str]:
    """The checkpoint folders in `run_dir` that Ray's snapshot does not name; read by the driver
    before the run starts (with no controller running, the snapshot cannot change meanwhile).

    Args:
        run_dir: Ray's local run folder (storage_path/name).
    Returns:
        folder names, by samples ([] when there is no folder).
    """
    if not run_dir.is_dir():
        return []
    try:
        snapshot = json.loads((run_dir / SNAPSHOT).read_text())
    except (OSError, ValueError):  # no snapshot (or none readable): Ray restores nothing
        snapshot = None
    known = set(_dir_names(snapshot))
    if snapshot is not None and not known:
        # Ray writes its snapshot only once it has registered a checkpoint, so one naming none
        # is a format this does not read (a newer Ray): prune nothing rather than Ray's own.
        return []
    found = [p.name for p in run_dir.iterdir() if p.is_dir() and samples_of(p.name) is not None]
    return sorted((n for n in found if n not in known), key=samples_of)


def _dir_names(node) -> list[str]:
    """Every `checkpoint_dir_name` anywhere in the snapshot's JSON (kept, latest, pending)."""
    if isinstance(node, dict):
        own = [node["checkpoint_dir_name"]] if isinstance(node.get("checkpoint_dir_name"), str) else []  # fmt: skip
        return own + [n for v in node.values() for n in _dir_names(v)]
    if isinstance(node, list):
        return [n for v in node for n in _dir_names(v)]
    return []


def untracked_up_to(untracked: list[str], resume: str | Path | None) -> list[str]:
    """Those of `untracked` at or before the checkpoint an attempt resumes from: a later one is
    rewritten by this run (and Ray then knows it). None when it starts fresh, or when the
    resume point's name gives no samples count (prune nothing rather than guess).

    Args:
        untracked: names from untracked_checkpoints.
        resume: the checkpoint folder the attempt resumes from, or None.
    """
    cap = samples_of(Path(resume).name) if resume is not None else None
    return [] if cap is None else [n for n in untracked if samples_of(n) <= cap]


def prune_untracked(newest: Path, keep: int | None, untracked: list[str]) -> list[str]:
    """Once `newest` is uploaded whole: delete the `untracked` checkpoints that fall outside
    the folder's newest `keep` (Ray deletes its own).

    Args:
        newest: the checkpoint folder just written into the run folder.
        keep: keep_checkpoints (None: keep all).
        untracked: names from untracked_checkpoints, only those at or before the checkpoint this
            attempt resumed from (a later one is rewritten by this run, and Ray then knows it).
    Returns:
        the names deleted.
    """
    if keep is None:
        return []
    older = checkpoints_up_to(newest)[:-keep]
    gone = [p for p in older if p.name in untracked]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return [p.name for p in gone]
