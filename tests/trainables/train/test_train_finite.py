"""Training that turns non-finite stops at the step, names it, and saves nothing non-finite;
a base with a NaN weight is refused by tensor before the first step (trainables/train/finite.py).

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_train_finite.py   (~20 s)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from layerswap.trainables.merge.checkpoint import CheckpointError
from layerswap.trainables.train.finite import NonFiniteTraining, check_checkpoint
from layerswap.trainables.train.loop import run_training
from tests.trainables.train.train_helpers import make_exp


def test_non_finite_training_stops_at_its_step_and_saves_nothing(tiny_world, tmp_path):
    # lr 1000, the most the config takes: the first update makes the weights ~1e3 and the
    # second step's loss and gradient are no longer finite.
    exp = make_exp(tiny_world, hyper={"lr": 1000.0, "max_steps": 3, "warmup_steps": 0})
    with pytest.raises(NonFiniteTraining) as e:
        run_training(exp, workdir=tmp_path)
    assert "training turned non-finite at step 2 of 3 (loss" in str(e.value)
    assert "no checkpoint of it was saved" in str(e.value)
    assert not list(tmp_path.rglob("samples_*"))


def test_a_base_with_a_nan_weight_is_refused_by_tensor(tiny_world, tmp_path):
    base = Path(shutil.copytree(tiny_world / "base", tmp_path / "base"))
    state = load_file(base / "model.safetensors")
    name = sorted(state)[5]
    state[name].view(-1)[3] = float("inf")
    save_file(state, base / "model.safetensors", {"format": "pt"})
    exp = make_exp(tiny_world, base=str(base))
    with pytest.raises(CheckpointError, match=rf"{base}: tensor '{name}' contains NaN or Inf"):
        run_training(exp, workdir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_names_what_is_not_finite():
    model = torch.nn.Linear(2, 2)
    check_checkpoint(4, {"loss": 1.0, "val_loss": 2.0}, model, 0.0)  # all finite: no error
    with pytest.raises(NonFiniteTraining, match=r"step 4 \(val_loss__1 nan\)"):
        check_checkpoint(4, {"loss": 1.0, "val_loss__1": float("nan")}, model, 0.0)
    with torch.no_grad():
        model.bias[1] = float("-inf")
    with pytest.raises(NonFiniteTraining, match=r"step 4 \(weight bias non-finite\)"):
        check_checkpoint(4, {"loss": 1.0}, model, 1.0)
