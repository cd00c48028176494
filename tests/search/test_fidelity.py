"""The fidelity policies' pure rules: rungs, the driver's gates from the table, the trial's stop.

Run: .venv/bin/python -m pytest -q tests/search/test_fidelity.py
"""

from __future__ import annotations

import json

import pytest

from layerswap.search.fidelity import (
    POLICIES,
    gates,
    hoeffding_upper,
    policy_of,
    rung_spans,
    rung_values,
    stops,
)
from layerswap.spaces.search_experiment import Fidelity


def _row(status, objective=None, rungs=()):
    return {"status": status, "objective": objective, "rungs": json.dumps(list(rungs))}


def test_hoeffding_bound():
    assert hoeffding_upper(0.5, 10, 10, 0.05) == 0.5
    ub = hoeffding_upper(0.2, 25, 100, 0.05)
    assert 0.2 < ub < 0.5
    assert hoeffding_upper(0.2, 50, 100, 0.05) < ub


def test_each_policy_ends_on_every_item():
    fid = Fidelity(policy="halving", rungs=[0.1, 0.3])
    assert POLICIES["halving"].shares(fid) == [0.1, 0.3, 1.0]
    assert POLICIES["screen"].shares(fid) == [0.25, 1.0]
    assert POLICIES["none"].shares(fid) == [1.0]
    assert policy_of(fid, multi_objective=True) is POLICIES["none"]  # no scalar to rank by


def test_screen_gate_is_the_kth_best_full_objective():
    rows = [_row("ok", v, [(4, v), (8, v)]) for v in (0.2, 0.6, 0.4)]
    rows.append(_row("pruned", None, [(4, 0.9)]))  # a low-fidelity value never counts
    assert gates(Fidelity(policy="screen", keep_top=2), rows) == [0.4]
    assert gates(Fidelity(policy="screen", keep_top=4), rows) == [None]


def test_halving_gates_keep_the_best_third_once_eta_trials_reached_a_rung():
    fid = Fidelity(policy="halving", rungs=[0.25, 0.5], eta=3)
    rows = [
        _row("ok", 0.5, [(2, 0.4), (4, 0.45), (8, 0.5)]),
        _row("pruned", None, [(2, 0.1)]),
        _row("pruned", None, [(2, 0.3), (4, 0.2)]),
        _row("duplicate", 0.5, [(2, 0.4), (4, 0.45), (8, 0.5)]),  # served: not counted again
        _row("failed"),
    ]
    # rung 0: [0.4, 0.1, 0.3] -> the best ceil(3/3) = 1 goes on: 0.4; rung 1: 2 < eta values
    assert gates(fid, rows) == [0.4, None]
    rows.append(_row("pruned", None, [(2, 0.35), (4, 0.3)]))
    rows.append(_row("pruned", None, [(2, 0.2)]))
    # rung 0: 5 values, ceil(5/3) = 2nd best 0.35; rung 1: [0.45, 0.2, 0.3] -> 0.45
    assert gates(fid, rows) == [0.35, 0.45]


def test_stops_compares_the_bound_or_the_value():
    screen, halving = POLICIES["screen"], POLICIES["halving"]
    assert stops(screen, 0, value=0.1, bound=0.5, gate_values=[0.4]) is False
    assert stops(screen, 0, value=0.1, bound=0.3, gate_values=[0.4]) is True
    assert stops(halving, 0, value=0.3, bound=0.9, gate_values=[0.4, None]) is True
    assert stops(halving, 1, value=0.0, bound=0.0, gate_values=[0.4, None]) is False
    assert stops(halving, 0, value=0.0, bound=0.0, gate_values=None) is False


def test_rung_values_read_json_or_lists():
    assert rung_values({"rungs": "[[2, 0.5], [4, 0.25]]"}) == [(2, 0.5), (4, 0.25)]
    assert rung_values({"rungs": [[2, 0.5]]}) == [(2, 0.5)]
    assert rung_values({}) == []


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"rungs": [0.5, 0.25]}, "must increase"),
        ({"rungs": [0.5, 1.0]}, "within (0, 1)"),
        ({"policy": "screen", "screen": None}, "needs a screen share"),
        ({"eta": 1}, "greater than or equal to 2"),
    ],
)
def test_bad_fidelity_settings_name_the_value(fields, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Fidelity(**fields)


def test_screen_null_still_means_no_early_stop():
    assert Fidelity(screen=None).policy == "none"
    assert Fidelity(screen=None, policy="halving").policy == "halving"


def test_rung_spans_take_disjoint_prefixes_and_merge_empty_rungs():
    spans = rung_spans([0.125, 0.25, 0.5, 1.0], {"a": 8, "b": 100})
    assert spans == [
        {"a": (0, 1), "b": (0, 13)},
        {"a": (1, 2), "b": (13, 25)},
        {"a": (2, 4), "b": (25, 50)},
        {"a": (4, 8), "b": (50, 100)},
    ]
    # 2 items: 1/8 and 1/4 both take the first; the 1/4 rung adds nothing and is merged
    assert rung_spans([0.125, 0.25, 0.5, 1.0], {"a": 2}) == [{"a": (0, 1)}, {"a": (1, 2)}]
    assert rung_spans([0.5, 1.0], {"a": 2, "b": 1}) == [{"a": (0, 1), "b": (0, 1)}, {"a": (1, 2)}]


def test_floor_is_what_plan_bounds_a_search_from_below_by():
    fid = Fidelity(keep_top=4, screen=0.2, eta=3, rungs=[0.1, 0.5])
    assert POLICIES["screen"].floor(fid) == (4, 0.2)
    assert POLICIES["halving"].floor(fid) == (3, 0.1)
    assert POLICIES["none"].floor(fid) == (None, 1.0)
