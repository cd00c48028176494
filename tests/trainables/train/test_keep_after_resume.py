"""`keep_checkpoints` and `resume_state: newest` hold for a run's whole checkpoints folder after a
resume, not only for the checkpoints the resumed process wrote: a run that dies after its third
checkpoint and is resumed in-process (what `train --no-ray --resume` and an in-process sweep
trial do) ends with the newest N checkpoints, only the newest keeping its optimizer state.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_keep_after_resume.py   (~15 s)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from layerswap.trainables.train import run_training
from layerswap.trainables.train.run import continue_from
from layerswap.trainables.train.state import STATE_DIR, resume_problem
from tests.trainables.train.train_helpers import make_exp


def _left(folder: Path) -> dict[str, bool]:
    """Checkpoint name -> whether it still holds AdamW state, read from the files."""
    return {
        p.name: any((p / STATE_DIR).glob("optimizer__*.safetensors"))
        for p in sorted(folder.iterdir())
        if p.name.startswith("samples_")
    }


def test_keep_rules_count_checkpoints_written_before_a_resume(tiny_world, tmp_path):
    work = tmp_path / "run"
    over = {"checkpoint_every_samples": 16, "keep_checkpoints": 2}
    fail = {"fail_at_step": 7, "fail_marker": str(tmp_path / "failed")}
    with pytest.raises(RuntimeError, match="injected failure at step 7"):
        run_training(make_exp(tiny_world, **over, debug=fail), workdir=work)
    left = _left(work / "checkpoints")
    assert left == {"samples_000000032": False, "samples_000000048": True}

    start = continue_from(work)
    assert start is not None and start.name == "samples_000000048"

    def report(metrics: dict, path: Path | None) -> None:
        if path is None:
            return
        # The moment a checkpoint is reported: at most keep_checkpoints in the folder, and the
        # newest one whole and resumable (the resume point went only after a newer one was).
        now = _left(work / "checkpoints")
        assert len(now) <= 2 and max(now) == path.name and now[path.name]
        assert resume_problem(path) is None

    run_training(make_exp(tiny_world, **over), workdir=work, resume_from=start, report=report)
    assert _left(work / "checkpoints") == {"samples_000000080": False, "samples_000000096": True}


def test_later_checkpoints_of_an_earlier_resume_point_are_left_alone(tiny_world, tmp_path):
    # Resumed from an earlier checkpoint (resume_state: all keeps its state), the run's later
    # checkpoints are not "older" than the ones it writes now: each is rewritten when reached.
    work = tmp_path / "run"
    run_training(
        make_exp(tiny_world, checkpoint_every_samples=32, resume_state="all"), workdir=work
    )
    assert list(_left(work / "checkpoints")) == [f"samples_{s:09d}" for s in (32, 64, 96)]
    seen = []

    def report(metrics: dict, path: Path | None) -> None:
        if path is not None:
            seen.append(list(_left(work / "checkpoints")))

    mid = work / "checkpoints/samples_000000032"
    exp = make_exp(tiny_world, checkpoint_every_samples=32, keep_checkpoints=1)
    run_training(exp, workdir=work, resume_from=mid, report=report)
    # At 64: 32 went (a newer whole checkpoint exists), 96 stays until the run rewrites it.
    assert seen == [["samples_000000064", "samples_000000096"], ["samples_000000096"]]
