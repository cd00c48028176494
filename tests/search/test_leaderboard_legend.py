"""The leaderboard's expert legend: with several experts per side, each expert row
(math_expert_2, language_expert_2) is named beside its pair index (t2, l2) and its checkpoint,
so a row can be matched to the checkpoint it scored. No model is loaded.

Run: .venv/bin/python -m pytest -q tests/search/test_leaderboard_legend.py
"""

from __future__ import annotations

from layerswap.search.leaderboard import leaderboard
from layerswap.search.promote import baselines, pair_legend
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool

TASKS, LANGS = ["ck/math_a", "ck/math_b"], ["ck/lang_a", "ck/lang_b"]


def _board(tasks, langs, **promote) -> str:
    exp = SearchExperiment(
        language="xa", base="b", task_experts=tasks, language_experts=langs, promote=promote
    )
    pool = ExpertPool.from_paths(tasks, langs, "b")
    models = [(n, "baseline", None, x) for n, x in baselines(exp, pool, 32)]
    return leaderboard(exp, models, {}, None, {}, None, pair_legend(pool))


def test_each_expert_row_is_named_with_its_checkpoint():
    board = _board(TASKS, LANGS, baselines=["experts"])  # no merged baseline: still a legend
    rows = [line.split(" | ")[0].strip("| ") for line in board.splitlines() if "| baseline |" in line]  # fmt: skip
    assert sorted(rows) == ["language_expert", "language_expert_2", "math_expert", "math_expert_2"]  # fmt: skip
    for row, pair, path in [
        ("math_expert", "t1", TASKS[0]),
        ("math_expert_2", "t2", TASKS[1]),
        ("language_expert", "l1", LANGS[0]),
        ("language_expert_2", "l2", LANGS[1]),
    ]:
        assert f"{row} = {pair}: `{path}`" in board, board
