"""Which rows a step trains on: simultaneous streams' passes under `hyper.epochs` (said at the
start and recorded in the manifest), and a batch across an epoch boundary holds distinct rows.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_data_order.py
"""

from __future__ import annotations

import pytest
from train_helpers import EDGE, make_exp

import layerswap.trainables.train.train_step as train_step
from layerswap.trainables.train import read_manifest, run_training


def test_simultaneous_epochs_passes_are_said_and_recorded(tiny_world, tmp_path, monkeypatch, capsys):  # fmt: skip
    # 38 vs 118 training rows alternating batch by batch: one "epoch" (156 rows, 20 steps)
    # gives each stream 80 rows, 2.11 passes of the small one and 0.68 of the large one.
    seen: dict[int, list] = {0: [], 1: []}
    real = train_step.local_batch

    def spy(stream, own, bs, rank, world):
        rows = real(stream, own, bs, rank, world)
        seen[stream.index] += rows
        return rows

    monkeypatch.setattr(train_step, "local_batch", spy)
    data = [
        {"path": str(tiny_world / "data/sft/math_en.jsonl"), "limit": 40},
        {"path": str(tiny_world / "data/sft/lang_xa.jsonl")},
    ]
    mode = {"type": "simultaneous", "partition": EDGE}
    exp = make_exp(tiny_world, mode, datasets=data, hyper={"max_steps": None, "epochs": 1.0})
    ckpt = run_training(exp, workdir=tmp_path).final_checkpoint
    m = read_manifest(ckpt)
    n_train = [d["n_train"] for d in m["data"]]
    assert n_train == [38, 118]
    measured = [len(seen[i]) / n for i, n in enumerate(n_train)]
    assert measured == pytest.approx([80 / 38, 80 / 118])
    assert m["passes"] == pytest.approx(measured)
    out = capsys.readouterr().out
    assert "38 rows: 2.11 passes" in out and "118 rows: 0.68 passes" in out and "limit" in out
