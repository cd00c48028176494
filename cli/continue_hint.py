"""How an interrupted command continues, for the interrupted lines (cli/__init__.py's, and the
watchdog's when the command does not end): one place, by command.

Run its tests: .venv/bin/python -m pytest -q tests/cli/test_continue_hint.py
"""

from __future__ import annotations

# The flag that continues each command's interrupted run. `train --continue` takes a plain run
# and an expert sweep alike (a sweep has no --resume); commands not named here start over.
CONTINUES = {
    "train": "--continue",
    "search": "--continue (or --resume)",
    "demo": "--resume",
}

_COMMAND: list[str] = []  # the command this process runs, once its line is parsed


def set_command(command: str) -> None:
    """Record the command this process runs (main, after parsing its line).

    Args:
        command: the subcommand's name.
    """
    _COMMAND[:] = [command]


def hint() -> str:
    """The interrupted lines' tail: " (train continues with --continue)", or "" for a
    command that starts over (or before the command line is parsed)."""
    flag = CONTINUES.get(_COMMAND[0]) if _COMMAND else None
    return f" ({_COMMAND[0]} continues with {flag})" if flag else ""
