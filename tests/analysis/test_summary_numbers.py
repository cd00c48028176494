"""`layerswap analyze`'s summary.json holds numbers as JSON numbers: a correlation's estimate
and 95 % CI, a paired difference and its CI, top-k overlap and regret are floats (null where
undefined), never the report table's text ("+0.39 [+0.05, +0.15]") a user's script would have to
parse. The tables (HTML, Markdown) keep their text.

Run: .venv/bin/python -m pytest -q tests/analysis/test_summary_numbers.py
"""

from __future__ import annotations

import json
import re

import numpy as np
from analysis_synth import promotion_run

from layerswap.analysis.indicators import indicators_section
from layerswap.analysis.load import load_run
from layerswap.analysis.paired import paired_section
from layerswap.analysis.report import _strict
from layerswap.analysis.sections import Table
from layerswap.analysis.stats import bootstrap_indices

TASK = "world_mgsm_direct_xa"
NUMBER_TEXT = re.compile(r"[-+]?\d+\.\d+")  # a number written as text


def _strings(value) -> list[str]:
    """Every string in a JSON-like value (dict keys too)."""
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in _strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def _as_written(data: dict) -> dict:
    """A section's data as summary.json holds it."""
    return json.loads(json.dumps(_strict(data), allow_nan=False))


def _paired_run(tmp_path, models: dict[str, list[float]]):
    return promotion_run(tmp_path, TASK, models)


def test_paired_differences_are_numbers(tmp_path):
    rng = np.random.default_rng(0)
    s = {m: rng.integers(0, 2, 40).astype(float).tolist() for m in ("base", "math_expert", "language_expert", "candidate_a")}  # fmt: skip
    s["math_expert"][:10] = [1.0] * 10  # the better expert
    sec = paired_section(_paired_run(tmp_path, s), n_resamples=300, seed=1)
    data = _as_written(sec.data)
    assert not [t for t in _strings(data) if NUMBER_TEXT.search(t)], data
    rows = {r["model"]: r for r in data[TASK]}
    diff = np.array(s["candidate_a"]) - np.array(s["math_expert"])
    lo, hi = np.quantile(diff[bootstrap_indices(40, 300, 1)].mean(axis=1), [0.025, 0.975])
    vs = rows["candidate_a"]["vs_better_expert"]
    assert vs["reference"] == "math_expert"
    assert np.allclose([vs["difference"], vs["low"], vs["high"]], [diff.mean(), lo, hi])
    assert rows["candidate_a"]["vs_base"]["reference"] == "base"
    assert rows["math_expert"]["vs_better_expert"] is None  # not against itself
    assert rows["base"]["vs_base"] is None
    # The table keeps its text, as the HTML and Markdown show it.
    table = next(b for b in sec.blocks if isinstance(b, Table)).df.set_index("model")
    assert table.loc["candidate_a", "vs better expert (math_expert)"] == f"{diff.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]"  # fmt: skip


def test_indicator_correlations_are_numbers(run_dir):
    sec = indicators_section(load_run(run_dir), n_resamples=50, seed=0)
    data = _as_written(sec.data)
    assert data and not [t for t in _strings(data) if NUMBER_TEXT.search(t)]
    tables = [b.df for b in sec.blocks if isinstance(b, Table)]  # one per task, in order
    for (task, rows), table in zip(data.items(), tables, strict=True):
        assert [r["indicator"] for r in rows] == table["indicator"].tolist()  # the table's order
        for row, cell in zip(rows, table.to_dict(orient="records"), strict=True):
            assert set(row) == {"level", "indicator", "n", "spearman", "kendall", "pearson", "top3_overlap", "top1_in_target_top3", "regret", "tied_at_top", "dev_items"}  # fmt: skip
            for method in ("spearman", "kendall", "pearson"):
                c = row[method]
                assert set(c) == {"estimate", "low", "high"}
                assert all(v is None or isinstance(v, float) for v in c.values()), (task, c)
                if c["estimate"] is not None and c["low"] is not None:
                    assert cell[f"{method} [95% CI]"] in (
                        f"{c['estimate']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}]",
                        "constant",
                    )
            assert row["top3_overlap"] is None or isinstance(row["top3_overlap"], float)
            hit = row["top1_in_target_top3"]  # the chance under a random tie-break
            assert hit is None or (isinstance(hit, float) and 0.0 <= hit <= 1.0)
            assert row["tied_at_top"] is None or isinstance(row["tied_at_top"], int)
            assert row["regret"] is None or isinstance(row["regret"], float)
            items = row["dev_items"]  # [fewest, most] dev items over the merges, None unknown
            assert items is None or (len(items) == 2 and all(isinstance(v, int) for v in items))
