"""The leaderboard says how many items each score rests on: a column promotion scored on fewer
items than its split has (promote.limit) says "40 of 250 items" in its header, and one line says
the search objective rests on the search's own proxy scores of the dev items. No model is loaded.

Run: .venv/bin/python -m pytest -q tests/search/test_leaderboard_items.py
"""

from __future__ import annotations

from layerswap.search.leaderboard import leaderboard
from layerswap.spaces.search_experiment import SearchExperiment

TARGET, DEV, TEST = "world_mgsm_direct_xa", "world_belebele_brier_xa_dev", "world_belebele_brier_xa"  # fmt: skip


def test_a_limited_promotion_says_how_many_items_each_column_rests_on():
    exp = SearchExperiment(
        language="xa", base="b", task_experts=["t"], language_experts=["l"], promote={"limit": 40}
    )
    items = {TARGET: (40, 250), DEV: (40, 100), TEST: (40, None)}
    board = leaderboard(exp, [("base", "baseline", None, "b")], {}, None, {}, items=items)
    head = next(line for line in board.splitlines() if line.startswith("| model |"))
    assert f"**{TARGET} (target, test, 40 of 250 items)**" in head, head
    assert f"{DEV} (dev, lower is better, 40 of 100 items)" in head, head
    assert f"{TEST} (test, lower is better, 40 items)" in head, head  # split size unknown


def test_whole_splits_keep_plain_headers_and_the_search_items_are_named():
    exp = SearchExperiment(
        language="xa", base="b", task_experts=["t"], language_experts=["l"],
        proxy_eval={"limit": 60},
    )  # fmt: skip
    items = {TARGET: (250, 250), DEV: (100, 100)}
    board = leaderboard(exp, [("base", "baseline", None, "b")], {}, None, {}, items=items)
    head = next(line for line in board.splitlines() if line.startswith("| model |"))
    assert f"**{TARGET} (target, test)**" in head and "items" not in head, head
    assert "search's own proxy scores (the first 60 dev items of each proxy" in board, board
