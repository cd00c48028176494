"""`--continue` (train, search, analyze: what a study's commands.sh passes) refuses what it cannot
continue in one line, exit 2, nothing changed: test_bad_input.py's own check, its tripwires armed.
Its runs are tests/cli/test_rerun_commands.py.

Run: .venv/bin/python -m pytest -q tests/cli/test_bad_input_continue.py
"""

from __future__ import annotations

import pytest

from tests.cli.test_bad_input import (  # noqa: F401  (bases_in_tmp, env, tripwires: fixtures)
    ABSENT_FLAG,
    Env,
    bases_in_tmp,
    case_list,
    env,
    tripwires,
)
from tests.cli.test_bad_input import (
    test_bad_input_is_refused_and_changes_nothing as refused_and_unchanged,
)
from tests.cli.test_rerun_commands import SWEEP

CASES, case = case_list()


@case
def train__continue_with_resume(e: Env):
    argv = ["train", e.train_exp(), "--out", e.at("run"), "--continue", "--resume"]
    return argv, ["--continue and --resume: give one"]


@case
def train__continue_with_overwrite(e: Env):
    argv = ["train", e.train_exp(), "--out", e.at("run"), "--continue", "--overwrite"]
    return argv, ["--continue and --overwrite: give one"]


@case
def train__continue_of_a_sweep_that_did_not_finish(e: Env):
    f = e.train_exp(sweep=SWEEP)
    run = e.train_run("run", f)  # marked as this experiment's sweep, never recorded finished
    argv = ["train", f, "--out", e.at("run"), "--continue"]
    # (no Ray Tune state: it was marked, and cut before Tune saved any)
    said = f"{run}: an expert sweep of t did not finish and cannot be resumed: its Ray Tune state (tuner.pkl, experiment_state-*.json, search_gen_state-*.json, searcher-state-*.pkl) is missing; pass --overwrite"  # fmt: skip
    return argv, [said]


@case
def train__continue_of_another_experiments_sweep(e: Env):
    run = e.folder("run/train/t", kind="train")
    argv = ["train", e.train_exp(sweep=SWEEP), "--out", e.at("run"), "--continue"]
    said = f"{run}: holds an unfinished expert sweep of a different experiment (config changed); a sweep resumes only as it started"  # fmt: skip
    return argv, [said]


@case
def search__continue_with_resume(e: Env):
    argv = ["search", e.search_exp(), "--out", e.at("run"), "--continue", "--resume"]
    return argv, ["--continue and --resume: give one"]


@case
def search__continue_with_overwrite(e: Env):
    argv = ["search", e.search_exp(), "--out", e.at("run"), "--continue", "--overwrite"]
    return argv, ["--continue and --overwrite: give one"]


@case
def analyze__continue_with_overwrite(e: Env):
    argv = ["analyze", str(e.run), "--out", e.at("report"), "--continue", "--overwrite"]
    return argv, ["--continue and --overwrite: give one"]


@case
def analyze__continue_where_another_runs_report_is(e: Env):
    out = e.folder("report", kind="analysis")  # its marker names another run
    return ["analyze", str(e.run), "--out", out, "--continue"], [f"{out}: already exists; {ABSENT_FLAG}"]  # fmt: skip


@pytest.mark.parametrize("make", CASES)
def test_what_continue_cannot_continue_is_refused(make, env, tree_state, capsys):  # noqa: F811
    refused_and_unchanged(make, env, tree_state, capsys)
