"""The search's data check, after its preflight and before Ray starts: every task the search and
its promotion evaluate is built as lm-eval builds it, so data missing from the local Hugging Face
cache (layerswap runs offline by default) fails the command in seconds, not at the first trial or
at promotion hours later, beside any refusal of the task configs themselves (a proxy reading the
target's test split), so data is not fetched for a config that would be refused anyway. Unlike
search/preflight.py it loads lm-eval (~1.5 s, ~12 s more when a built-in task makes it index
lm-eval's own task YAMLs), so the CLI runs it last.

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
    """Why the search would fail for task data it cannot read offline, or None. When data is
    missing, the task configs' own refusal (a proxy reading the target's test split, a proxy's
    scale against its metric: search/trial.py check_proxy_scales, which the search runs once the
    data is there) is said first: downloading data for a config refused anyway wastes the time.

    Args:
        exp: the validated search experiment (its world and include_path already checked).
        promote: the promotion runs too (its held-out and target tasks are checked).
    Returns:
        one line naming each task whose data is not in the local cache, and how to get it; the
        config's refusal on a line before it, if it has one.
    """
    world = Path(exp.world) if exp.world is not None else None
    problem = task_data_problem(searched_tasks(exp, promote), world, list(exp.include_path))
    if problem is None:
        return None  # the search's own check_proxy_scales runs next, before anything is written
    refused = _config_problem(exp)
    return problem if refused is None else f"{refused}\n  {problem}"


def _config_problem(exp: SearchExperiment) -> str | None:
    """check_proxy_scales' refusal of `exp` (task configs only, no data), or None. Run only once
    data is missing, so the happy path indexes lm-eval's tasks once, in the search."""
    # lazy: search/trial.py imports torch (3.0 s measured), needed here only when the data check failed
    from layerswap.search.trial import check_proxy_scales

    try:
        check_proxy_scales(exp)
    except ValueError as e:
        return str(e)
    return None
