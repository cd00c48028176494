"""Argument types shared by the subcommands (argparse `type=` callables; exit 2 on bad values)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """A count that must be > 0 (checked by argparse, before any work starts)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n
