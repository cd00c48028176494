"""The search's data check, after its preflight and before Ray starts: every task the search and
its promotion evaluate is built as lm-eval builds it, so data missing from the local Hugging Face
cache (layerswap runs offline by default) fails the command in seconds, not at the first trial or
at promotion hours later. Unlike search/preflight.py it loads lm-eval (~1.5 s, ~12 s more when a
built-in task makes it index lm-eval's own task YAMLs), so the CLI runs it last.

Tests: .venv/bin/python -m pytest -q tests/search/test_preflight_data.py
"""

from __future__ import annotations

from pathlib import Path

from layerswap.search.promote import promotion_tasks
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.trainables.evaluate.tasks import task_data_problem


def searched_tasks(exp: SearchExperiment, promote: bool) -> list[str]:
    """The tasks a search reads: its proxies (dev splits), and with promotion also their
    held-out splits and the target task (search.promote.promotion_tasks)."""
    if promote:
        return promotion_tasks(exp)
    return [p.task for p in exp.proxy_list]


def uncached_problem(exp: SearchExperiment, promote: bool = True) -> str | None:
    """Why the search would fail for task data it cannot read offline, or None.

    Args:
        exp: the validated search experiment (its world and include_path already checked).
        promote: the promotion runs too (its held-out and target tasks are checked).
    Returns:
        one line naming each task whose data is not in the local cache, and how to get it.
    """
    world = Path(exp.world) if exp.world is not None else None
    return task_data_problem(searched_tasks(exp, promote), world, list(exp.include_path))
