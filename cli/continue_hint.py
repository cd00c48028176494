"""What an interrupted command's line says after "nothing half-written was kept" (cli/__init__.py's
line, and the watchdog's when the command does not end): the outputs it finished or put back
before the interrupt (trainables/outcome.py), then how it continues. One place, by command.

Run its tests: .venv/bin/python -m pytest -q tests/cli/test_continue_hint.py
"""

from __future__ import annotations

from collections.abc import Iterable

from layerswap.trainables import outcome

# The flag that continues each command's interrupted run. `train --continue` takes a plain run
# and an expert sweep alike (a sweep has no --resume); commands not named here start over.
CONTINUES = {
    "train": "--continue",
    "search": "--continue (or --resume)",
    "demo": "--resume",
}
# Flags (argparse dests) after which such a command's interrupted run is not continued, and what
# the line says instead: --overwrite put the earlier run back and removed the new one
# (outputs.replacing), so --continue would take up the earlier run; a merge-only demo is one
# output built in seconds, with nothing to resume (`demo --merge-only --resume` is refused).
STARTS_OVER = {"merge_only": "", "overwrite": "{command} --overwrite starts over"}

_COMMAND: list[str] = []  # the command this process runs, once its line is parsed
_FLAGS: set[str] = set()  # its switches that are on


def set_command(command: str, flags: Iterable[str] = ()) -> None:
    """Record the command this process runs (main, after parsing its line); what its writers
    finished or put back so far is forgotten.

    Args:
        command: the subcommand's name.
        flags: the argparse dests of its switches that are on (`overwrite`, `merge_only`).
    """
    _COMMAND[:] = [command]
    _FLAGS.clear()
    _FLAGS.update(flags)
    outcome.clear()


def hint() -> str:
    """The interrupted lines' tail: what was finished or put back before the interrupt
    ("; runs/m was written in full before the interrupt"), then " (train continues with
    --continue)", or no parenthesis for a command that starts over (or before the command line
    is parsed)."""
    said = outcome.note()
    command = _COMMAND[0] if _COMMAND else None
    flag = CONTINUES.get(command) if command else None
    if not flag:
        return said
    over = [text for dest, text in STARTS_OVER.items() if dest in _FLAGS]
    if over:
        return said + (f" ({over[0].format(command=command)})" if over[0] else "")
    return said + f" ({command} continues with {flag})"
