"""A study's commands.sh can be run again after an interruption: `--continue` on `train`, `search`
and `analyze` takes each step's output as it stands (start it, resume it, or say it is finished
and do nothing), and refuses what it cannot continue in one line (exit 2, nothing changed:
tests/cli/test_bad_input_continue.py, whose battery fixtures trip on any real work).

The sweep and the search are stubbed here (their own tests run them); the slow test interrupts a
real training run and runs its command twice more through the real CLI.
Run: .venv/bin/python -m pytest -q tests/cli/test_rerun_commands.py
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import types
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from layerswap.cli import main
from layerswap.spaces.errors import RunFailed
from layerswap.trainables.outputs import write_marker
from tests.cli.test_interrupts import (
    _check_every_step_once,
    _checkpoint_steps,
    _has_checkpoints,
    _train_exp,
)
from tests.trainables.train.train_helpers import make_exp

SWEEP = {"num_samples": 2, "params": {"hyper.lr": {"low": 1e-4, "high": 1e-2, "log": True}}}

# ---------------------------------------------------------------------------------- train sweep


def _fake_sweep(monkeypatch, outcome: Callable[[], dict]) -> list:
    """Stub experts.sweep.run_sweep: each call is recorded and returns `outcome()`'s trials."""
    calls: list = []
    fake = types.ModuleType("layerswap.experts.sweep")

    def run_sweep(exp, run_dir, resume=False, **kw):
        calls.append(f"{exp.name} resumed" if resume else exp.name)
        trials = outcome()
        rows = [
            {"trial_id": t} for t, s in trials.items() if s == "ok"
        ]  # one scored row per ok trial
        return SimpleNamespace(trials=trials, rows=rows, best=[], seconds=0.0, registry="r", metric_task="m")  # fmt: skip

    fake.run_sweep = run_sweep
    fake.start_sweep_ray = lambda exp, verbose=0: None  # no Ray for a stubbed sweep
    monkeypatch.setitem(sys.modules, "layerswap.experts.sweep", fake)
    return calls


def _sweep_yaml(tiny_world, tmp_path: Path) -> Path:
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(make_exp(tiny_world, "full", sweep=SWEEP).model_dump(mode="json")))
    return f


def test_continue_skips_a_sweep_that_ran_its_course(tiny_world, tmp_path, monkeypatch, capsys):
    calls = _fake_sweep(monkeypatch, lambda: {"a": "ok", "b": "error"})
    argv = ["train", str(_sweep_yaml(tiny_world, tmp_path)), "--out", str(tmp_path / "run"), "--continue"]  # fmt: skip
    assert main(argv) == 1  # a failed trial: the first run says so (the script stops there)
    assert calls == ["t"]
    capsys.readouterr()
    assert main(argv) == 0  # run again: it ran its course, failed trial and all
    assert calls == ["t"]
    folder = tmp_path / "run/train/t"
    said = f"{folder}: this expert sweep is already finished (2 trials, 1 of them failed); nothing to do"  # fmt: skip
    assert said in capsys.readouterr().out
    assert main([*argv[:-1], "--overwrite"]) == 1  # --overwrite still runs it again
    assert calls == ["t", "t"]


def _tune_state(folder: Path) -> None:
    """What Tune keeps, as sweep_tuner.restore_problem reads it before Ray starts: the tuner, a
    parseable experiment state and the searcher's state files (their unpickling, in make_tuner,
    is stubbed away with the sweep)."""
    (folder / "tuner.pkl").write_bytes(b"stub")
    state = {"runner_data": {}, "trial_data": []}
    (folder / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps(state))
    for name in ("search_gen_state-1.json", "searcher-state-1.pkl", "basic-variant-state-1.json"):  # fmt: skip
        (folder / name).write_text("stub")


def test_a_sweep_whose_trials_all_failed_is_not_finished(tiny_world, tmp_path, monkeypatch, capsys):  # fmt: skip
    # Every trial failed (e.g. its training data was not cached): no expert was registered, so
    # the searches after it in commands.sh would fail on a missing registry. It used to be
    # recorded finished (rows 0) and `--continue` skipped it, exit 0, with the cause fixed.
    folder = tmp_path / "run/train/t"

    def all_failed() -> dict:
        _tune_state(folder)
        return {"a": "error", "b": "error"}

    outcomes = [all_failed, lambda: {"a": "ok", "b": "ok"}]
    calls = _fake_sweep(monkeypatch, lambda: outcomes.pop(0)())
    argv = ["train", str(_sweep_yaml(tiny_world, tmp_path)), "--out", str(tmp_path / "run"), "--continue"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "expert sweep t: 2 trials, no checkpoint scored" in err and "trials a, b failed" in err
    assert "run it again with --continue (it retries the failed trials) or --overwrite" in err
    assert not (folder / "sweep_finished.json").exists()
    assert main(argv) == 0  # the cause fixed: --continue resumes it (Tune retries the trials)
    assert calls == ["t", "t resumed"]
    assert json.loads((folder / "sweep_finished.json").read_text())["rows"] == 2
    assert main(argv) == 0 and calls == ["t", "t resumed"]  # finished now: skipped


def test_a_record_of_no_rows_left_by_an_older_version_is_not_finished(tiny_world, tmp_path, monkeypatch, capsys):  # fmt: skip
    folder = tmp_path / "run/train/t"

    def all_failed() -> dict:
        _tune_state(folder)
        return {"a": "error"}

    outcomes = [all_failed, lambda: {"a": "ok"}]
    calls = _fake_sweep(monkeypatch, lambda: outcomes.pop(0)())
    argv = ["train", str(_sweep_yaml(tiny_world, tmp_path)), "--out", str(tmp_path / "run"), "--continue"]  # fmt: skip
    assert main(argv) == 1
    identity = json.loads((folder / ".layerswap.json").read_text())["identity"]
    old = {"identity": identity, "trials": {"a": "error"}, "rows": 0, "registry": "r"}
    (folder / "sweep_finished.json").write_text(json.dumps(old))  # as the old code wrote it
    capsys.readouterr()
    assert main(argv) == 0
    assert calls == ["t", "t resumed"]
    assert "already finished" not in capsys.readouterr().out


def test_continue_refuses_a_sweep_that_was_cut_short(tiny_world, tmp_path, monkeypatch, capsys):
    def cut_short() -> dict:
        raise RunFailed("the driver was lost")

    calls = _fake_sweep(monkeypatch, cut_short)
    argv = ["train", str(_sweep_yaml(tiny_world, tmp_path)), "--out", str(tmp_path / "run"), "--continue"]  # fmt: skip
    assert main(argv) == 1
    capsys.readouterr()
    # Cut before Ray Tune saved any state: nothing to resume, --overwrite says to (a sweep cut
    # after it did resumes: test_sweep_continue.py runs one, below its stub)
    assert main(argv) == 2
    assert "an expert sweep of t did not finish and cannot be resumed" in capsys.readouterr().err
    assert calls == ["t"]


def test_continue_resumes_a_sweep_cut_after_tune_saved_its_state(tiny_world, tmp_path, monkeypatch, capsys):  # fmt: skip
    folder = tmp_path / "run/train/t"

    def cut_after_saving() -> dict:
        _tune_state(folder)
        raise RunFailed("the driver was lost")

    outcomes = [cut_after_saving, lambda: {"a": "ok", "b": "ok"}]
    calls = _fake_sweep(monkeypatch, lambda: outcomes.pop(0)())
    argv = ["train", str(_sweep_yaml(tiny_world, tmp_path)), "--out", str(tmp_path / "run"), "--continue"]  # fmt: skip
    assert main(argv) == 1
    assert main(argv) == 0
    assert calls == ["t", "t resumed"]
    assert f"{folder}: resuming this unfinished expert sweep" in capsys.readouterr().out
    assert main(argv) == 0  # finished now: skipped
    assert calls == ["t", "t resumed"]


def test_an_interrupted_overwrite_puts_back_the_old_sweeps_rows_only(tiny_world, tmp_path, monkeypatch):  # fmt: skip
    # The new sweep's rows are appended as its trials end; when it fails, its folder is removed
    # and the old one put back, so rows pointing into the removed folder must go too (before,
    # they stayed, naming checkpoints that no longer exist).
    from layerswap.experts.registry import append_rows, expert_id, read_rows, registry_path

    run = tmp_path / "run"
    folder, reg = run / "train" / "t", registry_path(run)

    def row(name: str) -> dict:
        (folder / name).mkdir(parents=True, exist_ok=True)
        return {"expert_id": expert_id("t", name, 1), "kind": "math", "language": "en", "mode": "full",
                "path": str((folder / name).resolve()), "base": str(tiny_world / "base"), "trial_id": name,
                "step": 1, "samples": 4, "seed": 0, "hparams": "{}"}  # fmt: skip

    def old_sweep() -> dict:
        append_rows(reg, [row("old")])
        return {"old": "ok"}

    def new_then_lost() -> dict:
        append_rows(reg, [row("new")])
        raise RunFailed("the driver was lost")

    outcomes = [old_sweep, new_then_lost]
    _fake_sweep(monkeypatch, lambda: outcomes.pop(0)())
    argv = ["train", str(_sweep_yaml(tiny_world, tmp_path)), "--out", str(run)]
    assert main(argv) == 0
    assert main([*argv, "--overwrite"]) == 1
    assert [r["trial_id"] for r in read_rows(reg)] == ["old"]
    assert (folder / "old").is_dir() and not (folder / "new").exists()


# --------------------------------------------------------------------------------------- search


@pytest.fixture
def search_yaml(tiny_world, expert_pair, tmp_path) -> Path:
    from tests.search.search_fixtures import experiment

    f = tmp_path / "search.yaml"
    f.write_text(yaml.safe_dump(experiment(tiny_world, expert_pair).model_dump(mode="json")))
    return f


def _fake_search(monkeypatch, fail_promotion: list[bool]) -> list:
    """Stub run_search and promote; each call is recorded ("search" with its resume, "promote")."""
    from layerswap.search import promote as promote_mod
    from layerswap.search import search as search_mod

    calls: list = []

    def run_search(exp, run_dir, resume=False, **kw):
        calls.append(("search", resume))
        (Path(run_dir) / "search").mkdir(parents=True, exist_ok=True)
        write_marker(Path(run_dir) / "search", "search", "a stub's")  # as run_search marks it
        return SimpleNamespace(n_trials=6, trials_path="T", study_path="S")

    def promote(exp, run_dir, **kw):
        calls.append("promote")
        if fail_promotion and fail_promotion.pop(0):
            raise RunFailed("promotion: every model's evaluation failed")
        return SimpleNamespace(leaderboard="L", best_dir="B")

    monkeypatch.setattr(search_mod, "run_search", run_search)
    monkeypatch.setattr(promote_mod, "promote", promote)
    return calls


def test_continue_resumes_a_search_until_it_finished(search_yaml, tmp_path, monkeypatch, capsys):
    calls = _fake_search(monkeypatch, [True])
    run = tmp_path / "run"
    argv = ["search", str(search_yaml), "--out", str(run), "--continue"]
    assert main(argv) == 1  # the promotion failed: not finished
    assert main(argv) == 0  # resumed (a search there or not), promoted
    assert calls == [("search", True), "promote"] * 2
    capsys.readouterr()
    assert main(argv) == 0
    assert main([*argv, "--no-promote"]) == 0
    assert f"{run}: this search is already finished and promoted; nothing to do" in capsys.readouterr().out  # fmt: skip
    assert len(calls) == 4
    # a larger budget is another experiment's end: the search resumes
    data = yaml.safe_load(search_yaml.read_text())
    data["search"]["num_samples"] += 2
    search_yaml.write_text(yaml.safe_dump(data))
    assert main(argv) == 0
    assert calls[4:] == [("search", True), "promote"]


def test_a_finished_search_is_skipped_without_reading_task_data(search_yaml, tmp_path, monkeypatch, capsys):  # fmt: skip
    # The data check builds every task (seconds, more for a built-in one): a finished search
    # reads none, so it must neither pay for nor be refused by it (an uncached target since).
    from layerswap.search import preflight_data

    _fake_search(monkeypatch, [])
    checked: list = []
    monkeypatch.setattr(preflight_data, "uncached_problem", lambda exp, promote=True: checked.append(promote))  # fmt: skip
    argv = ["search", str(search_yaml), "--out", str(tmp_path / "run"), "--continue"]
    assert main(argv) == 0 and checked == [True]
    monkeypatch.setattr(preflight_data, "uncached_problem", lambda exp, promote=True: "data gone")
    assert main(argv) == 0
    assert "already finished and promoted; nothing to do" in capsys.readouterr().out


def test_a_search_without_promotion_is_not_finished_for_one_with(search_yaml, tmp_path, monkeypatch):  # fmt: skip
    calls = _fake_search(monkeypatch, [])
    argv = ["search", str(search_yaml), "--out", str(tmp_path / "run"), "--continue"]
    assert main([*argv, "--no-promote"]) == 0
    assert main(argv) == 0
    assert calls == [("search", True), ("search", True), "promote"]


# -------------------------------------------------------------------------------------- analyze


def test_continue_keeps_a_report_newer_than_its_run(analysis_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(analysis_run, run)  # a private copy: this test changes it
    argv = ["analyze", str(run), "--resamples", "20", "--max-experts", "1", "--continue"]
    assert main(argv) == 0
    report = run / "analysis" / "report.md"
    written = report.stat().st_mtime_ns
    capsys.readouterr()
    assert main(argv) == 0
    assert f"{run / 'analysis'}: the report of {run} is up to date; nothing to do" in capsys.readouterr().out  # fmt: skip
    assert report.stat().st_mtime_ns == written
    (run / "leaderboard.md").write_text("a promotion finished since\n")
    assert main(argv) == 0  # the run changed: its report is written again
    assert report.stat().st_mtime_ns > written
    moved = tmp_path / "moved"
    shutil.copytree(run, moved, symlinks=True)  # copied from the cluster: its report came along
    capsys.readouterr()
    assert main(["analyze", str(moved), *argv[2:]]) == 0, capsys.readouterr().err


# ---------------------------------------------------------------------------- the real command


@pytest.mark.slow
def test_train_continue_starts_resumes_then_skips(tiny_world, tmp_path, cli, tree_state):
    """The line of commands.sh, run three times: cut short by Ctrl-C, continued, then skipped."""
    steps, every = 120, 20
    f, log = _train_exp(tiny_world, tmp_path, "again", steps, every)
    out, run = tmp_path / "run", tmp_path / "run/train/again"
    argv = ("train", f, "--out", out, "--no-ray", "--continue")
    c = cli(*argv)  # nothing there yet: it starts
    c.wait_for(_has_checkpoints(run, 0), "the first checkpoint")
    c.interrupt(signal.SIGINT)
    kept = _checkpoint_steps(run)
    assert kept and kept[-1] < steps, f"not interrupted mid-run: checkpoints at {kept}"

    c = cli(*argv)  # unfinished: it resumes from the last checkpoint
    assert c.finish() == 0, c.tail()
    _check_every_step_once(log, [kept[-1]], steps)
    before = tree_state(run)

    c = cli(*argv)  # finished: said, nothing trained or touched
    assert c.finish() == 0, c.tail()
    assert f"{run}: this experiment is already trained; nothing to do" in c.stdout
    assert tree_state(run) == before
