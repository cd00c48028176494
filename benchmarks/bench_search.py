"""Merge-search benchmark on the embedded world: throughput, compose share, search efficiency.

Run: nice -n 10 .venv/bin/python benchmarks/bench_search.py [--world DIR] [--size tiny] [--recipes 6] [--seeds 5]

(a) the search (Ray Tune + OptunaSearch, in-memory composition, cached proxy evaluator) on N
    recipes vs a loop that, for the same recipes, merges to disk, reloads and scores with lm-eval:
    per-recipe proxy scores must be equal; trials/hour ratio (target >= 5x).
(b) share of trial time spent composing (t_compose / t_total over the search's trials; <= 2%).
(c) every recipe of a grid scored once (in-process TrialRunner); then TPE (as the search runs it:
    seeded, paper default enqueued, repeats served from results) and random search, 5 seeds each,
    replay against that table: distinct evaluations to reach a top-5% recipe (<= 15% of the grid,
    better than random). Writes bench-out/bench_search.json. On the v4 world with the demo's
    experts and space (~10 min on one core):
    bench_search.py --world runs/demo0/world --experts MATH LANG --space demo --max-gen-toks 24 --only-c
(d) with --shape llama-8b (on a GPU): seconds per trial (compose + proxies) of a model of that
    shape with random weights and the world tokenizer, experts in host memory (benchmarks/
    shapes.py), on all items of the world's default proxies (spaces.search_experiment.
    world_proxies), and the share of trial time spent copying expert tensors to the device.
    Skips (a)-(c).
    Run: .venv/bin/python benchmarks/bench_search.py --shape llama-8b [--trials 4] [--depth N]

(e) fidelity policies (none, screen, successive halving) and concurrency modes (sequential,
    reproducible batches, asynchronous) on the same kind of grid, scored per item, replayed
    through the search's own rules: benchmarks/search_replay.py (items and trials to a top-5 %
    recipe, 5 seeds; logs in benchmarks/logs/world_v4/search_replay_seedS.*).

A failed trial (or a recipe the two paths of (a) score differently) ends the run with exit 1,
saying which, and no figures: a ratio over the trials that ran would hide those that did not.
Paths may be relative to the working directory (made absolute before Ray's workers see them).
Smoke runs (tests/benchmarks/test_bench_search.py, seconds to a minute on 2 cores):
    bench_search.py --world W --experts MATH LANG --space demo --recipes 2 --seeds 1 --out F.json
    bench_search.py --shape llama-tiny --world W --trials 1 --limit 2

The code: this script holds the command line and the two runs; benchmarks/search_bench/ holds
the parts (space.py: the grids; experiments.py: the search experiments; efficiency.py: (c);
race.py: (a) and (b); shape_trials.py: (d)).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "search"))  # expert builders shared with the tests
sys.path.insert(0, str(ROOT / "benchmarks"))  # shapes.py, search_bench/

from search_bench import RunsFailed  # noqa: E402
from search_bench.efficiency import grid_table, search_efficiency  # noqa: E402
from search_bench.experiments import _one_pair, bench_experiment  # noqa: E402
from search_bench.race import race  # noqa: E402
from search_bench.shape_trials import bench_shape  # noqa: E402
from search_bench.space import SPACES, enumerate_space  # noqa: E402

# search_replay.py and gpu_check/trials.py import the experiment, its fields and the grid
# enumeration from here.
__all__ = ["_one_pair", "bench_experiment", "enumerate_space", "main", "parse_args"]


def parse_args(argv=None):
    """The command line (see the module docstring), checked, its paths made absolute."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--world", type=Path, help="world folder (default: build a tiny one in a temp dir)"
    )
    ap.add_argument("--size", default="tiny", choices=["tiny", "full"])
    ap.add_argument("--recipes", type=int, default=6, help="(a): recipes in the throughput race")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.3, help="(c): search budget, share of grid")
    ap.add_argument("--grid-from", type=Path, help="(c): reuse the grid table of an earlier output JSON")  # fmt: skip
    ap.add_argument("--only-c", action="store_true", help="skip (a) and (b)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "bench_search.json")
    ap.add_argument("--shape", choices=["llama-8b", "llama-tiny"], help="(d) only: trials of this shape (benchmarks/shapes.py; llama-tiny: a CPU smoke run)")  # fmt: skip
    ap.add_argument("--depth", type=int, help="(d): fewer layers (a CPU smoke run)")
    ap.add_argument("--trials", type=int, default=4, help="(d): recipes timed")
    ap.add_argument("--space", default="wide", choices=sorted(SPACES), help="(a)-(c): the search space (wide: the benchmark's own grid; demo: the search's defaults, as `layerswap demo` searches)")  # fmt: skip
    ap.add_argument("--experts", type=Path, nargs=2, metavar=("MATH", "LANG"), help="(a)-(c): these trained checkpoints (from --world's base) instead of two quick tiny experts")  # fmt: skip
    ap.add_argument("--max-gen-toks", type=int, help="MGSM generation budget (default: 8 in (a)-(c), 32 in (d))")  # fmt: skip
    ap.add_argument("--limit", type=int, help="(d): first N items per proxy (default: all)")
    args = ap.parse_args(argv)
    if args.experts and args.world is None:
        ap.error("--experts needs --world, the world whose base they were trained from")
    if args.shape and (args.experts or args.space != "wide"):
        ap.error(
            "--shape (d) uses random weights of that shape: --experts and --space are (a)-(c)'s"
        )
    for d in args.experts or []:
        if not (d / "config.json").is_file():
            ap.error(f"--experts {d}: not a checkpoint folder (no config.json)")
    if args.world is not None and not (args.world / "world.json").is_file():
        ap.error(f"--world {args.world}: no world.json there (build one with `layerswap world build`)")  # fmt: skip
    if args.grid_from is not None and not args.grid_from.is_file():
        ap.error(f"--grid-from {args.grid_from}: no such file")
    # Absolute before anything reads them: Ray's workers run in another working directory, where
    # a relative folder does not exist and transformers takes the name for a Hub repo id.
    for name in ("world", "grid_from", "out"):
        if getattr(args, name) is not None:
            setattr(args, name, getattr(args, name).resolve())
    if args.experts:
        args.experts = [d.resolve() for d in args.experts]
    return args


def main(argv=None) -> int:
    """Run (d), or (a)-(c); 1 (saying what failed, reporting nothing) when any trial failed."""
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-search-"))
    try:
        bench_shape(args, tmp) if args.shape else bench_grid(args, tmp)
    except RunsFailed as e:
        print(f"bench_search: FAILED, no figures reported: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def bench_grid(args, tmp: Path) -> None:
    """(a)-(c) (see the module doc) in the scratch folder `tmp`; writes args.out."""
    # lazy: heavy imports stay out of --help and parse_args (imported by the tests and scripts)
    import optuna
    import torch

    from layerswap.spaces.recipe import recipe_id
    from layerswap.spaces.search_space import decode
    from layerswap.trainables.atomic import atomic_write_text

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(1)
    exp, world, depth, pool = bench_experiment(args, tmp)
    grid = enumerate_space(exp.space, depth, pool)
    report: dict = {"world": str(world), "depth": depth, "grid_size": len(grid)}
    print(f"grid: {len(grid)} recipes (depth {depth})", flush=True)
    # (c) first: the exhaustive table, in-process (also gives per-trial timings)
    table, timing = grid_table(exp, world, depth, pool, grid, tmp, args.grid_from)
    report |= timing
    report["grid_table"] = [[p, table[recipe_id(decode(p, exp.space, depth, pool))]] for p in grid]
    report["c_search_efficiency"] = search_efficiency(exp, depth, pool, table, args.budget, args.seeds)  # fmt: skip
    print(json.dumps(report["c_search_efficiency"], indent=1), flush=True)
    if not args.only_c:
        ab = race(exp, grid, args.recipes, tmp)
        ab["b_compose_share"]["grid_trials"] = report["grid_compose_share"]
        report |= ab
        print(json.dumps(ab, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
