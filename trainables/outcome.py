"""What this command's writers finished or undid before an interrupt, for its interrupted line
(cli/continue_hint.py): an output renamed into place complete (`outputs.output_dir`), an earlier
output put back because its replacement was cut (`outputs.replacing`). One record per process,
cleared when a command starts; standard library only, so the CLI reads it at no import cost.

Run its tests: .venv/bin/python -m pytest -q tests/cli/test_continue_hint.py
"""

from __future__ import annotations

from pathlib import Path

PLACED: list[tuple[Path, bool]] = []  # (output, whether it replaced an earlier one), in order
PUT_BACK: list[Path] = []  # earlier outputs back in place, their replacement removed


def clear() -> None:
    """A command starts: nothing finished or put back yet."""
    PLACED.clear()
    PUT_BACK.clear()


def placed(out: Path, replaced: bool) -> None:
    """Record that `out` is in place, complete.

    Args:
        out: the output, as the command was given it.
        replaced: an earlier output there was replaced (deleted once the new one was in).
    """
    PLACED.append((Path(out), replaced))


def put_back(out: Path) -> None:
    """Record that the earlier `out` is back in place, as it was (its replacement removed).

    Args:
        out: the output, as the command was given it.
    """
    PUT_BACK.append(Path(out))


def _some(paths: list[Path]) -> str:
    """'a', or 'a and 2 more' (the last one named: the command's latest)."""
    more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
    return f"{paths[-1]}{more}"


def note() -> str:
    """What the interrupted line adds about outputs: "; runs/m was written in full before the
    interrupt, replacing the earlier one", "; the earlier runs/exp was put back as it was", or
    "" when neither happened."""
    said = ""
    if PLACED:
        outs = [p for p, _ in PLACED]
        what = "was" if len(outs) == 1 else "were"
        said += f"; {_some(outs)} {what} written in full before the interrupt"
        if PLACED[-1][1]:
            said += f", replacing the earlier {PLACED[-1][0].name}"
    if PUT_BACK:
        what = "was" if len(PUT_BACK) == 1 else "were"
        said += f"; the earlier {_some(PUT_BACK)} {what} put back as it was"
    return said
