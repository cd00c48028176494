"""`layerswap demo --out DIR`: the whole pipeline on the embedded world (or --merge-only).

Thin: the pipeline is demo.pipeline.run_demo, the merge-only demo demo.merge_only. It prints its
own progress (stage k/5, trial k/N with the best so far and an ETA, one line per promoted model);
`--verbose` adds lm-eval's progress bars and log. Run `layerswap demo --help`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from layerswap.cli.args import count

MAX_TRIALS = 10_000  # merge-search trials, each a merge and an evaluation on the CPU
MAX_TRAIN_STEPS = 1_000_000


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.merge_only and args.resume:
        raise ValueError("--resume continues a pipeline run; --merge-only has nothing to resume")
    # Defaults are applied here, so a pipeline flag given with --merge-only is seen and refused
    # (it was ignored without a word).
    pipeline = {"--world-size": args.world_size, "--seed": args.seed, "--trials": args.trials, "--train-steps": args.train_steps}  # fmt: skip
    if args.merge_only and (given := [k for k, v in pipeline.items() if v is not None]):
        raise ValueError(f"{', '.join(given)}: the pipeline's settings; --merge-only merges a generated tiny family only")  # fmt: skip
    if args.merge_only:
        # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
        from layerswap.demo.merge_only import run_merge_demo

        run_merge_demo(Path(args.out), overwrite=args.overwrite)
        return 0
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.demo.pipeline import DemoSettings, run_demo

    settings = DemoSettings(
        world_size=args.world_size or "full",
        seed=0 if args.seed is None else args.seed,
        train_steps=args.train_steps,
        trials=args.trials or 16,
    )
    run_demo(
        Path(args.out),
        overwrite=args.overwrite,
        resume=args.resume,
        settings=settings,
        verbose=args.verbose,
    )
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `demo` subcommand to a `layerswap` subparsers object; returns its parser."""
    d = subparsers.add_parser(
        "demo",
        help="the whole pipeline on the embedded world: train experts, search, promote (CPU)",
        description="Build the embedded world, train an English-math and an xa language expert "
        "with Ray Train, score their merging indicators, search layer-swap recipes with Ray Tune "
        "+ Optuna on the proxies' dev splits, evaluate the best recipes and the baselines with "
        "lm-eval on the test splits, and write the leaderboard and the best model (4-8 "
        "minutes on 2 CPU cores). --merge-only: just one layer swap of a generated tiny family.",
    )
    d.add_argument(
        "--out", type=Path, default=Path("runs/demo"), help="run folder (default: runs/demo)"
    )
    d.add_argument("--overwrite", action="store_true", help="replace an existing demo run")
    d.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted demo run in --out: trained experts and finished search "
        "trials are kept, unfinished training resumes from its last checkpoint (an --out with "
        "no demo run in it starts a new one, saying so)",
    )
    d.add_argument(
        "--world-size",
        choices=["full", "tiny"],
        help="world preset (default: full; tiny: a small world for a quick end-to-end check)",
    )
    d.add_argument("--seed", type=int, help="world and search seed (default: 0)")
    d.add_argument("--trials", type=count(MAX_TRIALS), help="merge-search trials (default: 16)")
    d.add_argument(
        "--train-steps",
        type=count(MAX_TRAIN_STEPS),
        help="expert training steps (default: the example configs')",
    )
    d.add_argument(
        "--merge-only",
        action="store_true",
        help="only merge a generated tiny family (~15 s; no world, training or search)",
    )
    d.add_argument(
        "--verbose",
        action="store_true",
        help="also Ray's, Tune's and Optuna's own notices and lm-eval's per-request progress "
        "bars and INFO log (default: the demo's own stage, trial and model lines only)",
    )
    d.set_defaults(func=_cmd_demo)
    return d
