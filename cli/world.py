"""`layerswap world build --out DIR`: build the embedded world (docs/world/index.md) into a folder;
`layerswap world export-base DIR --name NAME`: ship its base for `world build` to reuse.

Thin: calls world.build.build_world and world.prebuilt.export_base (torch and tokenizers load
only when a command runs).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from layerswap.cli.args import finite_float
from layerswap.spaces.world import load_variant


def _cmd_world_build(args: argparse.Namespace) -> int:
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.world.build import build_world

    config = load_variant(args.config, args.size, args.seed) if args.config else None
    if config is not None and args.pretrain:
        raise ValueError("--pretrain applies to the preset; a --config variant names its base itself (model.prebuilt) or is pretrained")  # fmt: skip
    build_world(args.out, seed=args.seed, size=args.size, overwrite=args.overwrite, config=config, pretrain=args.pretrain)  # fmt: skip
    return 0


def _cmd_world_export_base(args: argparse.Namespace) -> int:
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.world.build import world_config_of
    from layerswap.world.prebuilt import export_base, variant_yaml

    limit = {} if args.max_mb is None else {"max_mb": args.max_mb}  # None: world.prebuilt.MAX_MB
    entry = export_base(args.world, args.name, overwrite=args.overwrite, maintainer=args.maintainer, **limit)  # fmt: skip
    cfg = world_config_of(args.world)
    print(
        f"# {args.world} reusing world/bases/{args.name}: layerswap world build --config THIS "
        f"--seed {cfg.seed} --size {cfg.size}"
    )
    print(variant_yaml(cfg, entry), end="")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `world build --out DIR [--seed N] [--size full|tiny] [--config YAML] [--overwrite]`
    and `world export-base WORLD --name NAME [--overwrite] [--max-mb MB] [--maintainer]`.

    Args:
        subparsers: the object returned by `ArgumentParser.add_subparsers()`.
    Returns:
        the `world` parser (its handler is set with `set_defaults(func=...)`).
    """
    w = subparsers.add_parser(
        "world",
        help="the embedded world: synthetic languages, datasets and a pretrained tiny base",
        description="Generate the embedded evaluation world (docs/world/index.md).",
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
        help="a YAML file holding a world variant: fields of the size's preset to replace, "
        "e.g. 'model: {steps: 2000}' or 'digit_words: true' (spaces/world.py WorldConfig); "
        "recorded in world.json",
    )
    b.add_argument(
        "--pretrain",
        action="store_true",
        help="pretrain the base even where world/bases/ ships one for this seed and size "
        "(to rebuild a shipped base: then `world export-base OUT --name SIZE-vVERSION-seedSEED --maintainer`)",
    )
    b.set_defaults(func=_cmd_world_build)
    e = wsub.add_parser(
        "export-base",
        help="ship a built world's base in world/bases/ for `world build` to reuse",
        description="Copy the base of a built world (e.g. one pretrained on a larger budget "
        "than `world build` has on 2 cores) into world/bases/NAME and print a variant YAML of "
        "that world with a 'model: {prebuilt: ...}' entry. `world build --config` with it "
        "checks that the config, corpus and tokenizer are the ones the base was pretrained for "
        "(sha256) and copies the base instead of pretraining.",
    )
    e.add_argument("world", type=Path, help="a built world folder")
    e.add_argument("--name", required=True, help="folder name under world/bases/")
    e.add_argument("--overwrite", action="store_true", help="replace a base of that name")
    e.add_argument(
        "--max-mb", type=finite_float(0, low_open=True), help="refuse a larger base (default: 25)"
    )
    e.add_argument(
        "--maintainer",
        action="store_true",
        help="write into the layerswap package's world/bases/ (maintainers shipping a base; "
        "without it nothing is written into the installed package)",
    )
    e.set_defaults(func=_cmd_world_export_base)
    return w
