"""`layerswap search --resume` with another fidelity or objective than the run's is refused.

A resumed search ranks each new trial's rung values against the earlier rows' by rung index; rows
scored under another policy, other rungs or another eta are not comparable, so a changed
`search.fidelity` (or `search.multi_objective`, which changes what a row's objective is) is
refused in one line naming the field, the saved value and the new one (exit
2, no traceback, nothing changed: test_bad_input.py's own check, its tripwires armed).
Run: .venv/bin/python -m pytest -q tests/cli/test_bad_input_resume.py
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.cli.test_bad_input import (  # noqa: F401  (bases_in_tmp, env, tripwires: fixtures)
    Env,
    bases_in_tmp,
    case_list,
    env,
    tripwires,
)
from tests.cli.test_bad_input import (
    test_bad_input_is_refused_and_changes_nothing as refused_and_unchanged,
)

CASES, case = case_list()


def _resumed_with(e: Env, old: dict, new: dict, field: str = "fidelity") -> tuple[list[str], str]:
    """RUN/search started with search.`field` `old`; (the --resume command line with `new`, its
    sdir)."""
    data = e.search_data()
    before, after = copy.deepcopy(data), copy.deepcopy(data)
    before["search"][field], after["search"][field] = old, new
    sdir = e.earlier_search("run", before)
    f = e.yaml("search.yaml", after)
    return ["search", f, "--out", e.at("run"), "--resume"], sdir


@case
def search__resume_with_another_fidelity_policy(e: Env):
    argv, sdir = _resumed_with(e, {"policy": "screen", "screen": 0.5}, {"policy": "halving"})
    return argv, [
        "--resume: search.fidelity.policy was 'screen', is now 'halving'",
        f"{sdir}/experiment.json",
    ]


@case
def search__resume_with_other_halving_rungs(e: Env):
    old, new = {"policy": "halving"}, {"policy": "halving", "rungs": [0.25, 0.5]}
    argv, _ = _resumed_with(e, old, new)
    return argv, ["search.fidelity.rungs was [0.125, 0.25, 0.5], is now [0.25, 0.5]"]


@case
def search__resume_with_another_halving_eta(e: Env):
    argv, _ = _resumed_with(e, {"policy": "halving", "eta": 3}, {"policy": "halving", "eta": 2})
    return argv, ["search.fidelity.eta was 3, is now 2"]


@case
def search__resume_of_a_run_from_before_fidelity_policies(e: Env):
    # Its experiment.json has no `policy`: it screened (screen 0.25). Read with today's default
    # it would pass as halving, and halving would rank rows that were screened.
    argv, sdir = _resumed_with(e, {}, {})
    saved = Path(sdir) / "experiment.json"
    data = json.loads(saved.read_text())
    del data["search"]["fidelity"]["policy"]
    saved.write_text(json.dumps(data))
    return argv, ["--resume: search.fidelity.policy was 'screen', is now 'halving'"]


@case
def search__resume_with_another_objective(e: Env):
    # Two objectives give the study two directions and turn the fidelity off: the earlier rows'
    # single objective is not what the resumed trials would report.
    argv, _ = _resumed_with(e, False, True, field="multi_objective")
    return argv, ["--resume: search.multi_objective was False, is now True"]


@case
def search__refused_resume_of_a_finished_search(e: Env):
    """A refused --resume leaves a finished search finished: it used to remove
    RUN/search/finished.json first, and the next --continue searched and promoted it again."""
    argv, sdir = _resumed_with(e, {"policy": "halving", "eta": 3}, {"policy": "halving", "eta": 2})
    (Path(sdir) / "finished.json").write_text(json.dumps({"experiment": {}, "promoted": True}))
    return argv, ["search.fidelity.eta was 3, is now 2"]


@pytest.mark.parametrize("make", CASES)
def test_changed_fidelity_on_resume_is_refused(make, env, tree_state, capsys):  # noqa: F811
    refused_and_unchanged(make, env, tree_state, capsys)
