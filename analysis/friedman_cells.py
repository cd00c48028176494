"""The Friedman test of the treatments section: which cells it ranks (test-split scores only,
gaps dropped greedily), what it left out, and the paragraph that says both.

Run: .venv/bin/python -m pytest -q tests/analysis/test_treatments_two_languages.py
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from layerswap.analysis.sections import Section
from layerswap.analysis.stats import friedman


class FriedmanCells(NamedTuple):
    """What the Friedman test ranks, and what it left out and why."""

    matrix: np.ndarray  # conditions × treatments, each cell a mean over instances
    treatments: list[str]
    conditions: list[str]
    dev_split: dict[str, list[str]]  # treatment -> conditions left out: dev-split scores only
    all_conditions: list[str]  # every condition some treatment has a score in
    dropped_treatments: list[str]  # left out by the greedy drop of gaps
    dropped_conditions: list[str]
    no_score: dict[str, list[str]]  # treatment -> conditions with an instance scored NaN


def friedman_cells(v: pd.DataFrame) -> FriedmanCells:
    """Conditions × treatments matrix of the mean `value` per (`blk`, `label`).

    Test-split scores only: a dev-split registry score is on other items than promotion's test
    scores, so ranking the two against each other would compare splits, not treatments. Missing
    cells are then removed greedily: repeatedly drop the condition or treatment with the
    largest share of gaps. Both removals are returned, for the text to name, as are the
    instances whose score is NaN (left out of their cell's mean; a cell of only those is a gap).

    Args:
        v: rows with columns label (treatment / SFT type), blk (condition), value, split.
    Returns:
        FriedmanCells.
    """
    test = v[v["split"] != "dev"]
    nan = test[test["value"].isna()].drop_duplicates(["label", "blk"])
    no_score: dict[str, list[str]] = {}
    for lab, blk in sorted(zip(nan["label"], nan["blk"], strict=True)):
        no_score.setdefault(lab, []).append(blk)
    test = test[test["value"].notna()]
    dev_only = v[v["split"] == "dev"].drop_duplicates(["label", "blk"])
    test_cells = set(zip(test["label"], test["blk"], strict=True))
    dev: dict[str, list[str]] = {}
    for lab, blk in sorted(zip(dev_only["label"], dev_only["blk"], strict=True)):
        if (lab, blk) not in test_cells:
            dev.setdefault(lab, []).append(blk)
    m = test.pivot_table(index="blk", columns="label", values="value", aggfunc="mean")
    gone_t, gone_c = [], []
    while m.size and m.isna().to_numpy().any():
        rows, cols = m.isna().mean(axis=1), m.isna().mean(axis=0)
        if rows.max() >= cols.max():
            gone_c.append(rows.idxmax())
            m = m.drop(index=rows.idxmax())
        else:
            gone_t.append(cols.idxmax())
            m = m.drop(columns=cols.idxmax())
    return FriedmanCells(
        m.to_numpy(float),
        list(m.columns),
        list(m.index),
        dev,
        sorted(set(v["blk"])),
        gone_t,
        gone_c,
        no_score,
    )


def friedman_paragraph(sec: Section, cells: FriedmanCells) -> None:
    """The Friedman test's paragraph, saying what it ranks over what and what it left out; its
    numbers (and the left-out cells) to sec.data["friedman"].

    Args:
        sec: the treatments section to append to.
        cells: friedman_cells' result.
    """
    mat, treats, blocks = cells.matrix, cells.treatments, cells.conditions
    left = _left_out(cells)
    what = (
        "a condition is a base model and target language; a treatment is one of the table's rows "
        "with its SFT type, the base model and the extra baselines excluded; each cell is the "
        "treatment's mean over its instances"
    )
    if len(treats) < 3 or len(blocks) < 2:
        sec.text(
            f"Friedman test: not computable (needs >= 3 treatments with scores in >= 2 common "
            f"conditions; this run has {len(treats)} treatment(s) over {len(blocks)} condition(s); "
            f"{what}).{left}"
        )
        return
    f = friedman(mat, treats)
    head = (
        f"Friedman test over {f.n} conditions (base model × target language) × {f.k} treatments "
        f"({what}; conditions: {', '.join(blocks)})"
    )
    sec.data["friedman"] = {
        "conditions": f.n,
        "treatments": f.k,
        "df": f.k - 1,
        "statistic": f.statistic,
        "p_value": f.p_value,
        "p_method": f.p_method,
        "p_asymptotic": f.p_asymptotic,
        "mean_ranks": f.mean_ranks,
        "left_out_dev_split": cells.dev_split,
        "left_out_no_score": cells.no_score,
        "left_out_for_gaps": {
            "treatments": cells.dropped_treatments,
            "conditions": cells.dropped_conditions,
        },
    }
    if np.isnan(f.statistic):
        sec.text(f"{head}: cannot tell (every treatment scores the same in every condition).{left}")
        return
    ranks = ", ".join(f"{t} {r:.2f}" for t, r in sorted(f.mean_ranks.items(), key=lambda kv: -kv[1]))  # fmt: skip
    sec.text(
        f"{head}: χ² = {f.statistic:.3f} with {f.k - 1} degrees of freedom, {_p_text(f)}. "
        f"Mean ranks (of {f.k}, higher = better): {ranks}.{left}"
    )


def _left_out(cells: FriedmanCells) -> str:
    """The sentences naming what the Friedman test left out ('' when nothing)."""
    out = ""
    if cells.dev_split:
        out += (
            " Left out as dev-split scores (registry indicators on other items than promotion's "
            f"test split, which the test ranks): {_dev_cells(cells)}."
        )
    if cells.no_score:
        each = ", ".join(f"{t} ({', '.join(c)})" for t, c in cells.no_score.items())
        out += f" Left out as no score (NaN in promotion's results; the cell averages the rest, a cell of none is a gap): {each}."  # fmt: skip
    gaps = [f"treatment {t}" for t in cells.dropped_treatments]
    gaps += [f"condition {c}" for c in cells.dropped_conditions]
    if gaps:
        out += (
            " Left out for gaps (the test needs every treatment scored in every condition; the "
            f"one with the most gaps goes first): {', '.join(gaps)}."
        )
    return out


def _dev_cells(cells: FriedmanCells) -> str:
    """'treatment (every condition)' or 'treatment (condition, ...)', per dev-only treatment."""
    return ", ".join(
        f"{t} ({'every condition' if c == cells.all_conditions else ', '.join(c)})"
        for t, c in cells.dev_split.items()
    )


def _p_text(f) -> str:
    """The p-value and which it is: exact over every within-condition ordering where those are
    few enough to enumerate, else the χ² approximation (named so; poor with few conditions)."""
    if f.p_method == "exact permutation":
        n = math.factorial(f.k) ** f.n
        return f"exact permutation p = {f.p_value:.4f} (over all {n} orderings within the conditions; asymptotic χ² p {f.p_asymptotic:.4f})"  # fmt: skip
    return f"asymptotic χ² p = {f.p_value:.4f} (too many orderings to enumerate for an exact p)"
