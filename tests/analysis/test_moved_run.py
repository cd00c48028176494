"""A run copied elsewhere (from the cluster to a laptop) is still analysed whole: the absolute
paths its result files recorded are found again under its new root (analysis.load.RunData.resolve).

Run: .venv/bin/python -m pytest -q tests/analysis/test_moved_run.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
from analysis_synth import lm_eval_raw

from layerswap.analysis.load import RunData
from layerswap.analysis.paired import item_scores


def test_a_recorded_path_is_found_under_the_moved_root(tmp_path):
    run = tmp_path / "laptop" / "demo"
    ckpt = run / "train" / "world_math_full" / "samples_000003200"
    ckpt.mkdir(parents=True)
    (run / "samples_000003200").mkdir()  # a one-part tail alone is not enough to match
    data = RunData(root=run)
    recorded = "/cluster/home/me/runs/demo/train/world_math_full/samples_000003200"
    assert data.resolve(recorded) == ckpt
    gone = "/cluster/home/me/runs/demo/train/other/samples_000003200"
    assert data.resolve(gone) == Path(gone)  # as recorded, to be named missing
    assert data.resolve("train/world_math_full/samples_000003200") == ckpt  # relative: as before


def test_paired_results_read_the_moved_raw_json(tmp_path):
    old = tmp_path / "cluster" / "run"
    raw_dir = old / "promotion" / "lm_eval" / "base"
    raw_dir.mkdir(parents=True)
    (raw_dir / "t.json").write_text(json.dumps(lm_eval_raw("t", [1.0, 0.0, 1.0, 1.0])))
    row = {"model": "base", "task": "t", "split": "test", "raw_json": str(raw_dir / "t.json")}
    new = tmp_path / "laptop" / "run"
    shutil.copytree(old, new)
    shutil.rmtree(old)
    moved = RunData(root=new, promotion=pd.DataFrame([row]))
    assert item_scores(moved, "t")["base"].tolist() == [1.0, 0.0, 1.0, 1.0]
