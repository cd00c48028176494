"""The command-line reference is generated from the parsers and names every command, sub-command
and argument, whatever the terminal's width.

Run: .venv/bin/python -m pytest -q tests/cli/test_cli_reference.py
"""

from __future__ import annotations

import argparse

from layerswap.cli import SUBCOMMANDS, build_parser
from layerswap.cli.reference import arguments, cli_reference, commands, usage


def test_the_page_names_every_subcommand_and_argument():
    page = cli_reference()
    names = [name for name, _, _ in commands()]
    assert [n.split()[1] for n in names if n.count(" ") == 1] == list(SUBCOMMANDS)
    assert {"layerswap world build", "layerswap world export-base"} <= set(names)
    for name, _, parser in commands():
        anchor = name.replace(" ", "-")
        assert f" {name} {{ #{anchor} }}" in page, name
        assert usage(parser) in page
        section = page.split(f"{{ #{anchor} }}")[1]
        for invocation, help_text, _ in arguments(parser):
            assert help_text, f"{name} {invocation}: no help"
            assert f"| `{invocation}` |" in section, (name, invocation)


def test_arguments_carry_help_defaults_and_choices():
    build = next(p for n, _, p in commands() if n == "layerswap world build")
    rows = {inv: (h, d) for inv, h, d in arguments(build)}
    assert rows["--seed SEED"] == ("world seed (default: 0)", "`0`")
    assert rows["--out OUT"][0].endswith("(required)")
    assert rows["--overwrite"][1] == ""  # a flag's default is "off", not False
    # its examples are YAML text, but the option takes a file (a red-team read them as inline)
    assert rows["--config YAML"][0].startswith("a YAML file holding a world variant"), rows


def test_expanded_help_and_choices_behind_a_metavar():
    p = argparse.ArgumentParser(prog="x")
    p.add_argument("--n", type=int, default=3, help="count (default: %(default)s)")
    p.add_argument("--mode", choices=["a", "b"], metavar="M", help="how")
    rows = {inv: (h, d) for inv, h, d in arguments(p)}
    assert rows["--n N"] == ("count (default: 3)", "`3`")
    assert rows["--mode M"][0] == "how (one of: a, b)"


def test_usage_does_not_depend_on_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    wide = cli_reference(build_parser())
    monkeypatch.setenv("COLUMNS", "40")
    assert cli_reference(build_parser()) == wide
