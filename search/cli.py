"""The `layerswap` command line: validates input once, then calls the plain functions.

Run `layerswap --help`, `layerswap merge RECIPE.yaml --out DIR`, `layerswap demo --out DIR`.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from pydantic import ValidationError

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


def _cmd_merge(args: argparse.Namespace) -> int:
    from spaces.recipe import LayerSwapRecipe, load_recipe, recipe_id
    from trainables.merge import merge_to_disk, resolve_ref

    recipe = load_recipe(args.recipe)
    if args.out is None and args.export_mergekit is None:
        raise ValueError("nothing to do: give --out DIR and/or --export-mergekit FILE")
    if args.export_mergekit is not None:
        from trainables.atomic import atomic_write_text
        from trainables.mergekit_export import mergekit_yaml

        if not isinstance(recipe, LayerSwapRecipe):
            raise ValueError(f"--export-mergekit: only layer_swap recipes, not {recipe.method!r}")
        from trainables.merge import disk_mav_oracle, plan_refs_depth

        ckpts, depth = plan_refs_depth(recipe)
        try:
            mav = disk_mav_oracle(ckpts, recipe.base) if recipe.base is not None else None
            text = mergekit_yaml(recipe, depth, mav=mav)
        finally:
            for ck in ckpts.values():
                ck.close()
        atomic_write_text(Path(args.export_mergekit), text)
        print(f"wrote mergekit config {args.export_mergekit}")
    if args.out is not None:
        from trainables.lora import is_lora_adapter, merge_lora_to_disk

        lora = (
            isinstance(recipe, LayerSwapRecipe)
            and isinstance(recipe.task_expert, str)
            and (is_lora_adapter(resolve_ref(recipe.task_expert)))
        )
        if args.fold and not lora:
            raise ValueError("--fold applies to LoRA adapter experts only")
        if lora:
            merge_lora_to_disk(
                recipe, args.out, overwrite=args.overwrite, fold=args.fold, progress=not args.quiet
            )
        else:
            merge_to_disk(
                recipe,
                args.out,
                overwrite=args.overwrite,
                max_shard_bytes=args.max_shard_size,
                progress=not args.quiet,
            )
        print(f"merged {recipe.method} recipe {recipe_id(recipe)} -> {args.out}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.merge_only:
        from search.merge_demo import run_merge_demo

        run_merge_demo(Path(args.out), overwrite=args.overwrite)
        return 0
    from search.demo import DemoSettings, run_demo

    settings = DemoSettings(
        world_size=args.world_size,
        seed=args.seed,
        train_steps=args.train_steps,
        trials=args.trials,
    )
    run_demo(Path(args.out), overwrite=args.overwrite, settings=settings)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="layerswap",
        description="Cross-lingual transfer by layer swapping: merge a task (math) expert and a "
        "language expert fine-tuned from one base model.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m = sub.add_parser(
        "merge",
        help="apply a merge recipe (YAML) to safetensors checkpoints",
        description="Apply a merge recipe: layer_swap, soup, ties or task_arithmetic. Streams "
        "tensors shard by shard (never a whole model in memory) and writes the output folder "
        "atomically with the recipe and a model card. LoRA adapter experts are merged as "
        "adapters (or folded into full weights with --fold).",
    )
    m.add_argument("recipe", type=Path, help="recipe YAML (see README for the keys)")
    m.add_argument("--out", type=Path, help="output folder (must not exist unless --overwrite)")
    m.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
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
        type=Path,
        metavar="FILE",
        help="also (or only, without --out) write the equivalent mergekit YAML",
    )
    m.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    m.set_defaults(func=_cmd_merge)

    from search.world import add_world_parser
    from trainables.evaluate import add_eval_parser  # light: lm_eval loads only when run

    add_world_parser(sub)
    add_eval_parser(sub)
    from search.search_cli import add_search_parser  # light: ray/optuna load only when run

    add_search_parser(sub)
    from search.train_cli import add_train_parser  # light: torch/ray load only when run

    add_train_parser(sub)
    from analysis.cli import add_analyze_parser  # light: pandas/matplotlib load only when run

    add_analyze_parser(sub)

    d = sub.add_parser(
        "demo",
        help="the whole pipeline on the embedded world: train experts, search, promote (CPU)",
        description="Build the embedded world, train an English-math and an xa language expert "
        "with Ray Train, score their merging indicators, search layer-swap recipes with Ray Tune "
        "+ Optuna on the proxies' dev splits, evaluate the best recipes and the baselines with "
        "lm-eval on the test splits, and write the leaderboard and the best model (about ten "
        "minutes on 2 CPU cores). --merge-only: just one layer swap of a generated tiny family.",
    )
    d.add_argument(
        "--out", type=Path, default=Path("runs/demo"), help="run folder (default: runs/demo)"
    )
    d.add_argument("--overwrite", action="store_true", help="replace an existing demo run")
    d.add_argument("--world-size", choices=["full", "tiny"], default="full", help="world preset")
    d.add_argument("--seed", type=int, default=0, help="world and search seed (default: 0)")
    d.add_argument("--trials", type=int, default=16, help="merge-search trials (default: 16)")
    d.add_argument(
        "--train-steps", type=int, help="expert training steps (default: the example configs')"
    )
    d.add_argument(
        "--merge-only",
        action="store_true",
        help="only merge a generated tiny family (seconds; no world, training or search)",
    )
    d.set_defaults(func=_cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, ValidationError, FileExistsError, FileNotFoundError, OSError) as e:
        print(f"layerswap: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
