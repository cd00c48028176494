"""A training step counts its label tokens on the host, before the batch is copied: a count read
back from the device (`int(tensor.sum())` on CUDA) waits for the previous step's GPU work at the
start of every step. Checked with the batch sent to the meta device, where nothing can be read.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_host_counts.py
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from layerswap.trainables.train.data import Stream, TrainData
from layerswap.trainables.train.train_step import _next_batch


def test_label_tokens_are_counted_before_the_copy():
    pairs = [([1, 2, 3, 4], [-100, -100, 3, 4]), ([5, 6, 7], [-100, 6, 7])]
    data = TrainData([Stream(pairs, 0, 0)], [[]], [{}])
    run = SimpleNamespace(
        prep=SimpleNamespace(active=lambda step: (0, step, "all")),
        data=data,
        exp=SimpleNamespace(hyper=SimpleNamespace(batch_size=2), micro_batch=1),
        rank=0, world=1, pad=0, tokens_local=0.0, device=torch.device("meta"),
    )  # fmt: skip
    _, _, batches, n_items = _next_batch(run, 0)
    assert all(t.device.type == "meta" for b in batches for t in b.values())
    assert isinstance(n_items, int) and n_items == 2 + 2  # shifted labels that are not -100
    assert run.tokens_local == 7.0
