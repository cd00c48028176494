"""Gradient accumulation: micro-batches of a worker's share give the one-pass step.

Run: .venv/bin/python -m pytest tests/trainables/train/test_accumulation.py
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import MODE_CFGS, make_exp

from layerswap.trainables.train import run_training


@pytest.mark.parametrize("mode", ["full", "simultaneous"])
def test_micro_batches_equal_one_pass(tiny_world, tmp_path, mode):
    hyper = {"max_steps": 4, "batch_size": 8}
    one = run_training(make_exp(tiny_world, MODE_CFGS[mode], hyper=hyper), workdir=tmp_path / "one")  # fmt: skip
    hyper["micro_batch_size"] = 2  # 4 passes per step, each padded to its own longest row
    acc = run_training(make_exp(tiny_world, MODE_CFGS[mode], hyper=hyper), workdir=tmp_path / "acc")  # fmt: skip
    assert acc.losses == pytest.approx(one.losses, rel=1e-5, abs=1e-6)
    a = load_file(one.final_checkpoint / "model.safetensors")
    b = load_file(acc.final_checkpoint / "model.safetensors")
    # AdamW divides by sqrt(v): a weight whose gradient is ~0 can move by up to ~LR on a
    # float-rounding difference (2 of 62,752 did, by 3e-5 at LR 2e-3); all others agree to 1e-6.
    close = sum(int(torch.isclose(a[k], b[k], rtol=0, atol=1e-6).sum()) for k in a)
    assert close >= 0.999 * sum(t.numel() for t in a.values())
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-4) for k in a)


def test_micro_batch_must_divide_the_worker_share(tiny_world):
    with pytest.raises(ValueError, match=r"micro_batch_size \(3\) must divide .* = 4"):
        make_exp(tiny_world, hyper={"batch_size": 8, "micro_batch_size": 3}, scaling={"num_workers": 2})  # fmt: skip
