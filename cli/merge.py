"""`layerswap merge RECIPE.yaml --out DIR`: apply a merge recipe to safetensors checkpoints.

Thin: validates the recipe and the arguments, then calls trainables.merge.api (merge: the disk
engine, or the LoRA adapter swap when both experts are adapters; export_mergekit). Run `layerswap merge --help`.
"""

from __future__ import annotations

import argparse
import re
from contextlib import ExitStack
from pathlib import Path

from layerswap.cli.args import output_file
from layerswap.spaces.recipe import load_recipe
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.outputs import (
    OutputError,
    check_output_file,
    output_problems,
    writing,
)

BYTES = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}


def parse_size(text: str) -> int:
    """'5GB', '500MiB' or a plain byte count -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in BYTES:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (e.g. 5GB, 500MiB, 1000000)")
    n = int(float(m.group(1)) * BYTES[m.group(2).upper()])
    if n <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return n


def _is_mergekit_config(path: Path) -> bool:
    """A mergekit config (what --export-mergekit writes): a YAML mapping with `merge_method`."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return False
    return isinstance(raw, dict) and "merge_method" in raw


def _check_outputs(recipe, args: argparse.Namespace) -> None:
    """Both outputs are checked before either is written: a refused --out leaves no export
    behind, and the export never lands on an input (a checkpoint's files, the recipe itself)
    nor replaces a file that is not a mergekit config."""
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.trainables.merge.assembly import recipe_refs
    from layerswap.trainables.merge.engine import local_refs

    inputs = local_refs(recipe_refs(recipe))
    problems = []
    if args.out is not None:
        problems += output_problems(args.out, "merge", overwrite=args.overwrite, inputs=inputs)
    if args.export_mergekit is not None:
        try:
            check_output_file(
                args.export_mergekit,
                overwrite=args.overwrite,
                inputs=[*inputs, args.recipe],
                ours=_is_mergekit_config,
                what="a mergekit config",
            )
        except OutputError as e:
            problems.append(str(e))
    if problems:
        raise OutputError("\n  ".join(problems))


def _cmd_merge(args: argparse.Namespace) -> int:

    recipe = load_recipe(args.recipe)
    if args.out is None and args.export_mergekit is None:
        raise ValueError("nothing to do: give --out DIR and/or --export-mergekit FILE")
    _check_outputs(recipe, args)
    # One writer per output: both are held from here to the end (refused now, naming the owner)
    with ExitStack() as held:
        for out in (args.out, args.export_mergekit):
            if out is not None:
                held.enter_context(writing(out))
        _check_outputs(recipe, args)  # again under the locks: another writer may have finished
        return _merge(recipe, args)


def _merge(recipe, args: argparse.Namespace) -> int:
    """Merge and/or export, the outputs checked and held."""
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.trainables.merge.api import export_mergekit, is_lora_recipe, merge
    from layerswap.trainables.model_ids import content_recipe_id

    if args.out is not None and args.fold and not is_lora_recipe(recipe):
        raise ValueError("--fold applies to LoRA adapter experts only")
    # The export is made (and so validated) first and written last: a merge that fails leaves
    # no export behind.
    text = export_mergekit(recipe) if args.export_mergekit is not None else None
    if args.out is not None:
        merge(
            recipe,
            args.out,
            overwrite=args.overwrite,
            fold=args.fold,
            max_shard_bytes=args.max_shard_size,
            progress=not args.quiet,
        )
        # the id the merged folder names (its checkpoints were hashed by the merge: cached)
        print(f"merged {recipe.method} recipe {content_recipe_id(recipe)} -> {args.out}")
    if text is not None:
        atomic_write_text(Path(args.export_mergekit), text)
        print(f"wrote mergekit config {args.export_mergekit}")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `merge` subcommand to a `layerswap` subparsers object; returns its parser."""
    m = subparsers.add_parser(
        "merge",
        help="apply a merge recipe (YAML) to safetensors checkpoints",
        description="Apply a merge recipe: layer_swap, soup, ties or task_arithmetic. Streams "
        "tensors shard by shard (never a whole model in memory) and writes the output folder "
        "atomically with the recipe and a model card. LoRA adapter experts are merged as "
        "adapters (or folded into full weights with --fold).",
    )
    m.add_argument("recipe", type=Path, help="recipe YAML (keys: docs/guides/merge.md)")
    m.add_argument("--out", type=Path, help="output folder (must not exist unless --overwrite)")
    m.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out folder (and --export-mergekit file)",
    )
    m.add_argument(
        "--max-shard-size",
        type=parse_size,
        default="5GB",
        metavar="SIZE",
        help="largest output shard, e.g. 5GB, 500MiB (default: 5GB)",
    )
    m.add_argument(
        "--fold", action="store_true", help="LoRA experts: write full weights (needs base)"
    )
    m.add_argument(
        "--export-mergekit",
        type=output_file,
        metavar="FILE",
        help="also (or only, without --out) write the equivalent mergekit YAML",
    )
    m.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    m.set_defaults(func=_cmd_merge)
    return m
