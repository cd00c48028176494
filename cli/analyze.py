"""`layerswap analyze RUN_DIR [--out DIR]`: the analysis report of a run folder.

Thin: checks the arguments, then calls analysis.report.analyze_run. Run `layerswap analyze --help`.
`--continue` keeps a report of the run written after the run last changed (analysis.report
.report_state), saying so, and rewrites an older one (what a study's exported commands.sh passes).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from layerswap.cli.args import continue_clash, count, finite_float
from layerswap.trainables.outputs import nothing_to_do

# Bootstrap indices are [resamples, pairs] int64: a million resamples of 100 pairs are 0.8 GB
# (a billion asked for 37 GiB).
MAX_RESAMPLES = 1_000_000
MAX_EXPERTS = 64  # ΔW maps per expert kind, each a streamed pass over a checkpoint


def _open_unit_float(text: str) -> float:
    v = finite_float()(text)
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1 (exclusive), got {text!r}")  # fmt: skip
    return v


def _cmd_analyze(args: argparse.Namespace) -> int:
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.analysis.report import analyze_run, report_dir, report_state

    overwrite = args.overwrite
    if args.cont:
        if clash := continue_clash(args, "rewrites only a report older than its run"):
            raise ValueError(clash)
        state = report_state(args.run_dir, args.out) if args.run_dir.is_dir() else "none"
        if state == "current":
            out = report_dir(args.run_dir, args.out)
            nothing_to_do(out, f"{out}: the report of {args.run_dir} is up to date; nothing to do")
            return 0
        overwrite = state == "stale"  # only this run's own report; anything else is refused
    out = analyze_run(
        args.run_dir,
        args.out,
        overwrite=overwrite,
        n_resamples=args.resamples,
        seed=args.seed,
        delta_threshold=args.delta_threshold,
        # Left out when not given: analysis.delta.DEFAULT_QUANTILE is the one default.
        **({} if args.delta_quantile is None else {"delta_quantile": args.delta_quantile}),
        max_experts=args.max_experts,
    )
    print(
        f"wrote {out / 'report.html'} (self-contained), {out / 'report.md'} and {out / 'figures'}/"
    )
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the `analyze` subcommand on an argparse subparsers object."""
    a = subparsers.add_parser(
        "analyze",
        help="report on a run: indicator correlations, ΔW maps, the search, treatments",
        description="Read a run directory (experts/registry.parquet, search/trials.parquet, "
        "search/study.db, promotion/results.parquet, or a demo's recipe.yaml; each optional) and "
        "write a report folder: report.html (self-contained, figures embedded), report.md, "
        "figures/*.png and summary.json. Sections: merging indicators vs the target score "
        "(Spearman/Kendall/Pearson with bootstrap CIs, top-k agreement), where each expert "
        "changed (ΔW heatmaps and suggested layer-swap boundaries), the search (score over "
        "(b, u), importances, best so far, proxy vs target) and the treatments table with a "
        "Friedman test. A section whose data the run lacks says so; a folder with none of "
        "these files is refused. The output is written "
        "atomically; a malformed input file stops it with the file named (exit 2).",
    )
    a.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run directory")
    a.add_argument("--out", type=Path, help="report folder (default: RUN_DIR/analysis)")
    a.add_argument("--overwrite", action="store_true", help="replace an existing report folder")
    a.add_argument(
        "--continue",
        dest="cont",
        action="store_true",
        help="keep a report of this run written after every file of RUN_DIR last changed, "
        "saying so (exit 0); rewrite an older report of this run, as --overwrite would; write "
        "one where there is none. What a study's exported commands.sh passes",
    )
    a.add_argument(
        "--resamples",
        type=count(MAX_RESAMPLES),
        default=2000,
        help="bootstrap resamples for the correlation CIs (default: 2000)",
    )
    a.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0)")
    thr = a.add_mutually_exclusive_group()
    thr.add_argument(
        "--delta-threshold",
        type=finite_float(0),
        default=None,
        metavar="X",
        help="absolute row threshold on mean |ΔW| (default: a per-expert quantile, below)",
    )
    thr.add_argument(
        "--delta-quantile",
        type=_open_unit_float,
        default=None,
        metavar="Q",
        help="a row counts as changed when its mean |ΔW| is above this quantile of the "
        "expert's own rows (default: 0.9, the expert's top 10 %%)",
    )
    a.add_argument(
        "--max-experts",
        type=count(MAX_EXPERTS),
        default=2,
        metavar="N",
        help="ΔW maps per expert kind (each is one streamed pass over the checkpoint; default 2)",
    )
    a.set_defaults(func=_cmd_analyze)
    return a
