"""Train-then-revert vs freeze-then-train on the tiny world (follow-up paper Table 3.3).

Run: .venv/bin/python -m pytest tests/trainables/train/test_revert.py
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import EDGE, make_exp

from layerswap.trainables.merge.arch import param_slot
from layerswap.trainables.train.revert import freeze_vs_revert, revert_specs


def test_freeze_vs_revert_both_arms(tiny_world, tmp_path):
    exp = make_exp(tiny_world, {"type": "partial", "partition": EDGE, "train": "task"}, hyper={"max_steps": 8})  # fmt: skip
    out = freeze_vs_revert(exp, tmp_path)
    base = load_file(tiny_world / "base/model.safetensors")
    frozen = load_file(out["freeze"] / "model.safetensors")
    full = load_file(out["full"] / "model.safetensors")
    reverted = {}
    for f in sorted(out["revert"].glob("*.safetensors")):
        reverted |= load_file(f)
    assert reverted.keys() == base.keys()
    for name in base:
        task_side = param_slot(name).layer in (1, 2)
        # both arms leave the language side (and non-layer) at base, bit for bit
        assert torch.equal(frozen[name], base[name]) != task_side, name
        assert torch.equal(reverted[name], base[name] if not task_side else full[name]), name
    assert set(out["val_loss"]) == {"freeze", "revert", "full"}
    assert all(v > 0 for v in out["val_loss"].values())


def test_revert_specs_of_named_partition(tiny_world):
    exp = make_exp(tiny_world, {"type": "partial", "partition": "C", "train": "language"})
    specs = revert_specs(exp, 12)  # C on 12 layers: language = 0-5 and 10-11, task = 6-9
    layers = {tuple(s.components): s.layers for s in specs if s.layers}
    assert layers == {("attention",): [6, 7, 8, 9], ("mlp",): [6, 7, 8, 9]}
    assert any(s.non_layer for s in specs)
    with pytest.raises(ValueError, match="partial"):
        revert_specs(make_exp(tiny_world, "full"), 12)


def test_freeze_vs_revert_refuses_lora_before_training(tiny_world, tmp_path):
    # Its train arm is a full-weight run: beside a LoRA freeze arm it would compare full SFT
    # with LoRA, so the comparison is refused before either arm trains.
    mode = {"type": "partial", "partition": EDGE, "train": "task", "lora": {"rank": 4, "alpha": 8}}
    trained = []
    with pytest.raises(ValueError, match=r"mode\.lora"):
        freeze_vs_revert(make_exp(tiny_world, mode), tmp_path, run=lambda exp, **kw: trained.append(exp))  # fmt: skip
    assert trained == [] and not any(tmp_path.iterdir())
