"""Expert sweeps retry at one level: a trial that nests a Ray Train run (executor: ray_train)
is retried by Ray Train alone (from its last checkpoint), not again by Tune around it.

Before, Tune retried the trial `failure.max_failures` times around a TorchTrainer that retried
as often itself: (1 + n)^2 attempts of a deterministic failure (16 at the shipped 3, on 4-8
H100s each). Here a trial fails the same way at step 2 of every attempt; each attempt logs
step 1 once.

Run: .venv/bin/python -m pytest -q tests/experts/test_sweep_retry_levels.py   (marked slow)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from layerswap.experts.sweep import run_sweep, set_up_sweep, trial_retries
from layerswap.spaces.train_experiment import parse_train_experiment


def always_failing(world: Path, tmp_path: Path, step_log: Path, max_failures: int):
    """A one-trial ray_train sweep whose step 2 (0-based 1) raises in every attempt: its fault
    marker's folder is a file, so the marker that would make the failure happen once cannot be
    made (FileExistsError, as deterministic as an out-of-memory or a missing token)."""
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    return parse_train_experiment(
        {
            "name": "sweep_fails",
            "base": str(world / "base"),
            "kind": "math",
            "language": "en",
            "datasets": [{"path": str(world / "data/sft/math_en.jsonl")}],
            "mode": "full",
            "hyper": {"lr": 1e-3, "max_steps": 4, "batch_size": 4, "seq_len": 96},
            "checkpoint_every_samples": 8,
            "failure": {"max_failures": max_failures},
            "debug": {
                "step_log": str(step_log),
                "fail_at_step": 1,
                "fail_marker": str(blocker / "marker"),
            },
            "sweep": {
                "num_samples": 1,
                "params": {"hyper.lr": {"choices": [1e-3]}},
                "executor": "ray_train",
                "limit": 4,
            },
        }
    )


@pytest.mark.slow
def test_a_nested_trainer_trial_is_retried_by_ray_train_only(tiny_world, tmp_path, ray_local):
    log = tmp_path / "steps.jsonl"
    exp = always_failing(tiny_world, tmp_path, log, max_failures=1)
    res = run_sweep(exp, tmp_path / "run")
    assert list(res.trials.values()) == ["error"] and res.rows == []
    attempts = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    # 1 + max_failures attempts in all; Tune retrying around them too made it (1 + 1) * 2 = 4.
    assert attempts == [1, 1], attempts


def test_an_in_trial_sweep_keeps_its_retries_in_tune(tiny_world, tmp_path):
    """in_trial: Tune is the only level, and a restarted trial resumes from its checkpoint."""
    exp = always_failing(tiny_world, tmp_path, tmp_path / "steps.jsonl", max_failures=3)
    assert trial_retries(set_up_sweep(exp, tmp_path / "run")) == 0  # ray_train
    in_trial = exp.model_copy(
        update={"sweep": exp.sweep.model_copy(update={"executor": "in_trial"})}
    )
    assert trial_retries(set_up_sweep(in_trial, tmp_path / "run")) == 3


def test_a_trial_whose_node_does_not_see_the_inputs_fails_without_retry(tiny_world, tmp_path, monkeypatch):  # fmt: skip
    """Each trial checks its node's view of the inputs and of RUN (the sweep's lock there) before
    it trains: where they differ it reports FAILED_KEY (no Tune retry) and NODE_PATHS_KEY, whose
    lines run_sweep raises as the sweep's one error."""
    from ray import tune

    from layerswap.experts import sweep
    from layerswap.trainables.lock_files import lock_path
    from layerswap.trainables.locks import writing
    from layerswap.trainables.node_paths import RUN_FIELD

    exp = always_failing(tiny_world, tmp_path, tmp_path / "steps.jsonl", max_failures=3)
    run = tmp_path / "run"
    with writing(run / "train" / exp.name):  # what the CLI holds while the sweep runs
        setup = set_up_sweep(exp, run)
    fields = [row[0] for row in setup.node_inputs]
    assert fields == ["base", "datasets[0].path", "base (its world)", RUN_FIELD]
    assert setup.node_inputs[-1][1] == str(lock_path((run / "train" / exp.name).resolve()))
    # This process stands for a node that does not see the lock the driver held.
    reports = []
    monkeypatch.setattr(tune, "report", reports.append)
    monkeypatch.setattr(tune, "get_context", lambda: type("C", (), {"get_trial_id": lambda self: "t1"})())  # fmt: skip
    monkeypatch.setattr(sweep, "_train", lambda *a: pytest.fail("trained on a node that cannot see RUN"))  # fmt: skip
    sweep.sweep_trial({"hyper": {"lr": 1e-3}}, setup)
    [rep] = reports
    assert rep[sweep.FAILED_KEY] == rep[sweep.NODE_PATHS_KEY]
    assert re.fullmatch(rf"node .+: {re.escape(RUN_FIELD)} {re.escape(setup.node_inputs[-1][1])}: missing there; .+", rep[sweep.NODE_PATHS_KEY])  # fmt: skip
