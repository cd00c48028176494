"""The Tune side of an expert sweep without a Ray cluster: what a resume needs in the sweep's
folder (missing or unreadable: one line), and the registry rows of trials a resumed sweep's Tune
state never named taken out.

Run: .venv/bin/python -m pytest -q tests/experts/test_sweep_tuner.py
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from layerswap.experts.registry import append_rows, expert_id, read_rows, registry_path
from layerswap.experts.sweep_tuner import (
    SweepStateError,
    drop_untracked_rows,
    make_tuner,
    restore_problem,
)


def _row(folder: Path, trial: str) -> dict:
    ck = folder / trial / "checkpoints" / "samples_000000008"
    ck.mkdir(parents=True)
    return {"expert_id": expert_id("sw", trial, 2), "kind": "math", "language": "en", "mode": "full",
            "path": str(ck), "base": "b", "trial_id": trial, "step": 2, "samples": 8, "seed": 0,
            "hparams": "{}"}  # fmt: skip


def test_restore_needs_the_tuner_and_an_experiment_state(tmp_path):
    assert "tuner.pkl, experiment_state-*.json" in restore_problem(tmp_path)
    (tmp_path / "tuner.pkl").write_bytes(b"x")
    assert restore_problem(tmp_path) == "its Ray Tune state (experiment_state-*.json) is missing"
    (tmp_path / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
    assert restore_problem(tmp_path) is None


def test_rows_of_trials_the_resumed_sweep_does_not_know_are_taken_out(tmp_path, capsys):
    run = tmp_path / "run"
    folder, other = run / "train" / "sw", run / "train" / "other"
    reg = registry_path(run)
    append_rows(reg, [_row(folder, "a"), _row(folder, "lost"), _row(other, "x")])
    assert drop_untracked_rows(reg, folder, {"a", "b"}) == [str(folder / "lost")]
    assert sorted(r["trial_id"] for r in read_rows(reg)) == ["a", "x"]  # another sweep's stay
    assert (folder / "lost").is_dir()  # its checkpoints are kept
    assert f"{folder / 'lost'}" in capsys.readouterr().err


def test_an_unreadable_tune_state_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "sw"
    folder.mkdir()
    (folder / "tuner.pkl").write_bytes(b"not a pickle")  # e.g. cut mid-write on a full disk
    (folder / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
    setup = SimpleNamespace(storage=str(tmp_path))
    with pytest.raises(SweepStateError) as e:
        make_tuner(setup, lambda config: None, "sw", tmp_path / "r.parquet", max_failures=0, verbose=0, resume=True)  # fmt: skip
    said = str(e.value)
    assert said.startswith(f"{folder}: an expert sweep of sw did not finish and cannot be resumed: its Ray Tune state cannot be read")  # fmt: skip
    assert "pass --overwrite" in said and "\n" not in said
