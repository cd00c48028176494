"""A Ray Train run that fails for good (its restarts used up) ends `layerswap train` with exit 1
and the workers' errors, not a Python traceback of the driver naming `RuntimeError`.

Run: .venv/bin/python -m pytest -q tests/cli/test_train_failed.py
"""

from __future__ import annotations

import yaml

from layerswap.cli import main
from layerswap.trainables.train import ray_train
from layerswap.trainables.train import run as train_run
from tests.trainables.train.train_helpers import make_exp


def test_a_run_that_failed_for_good_is_one_failure_with_the_workers_error(tiny_world, tmp_path, monkeypatch, capsys):  # fmt: skip
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(make_exp(tiny_world).model_dump(mode="json", exclude_none=True)))
    said = "worker rank 0: OutOfMemoryError: CUDA out of memory\nworker rank 0's traceback:\n..."

    def failed(exp, **kw):
        return ray_train.RayTrainResult(None, {}, tmp_path / "run" / "t", said)

    monkeypatch.setattr(ray_train, "train_with_ray", failed)
    # Nor does the run start a Ray of its own for the nodes' view of its inputs (one node here):
    # a Ray left running in this process would meet the next test file's ray.init.
    monkeypatch.setattr(train_run, "_ray_ready", lambda *a, **k: None)
    assert main(["train", str(exp), "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"layerswap: failed: training failed: {said}"), err
    assert "RuntimeError" not in err and "Traceback (most recent call last)" not in err
