"""Which rows a step trains on: simultaneous streams' passes under `hyper.epochs` (said at the
start and recorded in the manifest), and a batch across an epoch boundary holds distinct rows.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_data_order.py
"""

from __future__ import annotations

import pytest
from train_helpers import EDGE, make_exp
from transformers import AutoTokenizer

import layerswap.trainables.train.train_step as train_step
from layerswap.trainables.train import read_manifest, run_training
from layerswap.trainables.train.data import Stream, build_data, local_batch, total_steps


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


def _batches(stream, steps: int) -> list[list[int]]:
    return [
        [x[0] for x, _ in local_batch(stream, s, stream.batch_size, 0, 1)] for s in range(steps)
    ]


@pytest.mark.parametrize("n, bs", [(10, 8), (13, 8), (114, 8), (9, 4), (8, 8)])
def test_batches_across_epoch_boundaries_hold_distinct_rows(n, bs):
    rows = [([i], [i]) for i in range(n)]
    for seed in range(12):
        stream = Stream(rows, seed, 0, bs)
        steps = 6 * n // bs  # six epochs
        batches = _batches(stream, steps)
        assert all(len(set(b)) == bs for b in batches), (seed, batches)
        flat = [r for b in batches for r in b]
        for e in range(len(flat) // n):  # every whole epoch still visits each row once
            assert sorted(flat[e * n : (e + 1) * n]) == list(range(n))
        # a resumed run (a fresh stream asked for a late step first) sees the same batches
        fresh = Stream(rows, seed, 0, bs)
        assert _batches(fresh, steps)[::-1] == batches[::-1]
        late = Stream(rows, seed, 0, bs)
        assert [x[0] for x, _ in local_batch(late, steps - 1, bs, 0, 1)] == batches[-1]


def test_tiny_world_batch_across_an_epoch_holds_distinct_rows(tiny_world):
    # seed 4, 114 rows, batch 8: step 28 crossed into epoch 2 with a row twice
    exp = make_exp(tiny_world, "full", hyper={"max_steps": None, "epochs": 3.0, "seed": 4})
    data = build_data(exp, AutoTokenizer.from_pretrained(tiny_world / "base"))
    stream = data.streams[0]
    for step in range(total_steps(exp, data)):
        batch = [tuple(x) for x, _ in local_batch(stream, step, 8, 0, 1)]
        assert len(set(batch)) == 8, step
