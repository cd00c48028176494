"""The Tune side of an expert sweep without a Ray cluster: what a resume needs in the sweep's
folder (missing or unreadable: one line), the registry rows of trials a resumed sweep's Tune
state never named taken out (and none when Tune lost the trials it named), the restored Tuner's
registry and verbosity this run's, and the names Tune pickles by reference (old ones too).

Run: .venv/bin/python -m pytest -q tests/experts/test_sweep_tuner.py
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest

import layerswap.experts.sweep as sweep_module
from layerswap.experts.registry import append_rows, expert_id, read_rows, registry_path
from layerswap.experts.sweep_tuner import (
    ROWS_KEY,
    SweepStateError,
    check_resumed,
    drop_untracked_rows,
    make_tuner,
    restore_problem,
)
from layerswap.spaces.errors import RunFailed
from layerswap.spaces.sweep import SweepConfig

# What Tune pickles by reference (module, name) into a sweep's tuner.pkl and searcher state: a
# sweep cut under any of these names must still resume, so each must keep resolving (a rename
# leaves the old name behind as an alias; experts/sweep.py keeps _Space's first home).
PICKLED_BY_NAME = {
    ("layerswap.experts.sweep_tuner", "_Space"),  # the Optuna searcher's space
    ("layerswap.experts.sweep", "_Space"),  # until the Tune side moved to sweep_tuner.py
    ("layerswap.spaces.sweep", "SweepConfig"),  # the space's sweep: block
    ("layerswap.spaces.sweep", "Range"),
    ("layerswap.spaces.sweep", "Choice"),
    ("layerswap.experts.registry", "append_rows"),  # the registry callback's
}


def _row(folder: Path, trial: str) -> dict:
    ck = folder / trial / "checkpoints" / "samples_000000008"
    ck.mkdir(parents=True)
    return {"expert_id": expert_id("sw", trial, 2), "kind": "math", "language": "en", "mode": "full",
            "path": str(ck), "base": "b", "trial_id": trial, "step": 2, "samples": 8, "seed": 0,
            "hparams": "{}"}  # fmt: skip


STATE = "experiment_state-2026-01-01_00-00-00.json"


def _state(folder: Path, trials: list[str], algorithm: str = "optuna") -> None:
    """A Tune experiment state naming `trials` (as Tune writes it: each trial a JSON string),
    and the searcher's state files (pickles) beside it."""
    data = [[json.dumps({"trial_id": t, "stub": False}), "{}"] for t in trials]
    (folder / STATE).write_text(json.dumps({"trial_data": data, "runner_data": {}, "stats": {}}))
    names = {"optuna": ["search_gen_state-x.json", "searcher-state-x.pkl"]}
    for name in names.get(algorithm, ["basic-variant-state-x.json"]):
        (folder / name).write_bytes(pickle.dumps({}))


def _setup(tmp_path: Path, algorithm: str = "optuna") -> SimpleNamespace:
    sweep = SweepConfig(num_samples=2, algorithm=algorithm, params={"hyper.lr": {"low": 1e-4, "high": 1e-3, "log": True}})  # fmt: skip
    return SimpleNamespace(sweep=sweep, int_params=set(), storage=str(tmp_path / "RUN" / "train"))


def test_restore_needs_the_tuner_an_experiment_state_and_the_searchers(tmp_path):
    said = restore_problem(tmp_path, "optuna")
    assert "tuner.pkl, experiment_state-*.json, search_gen_state-*.json, searcher-state-*.pkl" in said  # fmt: skip
    (tmp_path / "tuner.pkl").write_bytes(b"x")
    _state(tmp_path, ["a"], "random")
    assert restore_problem(tmp_path, "random") is None
    assert restore_problem(tmp_path, "optuna") == "its Ray Tune state (search_gen_state-*.json, searcher-state-*.pkl) is missing"  # fmt: skip


def test_an_experiment_state_cut_short_is_refused_before_ray(tmp_path):
    """A kill during Tune's copy of its state (every second) leaves half a JSON file: Tune would
    log it and start the sweep over, forgetting every trial (red-team r2)."""
    (tmp_path / "tuner.pkl").write_bytes(b"x")
    _state(tmp_path, ["a", "b"])
    data = (tmp_path / STATE).read_bytes()
    (tmp_path / STATE).write_bytes(data[: len(data) // 2])
    said = restore_problem(tmp_path, "optuna")
    assert said.startswith(f"its Ray Tune state is unreadable: {STATE} cannot be read"), said


def test_a_searcher_state_cut_short_is_refused_at_the_restore(tmp_path):
    setup = _setup(tmp_path)
    folder = Path(setup.storage) / "sw"
    make_tuner(setup, lambda config: None, "sw", tmp_path / "r.parquet", max_failures=0, verbose=0, resume=False)  # fmt: skip
    _state(folder, ["a"])
    (folder / "searcher-state-x.pkl").write_bytes(pickle.dumps({"a": list(range(100))})[:20])
    with pytest.raises(SweepStateError, match=r"searcher-state-x\.pkl"):
        make_tuner(setup, lambda config: None, "sw", tmp_path / "r.parquet", max_failures=0, verbose=0, resume=True)  # fmt: skip


def test_a_resume_that_lost_named_trials_fails_and_keeps_every_row(tmp_path):
    """Tune started the sweep over (its results name none of the saved trials): no row goes."""
    run = tmp_path / "run"
    folder, reg = run / "train" / "sw", registry_path(run)
    append_rows(reg, [_row(folder, "a"), _row(folder, "b")])
    with pytest.raises(RunFailed, match="did not restore this sweep's trials a, b"):
        check_resumed(folder, {"a", "b"}, {"c", "d"})
    assert sorted(r["trial_id"] for r in read_rows(reg)) == ["a", "b"]
    check_resumed(folder, {"a"}, {"a", "c"})  # every named one back: nothing said


def test_rows_of_trials_the_resumed_sweep_does_not_know_are_taken_out(tmp_path, capsys):
    run = tmp_path / "run"
    folder, other = run / "train" / "sw", run / "train" / "other"
    reg = registry_path(run)
    append_rows(reg, [_row(folder, "a"), _row(folder, "lost"), _row(other, "x")])
    assert drop_untracked_rows(reg, folder, {"a", "b"}) == [str(folder / "lost")]
    assert sorted(r["trial_id"] for r in read_rows(reg)) == ["a", "x"]  # another sweep's stay
    assert (folder / "lost").is_dir()  # its checkpoints are kept
    assert f"{folder / 'lost'}" in capsys.readouterr().err


def test_an_unreadable_tune_state_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "sw"
    folder.mkdir()
    (folder / "tuner.pkl").write_bytes(b"not a pickle")  # e.g. cut mid-write on a full disk
    _state(folder, [])
    setup = SimpleNamespace(storage=str(tmp_path), sweep=SimpleNamespace(algorithm="optuna"))
    with pytest.raises(SweepStateError) as e:
        make_tuner(setup, lambda config: None, "sw", tmp_path / "r.parquet", max_failures=0, verbose=0, resume=True)  # fmt: skip
    said = str(e.value)
    assert said.startswith(f"{folder}: an expert sweep of sw did not finish and cannot be resumed: its Ray Tune state cannot be read")  # fmt: skip
    assert "pass --overwrite" in said and "\n" not in said


def _names(pickled: bytes) -> set[tuple[str, str]]:
    """The (module, name) pairs of layerswap's a pickle refers to, found by loading it."""
    seen = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            seen.add((module, name))
            return super().find_class(module, name)

    Recording(io.BytesIO(pickled)).load()
    return {n for n in seen if n[0].startswith("layerswap")}


def test_the_names_tune_pickles_are_pinned_and_resolve(tmp_path):
    setup = _setup(tmp_path)
    setup.sweep = SweepConfig(params={"hyper.lr": {"low": 1e-4, "high": 1e-3}, "hyper.batch_size": {"choices": [4, 8]}})  # fmt: skip
    make_tuner(setup, lambda config: None, "sw", tmp_path / "r.parquet", max_failures=0, verbose=0, resume=False)  # fmt: skip
    assert _names((Path(setup.storage) / "sw" / "tuner.pkl").read_bytes()) <= PICKLED_BY_NAME
    for module, name in PICKLED_BY_NAME:
        assert pickle.Unpickler.find_class(pickle.Unpickler(io.BytesIO()), module, name)  # fmt: skip


def test_a_sweep_cut_when_space_lived_in_sweep_py_resumes(tmp_path, monkeypatch):
    """tuner.pkl of a sweep cut under the code before the move names
    layerswap.experts.sweep._Space (red-team r4): it is restored, not refused."""
    old = dataclasses.make_dataclass("_Space", [("sweep", object), ("int_params", set)],
                                     namespace={"__call__": lambda self, trial: None})  # fmt: skip
    old.__module__, old.__qualname__ = "layerswap.experts.sweep", "_Space"
    setup = _setup(tmp_path)
    with monkeypatch.context() as m:  # the class at its place then, while the state is written
        m.setattr(sweep_module, "_Space", old, raising=False)
        m.setattr("layerswap.experts.sweep_tuner._Space", old)
        make_tuner(setup, lambda config: None, "sw", tmp_path / "r.parquet", max_failures=0, verbose=0, resume=False)  # fmt: skip
    folder = Path(setup.storage) / "sw"
    assert ("layerswap.experts.sweep", "_Space") in _names((folder / "tuner.pkl").read_bytes())
    _state(folder, ["a"])
    tuner = make_tuner(setup, lambda config: None, "sw", tmp_path / "r.parquet", max_failures=0, verbose=0, resume=True)  # fmt: skip
    assert tuner is not None


def test_a_resumed_sweep_appends_to_this_runs_registry(tmp_path, monkeypatch):
    """The first run's `--out RUN` from folder A (a relative registry path), resumed as
    `--out /abs/RUN` from folder B with another verbosity: rows go to RUN's registry, none
    under B, and Tune runs at this run's verbosity (red-team r1)."""
    (tmp_path / "A").mkdir(), (tmp_path / "B").mkdir()
    setup = _setup(tmp_path / "A", "random")
    monkeypatch.chdir(tmp_path / "A")
    make_tuner(setup, lambda config: None, "sw", Path("RUN/experts/registry.parquet"), max_failures=0, verbose=0, resume=False)  # fmt: skip
    folder = Path(setup.storage) / "sw"
    _state(folder, ["a"], "random")
    monkeypatch.chdir(tmp_path / "B")
    reg = tmp_path / "A" / "RUN" / "experts" / "registry.parquet"
    tuner = make_tuner(setup, lambda config: None, "sw", reg, max_failures=0, verbose=2, resume=True)  # fmt: skip
    run_config = tuner._local_tuner.get_run_config()
    assert run_config.verbose == 2
    (callback,) = run_config.callbacks
    row = _row(folder, "a")
    callback.on_trial_result(1, [], None, {ROWS_KEY: json.dumps([row])})
    assert [r["trial_id"] for r in read_rows(reg)] == ["a"]
    assert os.listdir(tmp_path / "B") == []
