"""Argument types shared by the subcommands (argparse `type=` callables; exit 2 on bad values).

Every count a command takes has a limit, named when it is passed: a count past it would
exhaust memory or run without end (`analyze --resamples 1e9` asked for 37 GiB). A file a
command writes must be a regular file (or not exist yet): a device or a FIFO (/dev/full) would
be read without end or written into the void.
"""

from __future__ import annotations

import argparse
import math
import stat
from collections.abc import Callable
from pathlib import Path


def continue_clash(args: argparse.Namespace, what: str) -> str | None:
    """Why `--continue` cannot go with the other flags given, or None: `--resume` and
    `--overwrite` each say what to do with an existing output, which `--continue` decides itself.

    Args:
        args: the parsed command line (`cont`, `overwrite`, and `resume` where the command has it).
        what: what `--continue` does, for the message.
    Returns:
        one line naming the clashing flag.
    """
    clash = [f for f, on in (("--resume", getattr(args, "resume", False)), ("--overwrite", args.overwrite)) if on]  # fmt: skip
    return (
        f"--continue and {clash[0]}: give one (--continue {what})" if args.cont and clash else None
    )


def count(high: int, low: int = 1) -> Callable[[str], int]:
    """An argparse type for a whole number from `low` to `high`, checked before any work.

    Args:
        high: the largest value accepted (named in the message).
        low: the smallest.
    Returns:
        the type callable.
    """

    kind = "a positive integer" if low == 1 else f"an integer >= {low}"

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < low:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}")
        if n > high:
            raise argparse.ArgumentTypeError(f"expected at most {high} (the limit), got {text!r}")
        return n

    return parse


def finite_float(low: float = -math.inf, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type for a finite number >= `low` (> `low` with `low_open`).

    Args:
        low: the smallest value accepted.
        low_open: `low` itself is refused.
    Returns:
        the type callable.
    """

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if v < low or (low_open and v == low):
            raise argparse.ArgumentTypeError(
                f"expected a number {'>' if low_open else '>='} {low:g}, got {text!r}"
            )
        return v

    return parse


def output_file(text: str) -> Path:
    """An argparse type for a file a command writes: a path that exists must be a regular file
    (a folder is left to the output policy, which names it).

    Returns:
        the path.
    """
    path = Path(text)
    try:
        mode = path.stat().st_mode
    except OSError:  # absent (or unreadable): the output policy says which
        return path
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise argparse.ArgumentTypeError(
            f"{text}: is not a regular file (a device, FIFO or socket); give a file path"
        )
    return path
