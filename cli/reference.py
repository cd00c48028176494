"""The command-line reference (docs/reference/cli.md), generated from the argparse parsers.

Walks `layerswap.cli.build_parser()` and every subparser below it (`world build`, ...): usage,
description and each argument with its help, default and choices, read off the parser objects.
Run: `python -c "from layerswap.cli.reference import cli_reference as r; print(r())"`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import PurePath

from layerswap.cli import build_parser

WIDTH = 100  # usage lines are wrapped at this width whatever the terminal


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog=parser.prog, width=WIDTH)


def usage(parser: argparse.ArgumentParser) -> str:
    """The parser's usage text ("usage: layerswap merge [-h] ..."), at a fixed width."""
    f = _formatter(parser)
    f.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return f.format_help().strip()


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def commands(
    parser: argparse.ArgumentParser | None = None,
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(full name, one-line help, parser) of every subcommand, depth first, in help order.

    Args:
        parser: the root (default: `build_parser()`).
    """
    parser = parser or build_parser()
    sub = _subparsers(parser)
    if sub is None:
        return
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    for name, child in sub.choices.items():
        yield child.prog, helps.get(name, ""), child
        yield from commands(child)


def _text(text: str) -> str:
    """Help text as Markdown: one line, `<` shown as written outside code spans (not a tag)."""
    parts = " ".join(str(text).split()).split("`")
    parts[::2] = [p.replace("<", "&lt;") for p in parts[::2]]
    return "`".join(parts)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: `_text` with its pipes escaped."""
    return _text(text).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    d = action.default
    if d is None or d is argparse.SUPPRESS or action.nargs == 0:  # flags: the default is "off"
        return ""
    return f"`{d}`" if isinstance(d, (str, int, float, PurePath)) else f"`{d!r}`"


def arguments(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(invocation, help, default) of every argument but -h and the subcommand choice."""
    f = _formatter(parser)
    rows = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        text = f._expand_help(a) if a.help else ""
        if a.choices is not None and a.metavar is not None:  # else the invocation lists them
            text += f" (one of: {', '.join(str(c) for c in a.choices)})"
        if a.required and a.option_strings:
            text += " (required)"
        rows.append((f._format_action_invocation(a), text.strip(), _default(a)))
    return rows


def _section(parser: argparse.ArgumentParser, level: int, help_line: str = "") -> list[str]:
    anchor = parser.prog.replace(" ", "-")
    out = [f"{'#' * level} {parser.prog} {{ #{anchor} }}", ""]
    if help_line:
        out += [f"*{_cell(help_line)}*", ""]
    out += ["```text", usage(parser), "```", ""]
    if parser.description:
        out += [_text(parser.description), ""]
    sub = _subparsers(parser)
    if sub is not None:
        out += ["| Command | What it does |", "| --- | --- |"]
        for a in sub._choices_actions:
            link = f"{parser.prog} {a.dest}".replace(" ", "-")
            out.append(f"| [`{a.dest}`](#{link}) | {_cell(a.help or '')} |")
        out.append("")
    rows = arguments(parser)
    if rows:
        out += ["| Argument | Help | Default |", "| --- | --- | --- |"]
        out += [f"| `{inv}` | {_cell(h)} | {d} |" for inv, h, d in rows]
        out.append("")
    return out


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole command-line reference (docs/reference/cli.md's generated part).

    Args:
        parser: the root (default: `build_parser()`).
    """
    parser = parser or build_parser()
    out = ["Generated from the argparse parsers (`layerswap.cli.build_parser()`); "]
    out[0] += "`layerswap COMMAND --help` prints the same."
    out += ["", *_section(parser, 2)]
    for name, help_line, child in commands(parser):
        out += _section(child, 2 if name.count(" ") == 1 else 3, help_line)
    return "\n".join(out)
