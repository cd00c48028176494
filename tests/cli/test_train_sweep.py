"""`train --continue` of an unfinished expert sweep whose experiment changed is refused in one
line naming what changed (as a plain run's refusal does: run.changes), read from a trial's
checkpoint manifest; the trial's own sampled parameters and seed are not counted as changes.
No Ray, no training: the sweep's folder is laid out by hand.

Run: .venv/bin/python -m pytest -q tests/cli/test_train_sweep.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerswap.cli.train_sweep import sweep_folder
from layerswap.spaces.train_experiment import experiment_identity, experiment_json, with_overrides
from layerswap.trainables.outputs import OutputError, write_marker
from layerswap.trainables.train.state import MANIFEST
from tests.trainables.train.train_helpers import make_exp

SWEEP = {"num_samples": 3, "params": {"hyper.lr": {"low": 1e-4, "high": 3e-3, "log": True}}}


def _sweep_run(tmp_path: Path, world: Path):
    """RUN with an unfinished sweep of `exp`: its marker, one trial with one checkpoint (its
    manifest records the trial's variant: its own lr and seed)."""
    exp = make_exp(world, name="sw", sweep=SWEEP)
    run = tmp_path / "run"
    folder = run / "train" / "sw"
    ck = folder / "trial_a" / "checkpoints" / "samples_000000016"
    ck.mkdir(parents=True)
    write_marker(folder, "train", experiment_identity(exp))
    variant = with_overrides(exp, {"hyper.lr": 0.0017, "hyper.seed": 123456})
    (ck / MANIFEST).write_text(json.dumps({"step": 2, "experiment": experiment_json(variant)}))
    return run, folder


def test_a_changed_sweep_is_refused_naming_what_changed(tmp_path):
    world = tmp_path / "world"
    run, folder = _sweep_run(tmp_path, world)
    more = make_exp(world, name="sw", sweep={**SWEEP, "num_samples": 5}, hyper={"max_steps": 30})
    with pytest.raises(OutputError) as e:
        sweep_folder(more, run, overwrite=False, cont=True)
    said = str(e.value)
    assert said.startswith(f"{folder}: holds an unfinished expert sweep of a different experiment (config changed); its checkpoints differ in hyper.max_steps 12 -> 30, sweep.num_samples 3 -> 5; a sweep resumes only as it started (num_samples"), said  # fmt: skip
    assert "hyper.lr" not in said and "hyper.seed" not in said and "\n" not in said
    assert "pass --overwrite" in said
