"""Only a run's newest checkpoint keeps its resume state (AdamW moments, fp32 masters): older
ones are stripped to their weights and refuse a resume by name; `resume_state: all` keeps all.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_checkpoint_policy.py
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import make_exp

from layerswap.trainables.train import run_training
from layerswap.trainables.train.state import find_checkpoints, read_manifest, read_state

HYPER = {"max_steps": 4, "batch_size": 4, "lr": 1e-3}


def _files(ckpt):
    return sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())


def test_older_checkpoints_keep_their_weights_but_not_their_resume_state(bf16_world, tmp_path):
    # bf16-mixed on a bf16 base: every checkpoint has bf16 weights and, while newest, fp32 masters
    exp = make_exp(bf16_world, hyper=HYPER, checkpoint_every_samples=4, precision="bf16-mixed")
    res = run_training(exp, workdir=tmp_path / "run")
    ckpts = find_checkpoints(tmp_path / "run")
    assert [read_manifest(c)["step"] for c in ckpts] == [1, 2, 3, 4]
    *older, newest = ckpts
    assert res.final_checkpoint == newest
    newest_files = _files(newest)
    assert "trainer_state/master.safetensors" in newest_files
    assert any(f.startswith("trainer_state/optimizer__") for f in newest_files)
    for c in older:
        files = _files(c)
        assert not any(f.startswith("trainer_state/optimizer__") or f.endswith("master.safetensors") for f in files), files  # fmt: skip
        assert "model.safetensors" in files and "layerswap_train.json" in files
        assert read_state(c)["resumable"] is False
        # The manifest lists every model file at its size (a store's completeness check), and
        # pruning the resume state leaves that list true.
        model_files = {f: (c / f).stat().st_size for f in files if not f.startswith("trainer_state/") and f != "layerswap_train.json"}  # fmt: skip
        assert read_manifest(c)["files"] == model_files and "config.json" in model_files
        weights = load_file(c / "model.safetensors")  # the weights a sweep ranks are whole
        assert weights and all(torch.isfinite(t.float()).all() for t in weights.values())
    with pytest.raises(ValueError, match=r"not resumable, its optimizer state was dropped .* resume from the run's newest"):  # fmt: skip
        run_training(exp, workdir=tmp_path / "again", resume_from=older[-1])


def test_resume_state_all_keeps_every_checkpoints(tiny_world, tmp_path):
    exp = make_exp(tiny_world, hyper=HYPER, checkpoint_every_samples=4, resume_state="all")
    run_training(exp, workdir=tmp_path / "run")
    for c in find_checkpoints(tmp_path / "run"):
        assert any(f.startswith("trainer_state/optimizer__") for f in _files(c))
        assert read_state(c).get("resumable", True)
