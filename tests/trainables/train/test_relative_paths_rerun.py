"""train_expert called from Python with relative local paths recognises its own run: Ray's
workers record the paths made absolute in their manifests, and the rerun decision compares the
experiment with the newest manifest, so the driver makes them absolute too (as the CLI does).

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_relative_paths_rerun.py
"""

from __future__ import annotations

import os

from layerswap.spaces.train_experiment import absolute_local_paths
from layerswap.trainables.train import train_expert
from tests.trainables.train.train_helpers import make_exp


def test_a_rerun_with_relative_paths_is_the_same_run(tiny_world, tmp_path, monkeypatch):
    (tmp_path / "rows.jsonl").write_text("".join((tiny_world / "data/sft/math_en.jsonl").read_text().splitlines(True)[:8]))  # fmt: skip
    os.symlink(tiny_world, tmp_path / "world")
    monkeypatch.chdir(tmp_path)
    hyper = {"batch_size": 2, "max_steps": 2, "val_share": 0.0, "warmup_steps": 0}
    rel = make_exp(tiny_world, "full", name="rel", hyper=hyper, datasets=[{"path": "rows.jsonl"}])
    rel = rel.model_copy(update={"base": "world/base"})
    # The run as a Ray worker writes it: its manifests hold the paths made absolute.
    first = train_expert(absolute_local_paths(rel), "runs", use_ray=False)
    assert first is not None
    # The same experiment with its paths as written: recognised as finished, not refused as "a
    # different experiment" (nor trained again).
    assert train_expert(rel, "runs", use_ray=False) == first
