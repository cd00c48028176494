"""`layerswap world build --out DIR`: build the embedded world (DESIGN.md §3) into a folder.

Thin: calls world.build.build_world (torch and tokenizers load only when the command runs).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _cmd_world_build(args: argparse.Namespace) -> int:
    from spaces.world import load_variant
    from world.build import build_world

    config = load_variant(args.config, args.size, args.seed) if args.config else None
    build_world(args.out, seed=args.seed, size=args.size, overwrite=args.overwrite, config=config)
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `world build --out DIR [--seed N] [--size full|tiny] [--config YAML] [--overwrite]`.

    Args:
        subparsers: the object returned by `ArgumentParser.add_subparsers()`.
    Returns:
        the `world` parser (its handler is set with `set_defaults(func=...)`).
    """
    w = subparsers.add_parser(
        "world",
        help="the embedded world: synthetic languages, datasets and a pretrained tiny base",
        description="Generate the embedded evaluation world (DESIGN.md §3).",
    )
    wsub = w.add_subparsers(dest="world_command", required=True, metavar="ACTION")
    b = wsub.add_parser(
        "build",
        help="build the world into a folder (deterministic by seed; a no-op if already built)",
        description="Write datasets in the real schemas, a tokenizer and a CPU-pretrained Llama "
        "base model, plus world.json (counts and sha256 of every file).",
    )
    b.add_argument("--out", type=Path, required=True, help="output folder")
    b.add_argument("--seed", type=int, default=0, help="world seed (default: 0)")
    b.add_argument("--size", choices=["full", "tiny"], default="full", help="default: full")
    b.add_argument("--overwrite", action="store_true", help="replace a different existing world")
    b.add_argument(
        "--config",
        type=Path,
        metavar="YAML",
        help="a world variant: fields of the size's preset to replace, e.g. "
        "'model: {steps: 2000}' or 'digit_words: true' (spaces/world.py WorldConfig); "
        "recorded in world.json",
    )
    b.set_defaults(func=_cmd_world_build)
    return w
