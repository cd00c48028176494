"""The `layerswap` command line: a root parser and one thin module per subcommand.

Each subcommand module (`merge`, `train`, `search`, `eval`, `analyze`, `world`, `demo`) adds its
parser and a handler that validates input once and calls a plain function of the library.
Modules import only light things at load time (argparse, the pydantic configs), so `layerswap
--help` stays fast; torch, ray, lm-eval, optuna and pandas load when a command runs (tested). Run `layerswap --help`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pydantic import ValidationError

# Order is the order `layerswap --help` lists them in.
SUBCOMMANDS = ("merge", "world", "eval", "search", "train", "analyze", "demo")


def build_parser() -> argparse.ArgumentParser:
    """The root parser with every subcommand registered."""
    p = argparse.ArgumentParser(
        prog="layerswap",
        description="Cross-lingual transfer by layer swapping: merge a task (math) expert and a "
        "language expert fine-tuned from one base model.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"cli.{name}").add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, run the command; invalid input exits 2 with one line naming the problem."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, ValidationError, FileExistsError, FileNotFoundError, OSError) as e:
        print(f"layerswap: error: {e}", file=sys.stderr)
        return 2
