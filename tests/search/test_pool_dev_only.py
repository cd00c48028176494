"""registry_picks ranks experts by dev columns only: its fallback skips world test splits and the
search's target, and with nothing else it says so in one line; in-process, rows in memory.

Run: .venv/bin/python -m pytest -q tests/search/test_pool_dev_only.py
"""

from __future__ import annotations

from layerswap.search.pool import registry_picks
from layerswap.spaces.search_experiment import SearchExperiment

TEST, DEV = "ind__world_mgsm_direct_xa", "ind__world_belebele_brier_xa_dev"


def _rows(columns: dict[str, dict[str, float]]) -> list[dict]:
    """Two language and two math experts; `columns` gives each indicator column's scores by id,
    in file order (the test column first, so the old fallback took it)."""
    kinds = {"L1": ("language", "xa"), "L2": ("language", "xa"), "M1": ("math", "en"), "M2": ("math", "en")}  # fmt: skip
    return [
        {"expert_id": e, "kind": k, "language": lang, "path": f"/{e}"}
        | {col: scores[e] for col, scores in columns.items()}
        for e, (k, lang) in kinds.items()
    ]


def _exp(**over) -> SearchExperiment:
    return SearchExperiment.model_validate(
        {"language": "xa", "base": "/b", "experts": {"registry": "r.parquet", "top_k": 1}, **over}
    )


def _ids(picks) -> dict[str, list[str]]:
    return {side: [r["expert_id"] for r in rows] for side, rows in picks.items()}


def test_the_fallback_skips_a_test_split_column():
    rows = _rows({
        TEST: {"L1": 0.1, "L2": 0.9, "M1": 0.1, "M2": 0.9},
        DEV: {"L1": 0.9, "L2": 0.1, "M1": 0.9, "M2": 0.1},
    })  # fmt: skip
    picks, problems = registry_picks(_exp(), rows)
    assert problems == [] and _ids(picks) == {"task": ["M1"], "language": ["L1"]}


def test_only_test_split_columns_is_a_one_line_problem_per_side():
    picks, problems = registry_picks(_exp(), _rows({TEST: {"L1": 0.1, "L2": 0.9, "M1": 0.1, "M2": 0.9}}))  # fmt: skip
    assert picks == {} and len(problems) == 2
    for p in problems:
        assert p.startswith("experts.registry r.parquet: no indicator column may rank")
        assert TEST in p and "\n" not in p


def test_a_real_registry_never_falls_back_to_the_target():
    """Real columns have no split in their names: the target's own column is the one held out."""
    rows = _rows({
        "ind__mgsm_direct_sw": {"L1": 0.1, "L2": 0.9, "M1": 0.1, "M2": 0.9},
        "ind__belebele_swh_Latn": {"L1": 0.9, "L2": 0.1, "M1": 0.9, "M2": 0.1},
    })  # fmt: skip
    picks, problems = registry_picks(_exp(target="mgsm_direct_sw"), rows)
    assert problems == [] and _ids(picks) == {"task": ["M1"], "language": ["L1"]}


def test_an_indicator_set_after_validation_is_not_ranked_by():
    exp = _exp()
    exp = exp.model_copy(update={"experts": exp.experts.model_copy(update={"language_indicator": TEST})})  # fmt: skip
    rows = _rows({TEST: {"L1": 0.1, "L2": 0.9, "M1": 0.1, "M2": 0.9}, DEV: {"L1": 0.9, "L2": 0.1, "M1": 0.9, "M2": 0.1}})  # fmt: skip
    picks, problems = registry_picks(exp, rows)
    assert "language" not in picks and len(problems) == 1
    assert f"experts.language_indicator '{TEST}' is the search's target task" in problems[0]
