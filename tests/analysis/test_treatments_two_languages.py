"""The treatments section of a run with two target languages: "layer swap" is chosen per target
language (one choice over both left the other language's cell empty, and the greedy drop of gaps
then silently removed the swap from the Friedman test); the Friedman test ranks test-split scores
only and names what it left out (dev-split registry cells, treatments and conditions with gaps).

Run: .venv/bin/python -m pytest -q tests/analysis/test_treatments_two_languages.py
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from layerswap.analysis.load import load_run
from layerswap.analysis.report import _strict
from layerswap.analysis.sections import Table
from layerswap.analysis.treatments import friedman_matrix, treatment_values, treatments_section

BASE = "models/base"


def _two_language_run(root, *, swap_on_xb: bool = True):
    """Experts M (math), LA/LB (language xa/xb), XA/XB (data mixing, registry dev MGSM only);
    candidates a1, a2 (built with LA, objectives 0.90, 0.85) promoted on xa, b1, b2 (LB, 0.50,
    0.45) on xb: two searches, one per language, their objectives on other scales."""
    for sub in ("experts", "search", "promotion"):
        (root / sub).mkdir(parents=True)

    def expert(eid, kind, lang, mode, xa, xb):
        return dict(expert_id=eid, kind=kind, language=lang, mode=mode, base=BASE,
                    ind__world_mgsm_direct_xa_dev=xa, ind__world_mgsm_direct_xb_dev=xb)  # fmt: skip

    pd.DataFrame([expert("M", "math", "en", "full", 0.30, 0.28),
                  expert("LA", "language", "xa", "full", 0.10, np.nan),
                  expert("LB", "language", "xb", "full", np.nan, 0.12),
                  expert("XA", "math", "xa", "mix", 0.60, np.nan),
                  expert("XB", "math", "xb", "mix", np.nan, 0.05)]).to_parquet(root / "experts/registry.parquet")  # fmt: skip
    trials = [(rid, lang, obj) for rid, lang, obj in
              (("a1", "LA", 0.90), ("a2", "LA", 0.85), ("b1", "LB", 0.50), ("b2", "LB", 0.45))]  # fmt: skip
    pd.DataFrame([dict(trial_id=rid, recipe_id=rid, task_expert_id="M", language_expert_id=lang,
                       status="ok", objective=obj) for rid, lang, obj in trials]).to_parquet(root / "search/trials.parquet")  # fmt: skip
    rows = []
    for task, cands in (("world_mgsm_direct_xa", (("a1", 0.40), ("a2", 0.38))),
                        ("world_mgsm_direct_xb", (("b1", 0.42), ("b2", 0.36)) if swap_on_xb else ())):  # fmt: skip
        for model, v in (("base", 0.20), ("math_expert", 0.29), ("language_expert", 0.15)):
            rows.append(dict(model=model, kind="baseline", recipe_id=None, task=task, split="test", value=v, n_items=250))  # fmt: skip
        for rid, v in cands:
            rows.append(dict(model=f"candidate_{rid}", kind="candidate", recipe_id=rid, task=task, split="test", value=v, n_items=250))  # fmt: skip
    pd.DataFrame(rows).to_parquet(root / "promotion/results.parquet")
    return load_run(root)


def _texts(sec) -> list[str]:
    return [b for b in sec.blocks if isinstance(b, str)]


def test_layer_swap_is_chosen_per_target_language_and_ranked(tmp_path):
    """xb's swap is b1 (its best objective among the xb candidates), not missing because a1 had
    the best objective overall; the Friedman test ranks it over both languages."""
    sec = treatments_section(_two_language_run(tmp_path))
    t3 = next(b.df for b in sec.blocks if isinstance(b, Table) and b.caption.startswith("Per language"))  # fmt: skip
    assert t3.loc["xa", "layer swap / full"] == "0.400"
    assert t3.loc["xb", "layer swap / full"] == "0.420"
    note = next(t for t in _texts(sec) if t.startswith('"layer swap" is one model'))
    assert "world_mgsm_direct_xa: candidate_a1" in note and "world_mgsm_direct_xb: candidate_b1" in note  # fmt: skip
    f = json.loads(json.dumps(_strict(sec.data), allow_nan=False))["friedman"]
    assert f["conditions"] == 2 and "layer swap / full" in f["mean_ranks"]
    assert f["mean_ranks"]["layer swap / full"] == 3.0


def test_friedman_leaves_out_dev_split_cells_and_says_so(tmp_path):
    """Data mixing has only the registry's dev-split MGSM: not ranked against promotion's test
    scores, and named in the text and in summary.json."""
    sec = treatments_section(_two_language_run(tmp_path))
    f = json.loads(json.dumps(_strict(sec.data), allow_nan=False))["friedman"]
    assert "data mixing / full" not in f["mean_ranks"] and f["treatments"] == 3
    assert f["left_out_dev_split"] == {"data mixing / full": [f"{BASE} / xa", f"{BASE} / xb"]}
    text = next(t for t in _texts(sec) if t.startswith("Friedman"))
    assert "Left out as dev-split scores" in text and "data mixing / full (every condition)" in text
    # 2 conditions × 3 treatments: 36 orderings, so the p is exact, and the text says so
    assert f["p_method"] == "exact permutation" and f"exact permutation p = {f['p_value']:.4f}" in text  # fmt: skip


def test_the_greedy_drop_names_what_it_removes(tmp_path):
    """Without a candidate promoted on xb the swap has a gap there: the test drops the swap, and
    the text and summary.json say so (it used to vanish without a word)."""
    run = _two_language_run(tmp_path, swap_on_xb=False)
    cells = friedman_matrix(treatment_values(run))
    assert cells.dropped_treatments == ["layer swap / full"] and not cells.dropped_conditions
    sec = treatments_section(run)
    text = next(t for t in _texts(sec) if t.startswith("Friedman"))
    assert "Left out for gaps" in text and "treatment layer swap / full" in text, text


def test_a_nan_score_is_named_not_dropped_silently(tmp_path):
    """math_expert's xb score is NaN (promotion wrote no number): the tables leave it out, the
    section names it, and the Friedman test names the cell it could not rank (the registry's
    dev score fills the table's cell, marked †, as where promotion has no score)."""
    run = _two_language_run(tmp_path)
    prom = run.promotion
    nan = (prom["model"] == "math_expert") & (prom["task"] == "world_mgsm_direct_xb")
    prom.assign(value=prom["value"].mask(nan)).to_parquet(tmp_path / "promotion/results.parquet")
    sec = treatments_section(load_run(tmp_path))
    t3 = next(b.df for b in sec.blocks if isinstance(b, Table) and b.caption.startswith("Per language"))  # fmt: skip
    # xb's cell: the registry's dev score (marked), as where promotion has no score
    assert t3.loc["xb", "math-only / full"] == "0.280†" and t3.loc["xa", "math-only / full"] == "0.290"  # fmt: skip
    texts = " ".join(_texts(sec))
    assert "left out of the tables and the Friedman test: math_expert (math-only / full, xb)" in texts  # fmt: skip
    cells = friedman_matrix(treatment_values(load_run(tmp_path)))
    assert cells.no_score == {"math-only / full": [f"{BASE} / xb"]}
    text = next(t for t in _texts(sec) if t.startswith("Friedman"))
    assert "Left out as no score (NaN in promotion's results" in text and f"math-only / full ({BASE} / xb)" in text  # fmt: skip
