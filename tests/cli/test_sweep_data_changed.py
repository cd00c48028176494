"""`layerswap train EXP --out RUN --continue` of an expert sweep whose training file was edited
since it trained is refused before any work, in one line naming the file and --overwrite: a
finished sweep is not "finished" on data it never trained on, and an unfinished one is not
resumed (its kept trials on the old rows, the rest on the new: a registry of two datasets).
One real sweep of one tiny trial, then `--continue` on the edited file, twice: as it finished,
and with its SWEEP_FINISHED gone (cut between its last trial and that record: Tune's state
there, so the old code resumed it). Checked from outside: exit 2, the sweep's files unchanged.

Run: .venv/bin/python -m pytest -q tests/cli/test_sweep_data_changed.py   (slow: one sweep)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from layerswap.cli.train_sweep import SWEEP_FINISHED
from tests.trainables.train.train_helpers import TINY_SWEEP, make_exp

pytestmark = pytest.mark.slow


def _sweep_yaml(world: Path, tmp: Path) -> tuple[Path, Path]:
    """A one-trial in-process sweep of 2 steps on a copy of 8 world rows; (its YAML, the rows)."""
    data = tmp / "rows.jsonl"
    rows = (world / "data/sft/math_en.jsonl").read_text().splitlines(True)
    data.write_text("".join(rows[:8]))
    sweep = dict(TINY_SWEEP)
    hyper = {"max_steps": 2, "batch_size": 4, "seq_len": 64, "warmup_steps": 0, "val_share": 0.0}
    exp = make_exp(world, name="sw", hyper=hyper, datasets=[{"path": str(data)}], sweep=sweep)
    f = tmp / "sweep.yaml"
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json", exclude_none=True)))
    return f, data


def test_continue_refuses_a_sweep_whose_training_file_changed(tiny_world, tmp_path, cli, ray_tmp, tree_state):  # fmt: skip
    f, data = _sweep_yaml(tiny_world, tmp_path)
    run = tmp_path / "run"
    folder = run / "train" / "sw"
    first = cli("train", f, "--out", run, env=ray_tmp.env)
    assert first.finish() == 0, first.tail()
    record = json.loads((folder / SWEEP_FINISHED).read_text())
    assert record["data_fingerprint"]["datasets[0].path"]["lines"] == 8, record
    ray_tmp.assert_gone()
    rows = data.read_text().splitlines(True)
    data.write_text("".join(rows[:4]))  # the training file edited: 4 of its rows left

    for cut in (False, True):
        if cut:  # the record not yet written: an unfinished sweep whose trials all ended
            (folder / SWEEP_FINISHED).unlink()
        before = tree_state(run)
        again = cli("train", f, "--out", run, "--continue", env=ray_tmp.env)
        assert again.finish(timeout=120) == 2, (cut, again.tail())
        line = again.stderr.strip().splitlines()[-1]
        assert f"datasets[0].path {data} changed since the sweep trained on it (8 lines" in line, line  # fmt: skip
        assert "4 lines" in line and "--overwrite" in line and "Traceback" not in again.stderr
        assert "already finished" not in again.stdout and "resuming" not in again.stdout
        assert tree_state(run) == before, cut  # refused before any work: nothing written
        ray_tmp.assert_gone()
    # the rows as they were: it continues (here: resumed, nothing left to train)
    data.write_text("".join(rows))
    same = cli("train", f, "--out", run, "--continue", env=ray_tmp.env)
    assert same.finish() == 0, same.tail()
    assert (folder / SWEEP_FINISHED).is_file()
