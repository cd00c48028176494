"""The paired section: each promoted model against the better expert and the base, item by item,
from promotion's raw lm-eval JSON files (written here in lm-eval's layout).

Run: .venv/bin/python -m pytest -q tests/analysis/test_paired.py
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from analysis_synth import lm_eval_raw, promotion_run

from layerswap.analysis.load import PROMOTION, load_run, target_scores
from layerswap.analysis.paired import paired_section
from layerswap.analysis.sections import Table
from layerswap.analysis.stats import bootstrap_indices

TASK = "world_mgsm_direct_xa"


def _run(tmp_path, models: dict[str, list[float]], raw: bool = True):
    return promotion_run(tmp_path, TASK, models, raw)


def test_differences_and_cis_are_paired_over_the_items(tmp_path):
    rng = np.random.default_rng(0)
    s = {m: rng.integers(0, 2, 40).astype(float).tolist() for m in ("base", "math_expert", "language_expert", "candidate_a")}  # fmt: skip
    s["math_expert"][:10] = [1.0] * 10  # the better expert
    sec = paired_section(_run(tmp_path, s), n_resamples=500, seed=3)
    rows = {r["model"]: r for r in sec.data[TASK]}
    better = max(("math_expert", "language_expert"), key=lambda m: np.mean(s[m]))
    diff = np.array(s["candidate_a"]) - np.array(s[better])
    means = diff[bootstrap_indices(40, 500, 3)].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    vs = rows["candidate_a"]["vs_better_expert"]
    assert vs["reference"] == better
    assert (vs["difference"], vs["low"], vs["high"]) == pytest.approx((diff.mean(), lo, hi))
    assert rows[better]["vs_better_expert"] is None  # not against itself
    assert rows["candidate_a"]["target"] == round(float(np.mean(s["candidate_a"])), 4)
    assert [r["model"] for r in sec.data[TASK]] == sorted(s, key=lambda m: -np.mean(s[m]))


def test_a_run_without_raw_results_gets_a_note_and_a_broken_file_is_named(tmp_path):
    sec = paired_section(_run(tmp_path / "a", {"base": [1.0, 0.0], "math_expert": [1.0, 1.0]}, raw=False))  # fmt: skip
    assert not sec.data and "no per-item target results" in sec.blocks[0]
    run = _run(tmp_path / "b", {"base": [1.0, 0.0], "math_expert": [1.0, 1.0]})
    (run.root / "promotion" / "base.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"base\.json"):
        paired_section(run)


def test_pairs_are_matched_by_doc_id_on_the_items_both_logged(tmp_path):
    rng = np.random.default_rng(1)
    math = dict(enumerate(rng.integers(0, 2, 30).astype(float)))
    cand = {i + 1: v for i, v in enumerate(rng.integers(0, 2, 30).astype(float))}  # docs 1..30
    s = {"base": math, "math_expert": math, "language_expert": dict.fromkeys(math, 0.0), "candidate_a": cand}  # fmt: skip
    sec = paired_section(_run(tmp_path, s), n_resamples=300, seed=2)
    vs = {r["model"]: r for r in sec.data[TASK]}["candidate_a"]["vs_better_expert"]
    ids = range(1, 30)  # the 29 docs both logged
    diff = np.array([cand[i] - math[i] for i in ids])
    lo, hi = np.quantile(diff[bootstrap_indices(29, 300, 2)].mean(axis=1), [0.025, 0.975])
    assert (vs["difference"], vs["low"], vs["high"], vs["items"]) == pytest.approx((diff.mean(), lo, hi, 29))  # fmt: skip
    text = " ".join(b for b in sec.blocks if isinstance(b, str))
    assert "candidate_a vs math_expert: paired on the 29 doc ids both logged (1 of candidate_a's 30 and 1 of math_expert's 30 dropped)" in text  # fmt: skip


def test_models_with_no_doc_id_in_common_are_not_paired_and_said(tmp_path):
    s = {"base": {0: 1.0, 1: 0.0}, "math_expert": {5: 1.0, 6: 1.0}}
    sec = paired_section(_run(tmp_path, s))
    assert all(r["vs_base"] is r["vs_better_expert"] is None for r in sec.data[TASK])
    assert "math_expert vs base: no doc id in common" in " ".join(b for b in sec.blocks if isinstance(b, str))  # fmt: skip


def test_one_model_with_other_items_blanks_only_its_own_pairs_and_is_named(tmp_path):
    full = [1.0, 0.0, 1.0, 0.0]
    s = {"base": full, "math_expert": [1.0, 1.0, 1.0, 0.0], "candidate_a": [1.0, 1.0, 0.0, 1.0]}
    s["language_expert"] = [0.0, 0.0, 1.0]  # one item short
    sec = paired_section(_run(tmp_path, s), n_resamples=50)
    rows = {r["model"]: r for r in sec.data[TASK]}
    assert rows["candidate_a"]["vs_better_expert"]["reference"] == "math_expert"
    assert rows["candidate_a"]["vs_base"]["difference"] == pytest.approx(0.25)
    assert rows["language_expert"]["vs_base"]["items"] == 3  # paired on the docs both logged
    text = " ".join(b for b in sec.blocks if isinstance(b, str))
    assert "language_expert vs base: paired on the 3 doc ids both logged (0 of language_expert's 3 and 1 of base's 4 dropped)" in text  # fmt: skip


def test_a_missing_raw_file_is_named_and_the_better_expert_comes_from_promotion(tmp_path):
    s = {"base": [0.0, 1.0, 0.0, 0.0], "math_expert": [1.0, 1.0, 1.0, 0.0]}
    s |= {"language_expert": [0.0, 0.0, 0.0, 1.0], "candidate_a": [1.0, 1.0, 0.0, 1.0]}
    run = _run(tmp_path, s)
    (run.root / "promotion" / "math_expert.json").unlink()  # the better expert's items are gone
    sec = paired_section(run, n_resamples=50)
    rows = {r["model"]: r for r in sec.data[TASK]}
    assert "math_expert" not in rows
    assert rows["candidate_a"]["vs_better_expert"] is None  # not against the language expert
    assert rows["candidate_a"]["vs_base"]["difference"] == pytest.approx(0.5)
    table = next(b for b in sec.blocks if isinstance(b, Table)).df.set_index("model")
    cell = table.loc["candidate_a", "vs better expert (math_expert)"]
    assert cell == "n/a: math_expert's raw lm-eval JSON missing"
    assert "raw lm-eval JSON missing for math_expert" in " ".join(b for b in sec.blocks if isinstance(b, str))  # fmt: skip


def test_every_raw_file_missing_names_the_models(tmp_path):
    run = _run(tmp_path, {"base": [1.0, 0.0], "math_expert": [1.0, 1.0]})
    for m in ("base", "math_expert"):
        (run.root / "promotion" / f"{m}.json").unlink()
    sec = paired_section(run)
    assert not sec.data and "raw lm-eval JSON missing for base, math_expert" in sec.blocks[0]


def test_several_rows_of_a_model_average_per_item_as_its_target_score_does(tmp_path):
    s = {"base": [0.0, 0.0, 1.0, 0.0], "math_expert": [1.0, 0.0, 0.0, 0.0], "candidate_a": [1.0, 1.0, 1.0, 0.0]}  # fmt: skip
    s["language_expert"] = [0.0, 0.0, 0.0, 0.0]
    run = _run(tmp_path, s)
    seed1 = run.root / "promotion" / "math_expert_seed1.json"
    seed1.write_text(json.dumps(lm_eval_raw(TASK, [1.0, 1.0, 1.0, 1.0])))
    prom = run.promotion
    row = prom[prom["model"] == "math_expert"].assign(value=1.0, raw_json=str(seed1))
    prom = pd.concat([prom, row], ignore_index=True)
    prom.loc[prom["model"] == "candidate_a", "split"] = None  # no split: test, as target_scores
    prom.to_parquet(run.root / PROMOTION)
    run = load_run(run.root)
    sec = paired_section(run, n_resamples=50)
    rows = {r["model"]: r for r in sec.data[TASK]}
    assert rows["math_expert"]["target"] == target_scores(run, TASK).set_index("model").loc["math_expert", "value"] == 0.625  # fmt: skip
    vs = rows["candidate_a"]["vs_better_expert"]
    assert (vs["reference"], vs["difference"]) == ("math_expert", pytest.approx(0.75 - 0.625))
    assert "math_expert: 2 promotion rows (seeds)" in " ".join(b for b in sec.blocks if isinstance(b, str))  # fmt: skip


@pytest.mark.parametrize("how", ["no row", "NaN"])
def test_an_expert_without_a_score_leaves_no_better_expert_and_is_named(tmp_path, how):
    s = {"base": [0.0, 0.0, 0.0, 0.0], "math_expert": [1.0, 1.0, 1.0, 0.0]}
    s |= {"language_expert": [0.0, 0.0, 0.0, 1.0], "candidate_a": [1.0, 1.0, 0.0, 1.0]}
    run = _run(tmp_path, s)
    prom = run.promotion
    if how == "no row":  # its evaluation failed: promotion writes no row for it
        prom = prom[prom["model"] != "math_expert"]
    else:
        prom = prom.assign(value=prom["value"].where(prom["model"] != "math_expert"))
    prom.to_parquet(run.root / PROMOTION)
    sec = paired_section(load_run(run.root), n_resamples=50)
    rows = {r["model"]: r for r in sec.data[TASK]}
    assert rows["candidate_a"]["vs_better_expert"] is None  # not the language expert's +0.5
    assert rows["candidate_a"]["vs_base"]["difference"] == pytest.approx(0.75)
    table = next(b for b in sec.blocks if isinstance(b, Table)).df
    assert not [c for c in table.columns if c.startswith("vs better expert")]
    why = "no promotion row" if how == "no row" else "score NaN"
    text = " ".join(b for b in sec.blocks if isinstance(b, str))
    assert f"no comparison with the better expert: math_expert ({why})" in text


@pytest.mark.parametrize("baselines", [["base", "soup_uniform"], ["base", "experts"]])
def test_experts_are_expected_only_when_promotion_was_asked_for_them(tmp_path, baselines):
    # promote.baselines without `experts`: no expert was scored, none failed
    s = {"base": [0.0, 0.0, 1.0, 0.0], "soup_uniform": [1.0, 0.0, 1.0, 0.0], "candidate_a": [1.0, 1.0, 0.0, 1.0]}  # fmt: skip
    run = _run(tmp_path, s)
    pool = {"task": [{"path": "/x/math", "kind": "full"}], "language": [{"path": "/x/lang", "kind": "full"}], "base": "/x/base"}  # fmt: skip
    (run.root / "search").mkdir()
    (run.root / "search/pool.json").write_text(json.dumps(pool))
    (run.root / "search/experiment.json").write_text(json.dumps({"promote": {"baselines": baselines}}))  # fmt: skip
    sec = paired_section(load_run(run.root), n_resamples=50)
    text = " ".join(b for b in sec.blocks if isinstance(b, str))
    if "experts" in baselines:  # asked for, not scored: their evaluations failed
        assert "math_expert (no promotion row), language_expert (no promotion row)" in text
    else:
        assert "no comparison with the better expert" not in text and "math_expert" not in text
