"""The names of promotion's baselines: the pool's experts (math_expert, math_expert_2), which
baselines are merged from an expert pair, and how a model's name says its pair (soup_uniform_t2_l1). Pure naming, shared by the search's
promotion (search/promote.py, search/leaderboard.py) and the analysis (analysis/treatments.py).
Tests: .venv/bin/python -m pytest -q tests/search/test_promote_pairs.py
"""

from __future__ import annotations

import re

# Promotion's names of the pool's experts, by side: the first plain, further ones numbered.
EXPERT_BASELINES = {"task": "math_expert", "language": "language_expert"}
_EXPERT = re.compile(rf"^({'|'.join(EXPERT_BASELINES.values())})(?:_(\d+))?$")

# The merged baselines: built from one (task, language) expert pair each (search/promote.py).
MERGED_BASELINES = ("soup_uniform", "soup_magnitude", "ties", "paper_default")
_PAIRED = re.compile(rf"^({'|'.join(MERGED_BASELINES)})_t(\d+)_l(\d+)$")


def pair_name(baseline: str, task_index: int, language_index: int) -> str:
    """The model name of a merged baseline built from the pool's task expert `task_index` and
    language expert `language_index` (0-based; named 1-based, as math_expert_2 is the second)."""
    return f"{baseline}_t{task_index + 1}_l{language_index + 1}"


def one_pair(n_task: int, n_language: int) -> bool:
    """Whether a pool of `n_task` task and `n_language` language experts is one (task, language)
    pair: its merged baselines then carry no pair in their names (soup_uniform, not
    soup_uniform_t1_l1), and nothing names the pair."""
    return n_task * n_language == 1


def merged_baseline(model: str) -> str | None:
    """The merged baseline a promoted model's name is ("soup_uniform" for soup_uniform and
    soup_uniform_t2_l3), or None for any other model."""
    m = _PAIRED.match(model)
    if m:
        return m.group(1)
    return model if model in MERGED_BASELINES else None


def expert_name(side: str, index: int) -> str:
    """The model name of the pool's expert `index` (0-based) of `side` ("task" or "language"):
    math_expert for the first task expert, math_expert_2 for the second."""
    name = EXPERT_BASELINES[side]
    return name if index == 0 else f"{name}_{index + 1}"


def expert_baseline(model: str) -> str | None:
    """The expert baseline a promoted model's name is ("math_expert" for math_expert and
    math_expert_3), or None for any other model."""
    m = _EXPERT.match(model)
    return m.group(1) if m else None
