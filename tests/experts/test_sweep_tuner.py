"""The Tune side of an expert sweep without Ray: what a resume needs in the sweep's folder, and
the registry rows of trials a resumed sweep's Tune state never named taken out.

Run: .venv/bin/python -m pytest -q tests/experts/test_sweep_tuner.py
"""

from __future__ import annotations

from pathlib import Path

from layerswap.experts.registry import append_rows, expert_id, read_rows, registry_path
from layerswap.experts.sweep_tuner import drop_untracked_rows, restore_problem


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
