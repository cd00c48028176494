"""A run's worker count is part of what it trains: `--no-ray` trains on 1 worker whatever the
config asks, so a `--no-ray` run `--resume`d on Ray (and a Ray run of 2 workers resumed with
`--no-ray`) is refused before any work, naming scaling.num_workers and what to do; the driver
and Ray's workers agree on the resume point.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_worker_count_resume.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from layerswap.cli import main
from layerswap.spaces.train_experiment import experiment_identity
from layerswap.trainables.output_markers import MARKER
from layerswap.trainables.train import run as run_mod
from layerswap.trainables.train.state import find_checkpoints, read_manifest
from tests.trainables.train.train_helpers import make_exp


def _killed_no_ray_run(world: Path, tmp: Path):
    """A 2-worker config trained with --no-ray until its step-2 checkpoint, then failed."""
    data = tmp / "rows.jsonl"
    data.write_text("".join((world / "data/sft/math_en.jsonl").read_text().splitlines(True)[:8]))
    hyper = {"batch_size": 2, "max_steps": 4, "val_share": 0.0, "warmup_steps": 0}
    fail = {"fail_at_step": 2, "fail_marker": str(tmp / "failed")}
    exp = make_exp(world, "full", name="nw", hyper=hyper, datasets=[{"path": str(data)}], scaling={"num_workers": 2}, checkpoint_every_samples=4, debug=fail)  # fmt: skip
    f = tmp / "exp.yaml"
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json")))
    out = tmp / "out"
    with pytest.raises(RuntimeError, match="injected failure at step 2"):
        main(["train", str(f), "--out", str(out), "--no-ray"])
    return exp, f, out, out / "train/nw"


@pytest.fixture
def no_ray_start(monkeypatch):
    """Ray must not start: the refusal comes first (the old code went on to train there)."""

    def started(*a, **k):
        raise AssertionError("Ray was started for a resume that should have been refused")

    monkeypatch.setattr(run_mod, "_ray_ready", started)


def test_a_no_ray_run_is_not_resumed_on_ray_with_more_workers(tiny_world, tmp_path, capsys, tree_state, no_ray_start):  # fmt: skip
    exp, f, out, run = _killed_no_ray_run(tiny_world, tmp_path)
    [ckpt] = find_checkpoints(run)
    assert read_manifest(ckpt)["experiment"]["scaling"]["num_workers"] == 1
    capsys.readouterr()
    before = tree_state(run)
    for extra in (["--resume"], ["--continue"], []):
        assert main(["train", str(f), "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "scaling.num_workers 1 -> 2" in err and "--no-ray" in err, err
        assert "--no-ray --resume" in err and "scaling.num_workers: 1" in err and "--overwrite" in err  # fmt: skip
    assert tree_state(run) == before  # nothing written, no marker rewritten
    # Ray's workers would pass this checkpoint over too: the driver and they agree
    from layerswap.trainables.train.ray_train import _resume_point

    assert _resume_point(exp, run) is None
    assert _resume_point(run_mod.one_worker(exp), run) == str(ckpt)
    # the run the checkpoint is of continues with --no-ray, from it (steps 3-4 only)
    assert main(["train", str(f), "--out", str(out), "--no-ray", "--resume"]) == 0
    assert [read_manifest(c)["step"] for c in find_checkpoints(run)] == [2, 4]


def test_a_ray_run_of_two_workers_is_not_resumed_with_no_ray(tiny_world, tmp_path, capsys, tree_state):  # fmt: skip
    exp, f, out, run = _killed_no_ray_run(tiny_world, tmp_path)
    # laid out as a killed Ray run of 2 workers leaves it: its checkpoint at the run's root, its
    # manifest recording 2 workers, its marker the config's identity
    [ckpt] = find_checkpoints(run)
    man = read_manifest(ckpt)
    man["experiment"]["scaling"]["num_workers"] = 2
    (ckpt / "layerswap_train.json").write_text(json.dumps(man))
    ckpt.rename(run / ckpt.name)
    marker = run / MARKER
    m = json.loads(marker.read_text())
    marker.write_text(json.dumps(m | {"identity": experiment_identity(exp)}))
    capsys.readouterr()
    before = tree_state(run)
    assert main(["train", str(f), "--out", str(out), "--no-ray", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "scaling.num_workers 2 -> 1" in err and "resume it on Ray" in err and "--overwrite" in err  # fmt: skip
    assert tree_state(run) == before
