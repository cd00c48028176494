"""keep_checkpoints on Ray counts a checkpoint Ray never registered: a driver interrupted before
Ray's controller took in a checkpoint's report leaves it out of Ray's snapshot; the resumed run
continues from it, and it is pruned like any other once newer ones are whole (it stayed: keep 2
left 3 checkpoints). Checkpoints Ray knows of are left to Ray (its restore refuses a snapshot
naming a deleted one).

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_ray_keep.py   (~1 min: two Ray fits)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerswap.spaces.train_experiment import parse_train_experiment
from layerswap.trainables.train.ray_keep import (
    SNAPSHOT,
    prune_untracked,
    untracked_checkpoints,
    untracked_up_to,
)


def _names(*samples: int) -> list[str]:
    return [f"samples_{s:09d}" for s in samples]


def _folders(run: Path, *samples: int) -> None:
    for name in _names(*samples):
        (run / name).mkdir(parents=True)


def test_untracked_are_the_checkpoints_rays_snapshot_does_not_name(tmp_path):
    run = tmp_path / "run"
    _folders(run, 16, 32, 48, 64)
    (run / ".samples_000000080.tmp-1-x").mkdir()  # a cut upload: not a checkpoint
    assert untracked_checkpoints(run) == _names(16, 32, 48, 64)  # no snapshot: Ray knows none
    snap = {"checkpoint_results": [{"checkpoint_dir_name": n} for n in _names(32, 48)]}
    snap["latest_checkpoint_result"] = {"checkpoint_dir_name": _names(48)[0]}
    (run / SNAPSHOT).write_text(json.dumps(snap))
    assert untracked_checkpoints(run) == _names(16, 64)
    assert untracked_checkpoints(tmp_path / "none") == []


def test_the_snapshot_mirrored_is_rays_and_an_unread_one_prunes_nothing(tmp_path):
    """ray_keep reads a private file of Ray Train (pinned here: a rename fails this test); a
    snapshot in a format it cannot read must never make Ray's own checkpoints look untracked."""
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    assert SNAPSHOT == CHECKPOINT_MANAGER_SNAPSHOT_FILENAME
    run = tmp_path / "run"
    _folders(run, 16, 32)
    (run / SNAPSHOT).write_text(json.dumps({"results": [{"dir": n} for n in _names(16, 32)]}))
    assert untracked_checkpoints(run) == []


def test_an_attempt_prunes_only_untracked_checkpoints_up_to_its_resume_point(tmp_path):
    names = _names(16, 32, 64)
    assert untracked_up_to(names, tmp_path / _names(32)[0]) == _names(16, 32)
    assert untracked_up_to(names, None) == []  # a fresh start resumes from nothing
    assert untracked_up_to(names, tmp_path / "tmpa1b2c3") == []  # a name telling no samples


def test_prune_untracked_deletes_only_untracked_outside_the_newest(tmp_path):
    run = tmp_path / "run"
    _folders(run, 32, 48, 64, 80, 96)
    gone = prune_untracked(run / _names(96)[0], 2, _names(32, 64, 80))
    # 32, 48 and 64 fall outside the newest two; 48 is Ray's to delete, 80 is kept
    assert gone == _names(32, 64)
    assert sorted(p.name for p in run.iterdir()) == _names(48, 80, 96)
    assert prune_untracked(run / _names(96)[0], None, _names(80)) == []


@pytest.mark.slow
def test_resumed_ray_run_prunes_the_checkpoint_ray_never_registered(tiny_world, tmp_path, ray_session):  # fmt: skip
    from layerswap.trainables.train.ray_train import train_with_ray

    cfg = {
        "name": "keep",
        "base": str(tiny_world / "base"),
        "kind": "math",
        "language": "en",
        "datasets": [{"path": str(tiny_world / "data/sft/math_en.jsonl")}],
        "mode": "full",
        "hyper": {"lr": 3e-3, "batch_size": 8, "max_steps": 14, "seq_len": 96},
        "checkpoint_every_samples": 16,
        "keep_checkpoints": 2,
        "storage_path": str(tmp_path / "store"),
        "failure": {"max_failures": 0},
        # 0-based step 8: the run fails for good after its checkpoint at samples 64
        "debug": {"fail_at_step": 8, "fail_marker": str(tmp_path / "failed")},
    }
    exp = parse_train_experiment(cfg)
    assert train_with_ray(exp).error is not None
    run = tmp_path / "store/keep"
    assert sorted(p.name for p in run.glob("samples_*")) == _names(48, 64)
    # What a driver interrupted before Ray's controller took in the report of samples 64 leaves
    # (seen with SIGTERM): Ray's snapshot ends at 48, and 64 is on disk.
    snap = json.loads((run / SNAPSHOT).read_text())
    keep = [i for i, r in enumerate(snap["checkpoint_results"]) if r["checkpoint_dir_name"] != _names(64)[0]]  # fmt: skip
    for k in ("checkpoint_results", "checkpoint_report_indices"):
        snap[k] = [snap[k][i] for i in keep]
    snap["latest_checkpoint_result"] = snap["checkpoint_results"][-1]
    (run / SNAPSHOT).write_text(json.dumps(snap))

    res = train_with_ray(exp)  # the marker is there: this one does not fail
    assert res.error is None and res.metrics["step"] == 14
    left = sorted(p.name for p in run.glob("samples_*"))
    assert left == _names(96, 112)  # 64, the resume point, went once 80 and 96 were whole
    optim = [p.name for p in run.glob("samples_*") if any(p.glob("trainer_state/optimizer__*"))]
    assert optim == _names(112)
