"""What a search preflight found: `Preflight(problems, unchecked)`, the one report the folder
checks (search/preflight_folders.py) and the task checks (search/preflight_tasks.py) append to.

Tests: .venv/bin/python -m pytest -q tests/search/test_preflight.py
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Preflight:
    """What the preflight found: problems that stop the search, and what it could not check."""

    problems: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
