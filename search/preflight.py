"""Preflight for `layerswap search`: every problem an experiment has that shows before Ray starts or
a model loads (expert folders, the registry, configs, the world, task names), reported at once.

`problems = check_search(exp)` ([] means go); `preflight(exp)` also lists what it could not check
offline. Imports no torch, ray or lm-eval. The checks: the pool's folders in
search/preflight_folders.py, task names in search/preflight_tasks.py, both appending to the
report of search/preflight_report.py. Tests: .venv/bin/python -m pytest -q tests/search/test_preflight.py
"""

from __future__ import annotations

from layerswap.search.preflight_folders import check_folders
from layerswap.search.preflight_report import Preflight
from layerswap.search.preflight_tasks import check_tasks
from layerswap.spaces.search_experiment import SearchExperiment


def check_search(exp: SearchExperiment) -> list[str]:
    """Every problem that would stop `layerswap search` on `exp`, found without Ray or a model.

    Args:
        exp: the validated search experiment.
    Returns:
        one human-readable line per problem, each naming its field, file or value; [] means go.
    """
    return preflight(exp).problems


def preflight(exp: SearchExperiment) -> Preflight:
    """`check_search`, plus notes on what cannot be checked offline (Hub ids, task text search).

    Args:
        exp: the validated search experiment.
    Returns:
        Preflight(problems, unchecked).
    """
    out = Preflight()
    check_folders(exp, out)
    check_tasks(exp, out)
    return out
