"""The root command: every subcommand is registered, and building the parser stays light
(`layerswap --help` must not pay for torch, ray, lm-eval, optuna or pandas)."""

from __future__ import annotations

import subprocess
import sys

from cli import SUBCOMMANDS, build_parser

HEAVY = ("torch", "ray", "lm_eval", "optuna", "pandas", "transformers", "matplotlib")


def test_every_subcommand_is_registered():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == list(SUBCOMMANDS)


def test_building_the_parser_imports_nothing_heavy():
    code = (
        "import sys, cli; cli.build_parser(); "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
