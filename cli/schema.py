"""`layerswap schema KIND [--out FILE]`: the JSON Schema of a config file kind, for editors.

Thin: prints (or writes atomically) spaces.reference.schema_text. The schemas are generated from
the same pydantic models the loaders validate with; docs/schemas/ holds a copy of each, and the
shipped examples name theirs in a `# yaml-language-server: $schema=...` first line. Run
`layerswap schema --help`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from layerswap.cli.args import output_file
from layerswap.spaces.reference import DRAFT, KINDS, schema_text
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.outputs import check_output_file, writing


def _is_schema(path: Path) -> bool:
    """A JSON Schema layerswap wrote: a JSON object naming the draft and a layerswap title."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict)
        and data.get("$schema") == DRAFT
        and str(data.get("title", "")).startswith("layerswap ")
    )


def _cmd_schema(args: argparse.Namespace) -> int:

    text = schema_text(args.kind)
    if args.out is None:
        sys.stdout.write(text)
        return 0

    check = dict(overwrite=args.overwrite, ours=_is_schema, what="a layerswap JSON Schema")
    check_output_file(args.out, **check)
    with writing(args.out):  # one writer per file; checked again under the lock
        check_output_file(args.out, **check)
        args.out.parent.mkdir(parents=True, exist_ok=True)  # the policy lets a parent be made
        atomic_write_text(args.out, text)
    print(f"wrote the {args.kind} schema to {args.out}")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `schema KIND [--out FILE] [--overwrite]`; returns its parser."""
    kinds = ", ".join(f"{k.name} ({k.title.lower()}, `{k.read_by}`)" for k in KINDS.values())
    p = subparsers.add_parser(
        "schema",
        help="print the JSON Schema of a config file kind (for editor completion and checks)",
        description="Print the JSON Schema (draft 2020-12) of a config file kind, generated from "
        f"the models its loader validates with: {kinds}. Point an editor at it, e.g. with a "
        "first line `# yaml-language-server: $schema=PATH` in the YAML file.",
    )
    p.add_argument("kind", choices=list(KINDS), help="the config file kind")
    p.add_argument(
        "--out",
        type=output_file,
        metavar="FILE",
        help="write the schema to FILE (atomically) instead of printing it",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out schema file")
    p.set_defaults(func=_cmd_schema)
    return p
