"""A run is finished or continued only on the dataset files its checkpoints were trained on: a
rerun of a finished run and a `--resume` after a dataset file changed are refused (naming the
file and its lines/bytes), as is a checkpoint of other data at the loop and Ray's resume point.

Run: .venv/bin/python -m pytest -q tests/trainables/test_data_fingerprint.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from layerswap.cli import main
from layerswap.trainables.data_fingerprint import data_change, data_fingerprint
from layerswap.trainables.train.loop import run_training
from layerswap.trainables.train.state import find_checkpoints, read_manifest
from tests.trainables.train.train_helpers import make_exp


def _rows(world: Path, lo: int, hi: int) -> str:
    return "".join((world / "data/sft/math_en.jsonl").read_text().splitlines(True)[lo:hi])


def _setup(world: Path, tmp: Path, **over):
    """An experiment on a copy of 8 world rows (2 a step), its YAML, and the data file."""
    data = tmp / "rows.jsonl"
    data.write_text(_rows(world, 0, 8))
    hyper = {"batch_size": 2, "max_steps": 4, "val_share": 0.0, "warmup_steps": 0}
    exp = make_exp(world, "full", name="fp", hyper=hyper, datasets=[{"path": str(data)}], **over)
    f = tmp / "exp.yaml"
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json")))
    return exp, f, data


def _n_train(run: Path) -> list[int]:
    return [read_manifest(c)["data"][0]["n_train"] for c in find_checkpoints(run)]


def test_a_finished_run_on_a_changed_file_is_not_already_trained(tiny_world, tmp_path, capsys, tree_state):  # fmt: skip
    _, f, data = _setup(tiny_world, tmp_path)
    out, run = tmp_path / "out", tmp_path / "out/train/fp"
    assert main(["train", str(f), "--out", str(out), "--no-ray"]) == 0
    man = read_manifest(find_checkpoints(run)[-1])["data_fingerprint"]["datasets[0].path"]
    assert man["lines"] == 8 and man["bytes"] == data.stat().st_size and len(man["sha256"]) == 64
    capsys.readouterr()
    before = tree_state(run)
    data.write_text(_rows(tiny_world, 8, 12))  # the file replaced: 4 other rows
    for extra in ([], ["--resume"]):
        assert main(["train", str(f), "--out", str(out), "--no-ray", *extra]) == 2
        cap = capsys.readouterr()
        assert "nothing to do" not in cap.out and "Traceback" not in cap.err
        line = cap.err.strip().splitlines()[-1]
        assert f"datasets[0].path {data} changed" in line and "8 lines" in line and "4 lines" in line  # fmt: skip
        assert "--overwrite" in line
    assert tree_state(run) == before
    # --overwrite retrains on the data as it is now
    assert main(["train", str(f), "--out", str(out), "--no-ray", "--overwrite"]) == 0
    assert set(_n_train(run)) == {4}


def test_resume_after_the_file_changed_is_refused_before_any_step(tiny_world, tmp_path, capsys):
    fail = {"fail_at_step": 2, "fail_marker": str(tmp_path / "failed")}
    exp, f, data = _setup(tiny_world, tmp_path, checkpoint_every_samples=4, debug=fail)
    out, run = tmp_path / "out", tmp_path / "out/train/fp"
    with pytest.raises(RuntimeError, match="injected failure at step 2"):
        main(["train", str(f), "--out", str(out), "--no-ray"])
    assert [c.name for c in find_checkpoints(run)] == ["samples_000000004"]
    capsys.readouterr()
    data.write_text(_rows(tiny_world, 8, 12))
    assert main(["train", str(f), "--out", str(out), "--no-ray", "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"{data} changed since the run trained on it (8 lines" in err and "--overwrite" in err
    assert _n_train(run) == [8]  # nothing trained on the new rows, nothing spliced
    # the checkpoint itself, handed to the loop (Ray's restore, --resume CKPT), is refused too
    with pytest.raises(ValueError, match="changed since the run trained on it"):
        run_training(exp, workdir=tmp_path / "w", resume_from=find_checkpoints(run)[-1])
    # and Ray's on-disk resume point passes it over
    from layerswap.trainables.train.ray_train import _resume_point

    assert _resume_point(exp, run) is None
    data.write_text(_rows(tiny_world, 0, 8))  # the same bytes back: it continues
    assert _resume_point(exp, run) == str(find_checkpoints(run)[-1])
    assert main(["train", str(f), "--out", str(out), "--no-ray", "--resume"]) == 0
    assert _n_train(run) == [8, 8]


def test_what_is_compared(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text('{"question": "q", "answer": "x"}\n')
    exp = make_exp(tmp_path, "full", base="b", datasets=[{"path": str(a)}])
    old = data_fingerprint(exp)
    a.write_text('{"question": "q", "answer": "y"}\n')  # same size, other bytes
    said = data_change(old, data_fingerprint(exp))
    assert "same size, other content" in said and old["datasets[0].path"]["sha256"][:12] in said
    assert data_change(None, data_fingerprint(exp)) == ""  # a run from before fingerprints
    src = make_exp(tmp_path, "full", base="b", datasets=[{"source": "orca_math", "data_files": [str(a)]}])  # fmt: skip
    assert list(data_fingerprint(src)) == ["datasets[0].data_files[0]"]
    hub = make_exp(tmp_path, "full", base="b", datasets=[{"source": "orca_math"}])
    assert data_fingerprint(hub) == {"datasets[0].source": {"source": "orca_math", "sha256": None}}
    assert data_change(data_fingerprint(hub), data_fingerprint(hub)) == ""  # not fingerprinted
    json.dumps(old)  # recorded in manifests as JSON


_OPENED: dict[str, int] = {}  # path -> times opened, for the paths a test watches


def _count_opens(event: str, args: tuple) -> None:
    if event == "open" and str(args[0]) in _OPENED:
        _OPENED[str(args[0])] += 1


sys.addaudithook(_count_opens)  # an audit hook stays for the process: it counts watched paths only


def test_the_files_are_read_only_where_compared_or_recorded(tmp_path):
    """A fresh Ray run reads no dataset file to find its resume point (nothing to compare), a
    worker of rank > 0 none to start (rank 0 records the manifests' fingerprint), and rank 0
    one read (files actually opened, counted by an audit hook)."""
    from layerswap.trainables.train.loop import _starting_point
    from layerswap.trainables.train.ray_train import _resume_point

    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "q", "answer": "x"}\n')
    os.utime(data, (time.time() - 60, time.time() - 60))  # not racy: a second hash is cached
    exp = make_exp(tmp_path, "full", base="b", datasets=[{"path": str(data)}])
    _OPENED[str(data)] = 0
    try:
        (tmp_path / "run").mkdir()
        assert _resume_point(exp, tmp_path / "run") is None
        assert _OPENED[str(data)] == 0  # a fresh run: nothing to compare
        assert _starting_point(exp, tmp_path / "w1", None, rank=1) == (None, {})
        assert _OPENED[str(data)] == 0
        _, fp = _starting_point(exp, tmp_path / "w0", None, rank=0)
        assert fp == data_fingerprint(exp) and _OPENED[str(data)] == 1
    finally:
        del _OPENED[str(data)]
