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
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "search"))  # expert builders shared with the tests
sys.path.insert(0, str(ROOT / "benchmarks"))  # shapes.py


class RunsFailed(RuntimeError):
    """Trials of the benchmark failed or disagreed: no figure is reported, the exit is 1."""


def _wide_space(depth: int) -> dict:
    """The benchmark's own grid: swaps from none to half the depth, 0/1-layer transitions and
    every non-layer choice (~1100 recipes at depth 24)."""
    return {
        "bottom": {"low": 0, "high": max(1, depth // 2)},
        "top": {"low": 0, "high": max(1, depth // 4)},
        "bottom_transition": {"low": 0, "high": 1},
        "top_transition": {"low": 0, "high": 1},
        "non_layer": ["average", "language", "task"],
    }


# --space: name -> the search space (spaces.search_space.SearchSpace fields) at a depth
SPACES = {"wide": _wide_space, "demo": lambda depth: {}}  # demo: the search's defaults


def enumerate_space(space, depth, pool) -> list[dict]:
    """Every params dict the define-by-run space can produce (DFS over its suggest calls)."""
    from layerswap.spaces.search_space import suggest

    class Path_:
        def __init__(self, prefix):
            self.prefix, self.i, self.params, self.branches = prefix, 0, {}, []

        def _pick(self, name, options):
            if self.i < len(self.prefix):
                v = self.prefix[self.i]
            else:
                v = options[0]
                self.branches.append((self.i, options))
            self.i += 1
            self.params[name] = v
            return v

        def suggest_int(self, name, low, high):
            return self._pick(name, list(range(low, high + 1)))

        def suggest_categorical(self, name, choices):
            return self._pick(name, list(choices))

        def suggest_float(self, name, low, high):
            return self._pick(name, [(low + high) / 2])

    out, stack = [], [[]]
    while stack:
        prefix = stack.pop()
        t = Path_(prefix)
        suggest(t, space, depth, pool)
        if any(len(o) > 1 for _, o in t.branches):
            i, options = next((i, o) for i, o in t.branches if len(o) > 1)
            taken = [t.params[k] for k in list(t.params)[:i]]
            stack += [[*taken, v] for v in options]
        else:
            out.append(t.params)
    return out


def replay(space, depth, pool, table: dict, sampler, budget: int, top: set, warm: dict | None):
    """Distinct evaluations until a top recipe is evaluated (None if not within budget)."""
    import optuna

    from layerswap.spaces.recipe import recipe_id
    from layerswap.spaces.search_space import decode, suggest

    study = optuna.create_study(direction="maximize", sampler=sampler)
    if warm is not None:
        study.enqueue_trial(warm)
    seen: list[str] = []
    for _ in range(budget * 20):  # repeats are served, not counted; bound the loop anyway
        t = study.ask()
        suggest(t, space, depth, pool)
        rid = recipe_id(decode(t.params, space, depth, pool))
        study.tell(t, table[rid])
        if rid not in seen:
            seen.append(rid)
            if rid in top:
                return len(seen)
        if len(seen) >= budget:
            return None
    return None


def search_efficiency(exp, depth: int, pool, table: dict, budget_share: float, seeds: int) -> dict:
    """(c): TPE (with and without the paper default enqueued) and random search replayed against
    the grid table, `seeds` seeds each: distinct evaluations to reach a top-5 % recipe.

    Args:
        exp: the search experiment (its space and sampler settings).
        depth, pool: the model's depth and the expert pool the recipes decode with.
        table: recipe id -> proxy objective, every recipe of the space.
        budget_share: the search budget as a share of the grid.
        seeds: seeds per sampler.
    Returns:
        the report's "c_search_efficiency" block.
    """
    import optuna

    from layerswap.search.searcher import make_sampler
    from layerswap.spaces.search_space import warm_start

    values = sorted(table.values(), reverse=True)
    cut = values[max(0, int(0.05 * len(values)) - 1)]
    top = {r for r, v in table.items() if v >= cut}
    budget = max(1, int(budget_share * len(table)))

    def exp_s(seed):  # the search's own sampler settings, with this budget and seed
        return exp.model_copy(
            update={"search": exp.search.model_copy(update={"seed": seed, "num_samples": budget})}
        )

    res_c = {
        "distinct_recipes": len(table),
        "top5_threshold": cut,
        "top5_count": len(top),
        "budget": budget,
    }
    for name, make, warm in (
        ("tpe", lambda s: make_sampler(exp_s(s)), warm_start(exp.space, depth, pool)),
        ("tpe_no_warm_start", lambda s: make_sampler(exp_s(s)), None),
        ("random", lambda s: optuna.samplers.RandomSampler(seed=s), None),
    ):
        hits = [replay(exp.space, depth, pool, table, make(s), budget, top, warm) for s in range(seeds)]  # fmt: skip
        found = [h for h in hits if h is not None]
        median = statistics.median([h if h is not None else budget + 1 for h in hits])
        res_c[name] = {
            "evals_to_top5": hits,
            "found": f"{len(found)}/{len(hits)}",
            "median_evals": median,
            "median_share_of_grid": round(median / len(table), 3),
        }
    return res_c


def _one_pair(name: str, world: Path, paths: dict) -> dict:
    """The experiment fields every benchmark search shares: one task and one language expert of
    `paths` ({"base", "task", "language"}) on the world's xa proxies."""
    return {
        "name": name,
        "language": "xa",
        "base": str(paths["base"]),
        "task_experts": [str(paths["task"])],
        "language_experts": [str(paths["language"])],
        "world": str(world),
    }


def shape_experiment(args, world: Path, dirs: dict, depth: int):
    """(d)'s search experiment: the shape's random experts on the world's proxies, one GPU a trial."""
    from layerswap.spaces.search_experiment import SearchExperiment

    return SearchExperiment.model_validate(
        {
            **_one_pair("bench-shape", world, dirs),
            "proxy_eval": {
                "max_gen_toks": args.max_gen_toks or 32,
                "batch_size": "auto",
                "limit": args.limit,
            },
            "space": {
                "bottom": {"low": 1, "high": max(1, depth // 4)},
                "top": {"low": 0, "high": max(0, depth // 8)},
                "bottom_transition": {"low": 0, "high": 1},
                "top_transition": {"low": 0, "high": 0},
                "weighting": ["uniform"],
            },
            "search": {"gpus_per_trial": 1, "fidelity": {"screen": None}},
        }
    )


def bench_shape(args, tmp: Path) -> None:
    """(d): per-trial seconds of a real-shaped model on the world's proxies (see module doc),
    its files in the scratch folder `tmp`."""
    import torch
    from shapes import shape_config, shape_experts
    from transformers import AutoTokenizer

    from layerswap.search.trial import TrialRunner
    from layerswap.spaces.search_space import ExpertPool, decode, warm_start
    from layerswap.trainables.evaluate.tasks import write_world_tasks
    from layerswap.world import build_world

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(os.cpu_count() or 1)
    world = args.world or build_world(tmp / "world", size="tiny", progress=False)
    tok = AutoTokenizer.from_pretrained(world / "base")
    cfg = shape_config(args.shape, tok, args.depth)
    t0 = time.perf_counter()
    states = shape_experts(cfg, make_on=device)
    print(
        f"{args.shape} (depth {cfg.num_hidden_layers}) experts made in {time.perf_counter() - t0:.0f}s"
    )
    dirs = {}
    for role in states:  # config and tokenizer on disk; the weights come from memory
        dirs[role] = tmp / role
        cfg.save_pretrained(dirs[role])
        tok.save_pretrained(dirs[role])
    by_path = {str(d): states[r] for r, d in dirs.items()}
    depth = cfg.num_hidden_layers
    exp = shape_experiment(args, world, dirs, depth)
    pool = ExpertPool.from_paths(exp.task_experts, exp.language_experts, exp.base)
    tasks = tmp / "tasks"
    write_world_tasks(world, tasks)
    runner = TrialRunner(
        exp, pool, [str(tasks)], device=device, loader=lambda ref: (by_path[ref], set())
    )
    n_items = {t: len(c.items) for t, c in runner.parts[0].tasks.items()}
    print(f"device {device}; items {n_items}; {runner.live.placement}", flush=True)
    grid = enumerate_space(exp.space, depth, pool)
    recipes = [warm_start(exp.space, depth, pool), *grid[:: max(1, len(grid) // args.trials)]]
    rows = []
    for params in recipes[: args.trials + 1]:
        res = runner.run(decode(params, exp.space, depth, pool))
        if res.status != "ok":
            raise RunsFailed(f"(d): trial {len(rows) + 1} {res.status}: {res.error}")
        rows.append(res)
        print(
            f"trial: compose {res.t_compose_s:6.2f}s (moving {res.t_move_s:6.2f}s)  proxies "
            f"{res.t_eval_s:6.2f}s  total {res.t_total_s:6.2f}s  tensors {res.moved}",
            flush=True,
        )
    warm, rest = rows[0], rows[1:] or rows
    med = statistics.median(r.t_total_s for r in rest)
    move = sum(r.t_move_s for r in rest) / sum(r.t_total_s for r in rest)
    print(
        f"first trial (every tensor placed) {warm.t_total_s:.1f}s; later trials median {med:.1f}s "
        f"per trial, {move:.1%} of it copying tensors to the device; "
        f"OOM back-offs {runner.parts[0].sizer.backoffs}"
    )


def parse_args(argv=None):
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


def bench_experiment(args, tmp: Path):
    """The world, the experts and the search experiment (a)-(c) run on.

    Returns:
        (experiment, world folder, depth, expert pool).
    """
    from search_fixtures import make_experts

    from layerswap.spaces.search_experiment import SearchExperiment
    from layerswap.spaces.search_space import ExpertPool
    from layerswap.world import build_world

    world = args.world or build_world(tmp / "world", size=args.size, progress=False)
    if args.experts:  # trained checkpoints (e.g. the demo's), from the world's base
        paths = {"base": world / "base", "task": args.experts[0], "language": args.experts[1]}
    else:
        paths = make_experts(world, tmp / "experts")
    depth = json.loads((Path(paths["task"]) / "config.json").read_text())["num_hidden_layers"]
    exp = SearchExperiment.model_validate(
        {
            **_one_pair("bench", world, paths),
            "proxy_eval": {"max_gen_toks": args.max_gen_toks or 8},
            "space": SPACES[args.space](depth),
            "search": {
                "num_samples": args.recipes,
                "max_concurrent": 1,
                "fidelity": {"screen": None},
            },
        }
    )
    return exp, world, depth, ExpertPool.from_paths(exp.task_experts, exp.language_experts, exp.base)  # fmt: skip


def grid_table(exp, world: Path, depth: int, pool, grid: list[dict], tmp: Path, grid_from: Path | None) -> tuple[dict, dict]:  # fmt: skip
    """(c)'s table: every recipe of the grid scored once in-process (or read from `grid_from`).

    Returns:
        (recipe id -> proxy objective, {"grid_compose_share", "grid_seconds"}).
    """
    from layerswap.search.trial import TrialRunner
    from layerswap.spaces.recipe import recipe_id
    from layerswap.spaces.search_space import decode
    from layerswap.trainables.evaluate.tasks import write_world_tasks

    table, t0, tc, tt = {}, time.perf_counter(), 0.0, 1e-9
    if grid_from is not None:
        # saved as [params, objective] pairs: recipe ids name this run's expert paths
        saved = json.loads(grid_from.read_text())["grid_table"]
        table = {recipe_id(decode(p, exp.space, depth, pool)): v for p, v in saved}
        assert len(table) == len(grid), "the grid changed since that run"
        return table, {"grid_compose_share": None, "grid_seconds": 0.0}
    write_world_tasks(world, tmp / "tasks")
    runner = TrialRunner(exp, pool, [str(tmp / "tasks")])
    for i, params in enumerate(grid):
        if i % 20 == 0:
            print(f"grid: {i}/{len(grid)} ({time.perf_counter() - t0:.0f}s)", flush=True)
        rec = decode(params, exp.space, depth, pool)
        res = runner.run(rec)
        if res.status != "ok":  # (c) replays the whole table: one hole would skew every seed
            raise RunsFailed(f"(c): grid recipe {i} {res.status}: {res.error}")
        table[recipe_id(rec)] = res.objective
        tc, tt = tc + res.t_compose_s, tt + res.t_total_s
    timing = {"grid_compose_share": round(tc / tt, 4), "grid_seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    return table, timing


def race(exp, grid: list[dict], n_recipes: int, tmp: Path) -> dict:
    """(a) + (b): the search through Ray on `n_recipes` of the grid, then a merge-to-disk +
    lm-eval loop on the same recipes; their per-recipe scores must agree.

    Returns:
        {"a_throughput": ..., "b_compose_share": {"search_trials": ...}}.
    """
    import shutil

    import ray
    import yaml

    from layerswap.search.search import run_search
    from layerswap.spaces.recipe import parse_recipe
    from layerswap.trainables.atomic import read_parquet
    from layerswap.trainables.evaluate.harness import evaluate
    from layerswap.trainables.evaluate.scoring import task_score
    from layerswap.trainables.merge.engine import merge_to_disk

    chosen = grid[:: max(1, len(grid) // n_recipes)][:n_recipes]
    exp_a = exp.model_copy(
        update={"search": exp.search.model_copy(update={"points_to_evaluate": chosen[1:]})}
    )
    ray_tmp = tempfile.mkdtemp(prefix="lsb", dir="/tmp")
    ray.init(num_cpus=2, _temp_dir=ray_tmp, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    run_search(exp_a, tmp / "run", progress=False)
    t_search = time.perf_counter() - t0
    ray.shutdown()
    rows = read_parquet(tmp / "run" / "search" / "trials.parquet").to_pylist()
    evaluated = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] not in ("ok", "duplicate")]
    if failed or not evaluated:  # a ratio over the trials that ran would hide the ones that did not
        raise RunsFailed(
            f"(a): {len(failed)} of {len(rows)} search trials failed, {len(evaluated)} evaluated:\n"
            + "\n".join(f"  trial {r['trial_id']} ({r['status']}): {r['error']}" for r in failed)
            + f"\n(Ray's logs: {ray_tmp})"
        )
    shutil.rmtree(ray_tmp, ignore_errors=True)
    proxies = [p.task for p in exp.proxy_list]
    t0 = time.perf_counter()
    mismatches = []
    for r in evaluated:
        out = tmp / "disk" / r["recipe_id"]
        merge_to_disk(parse_recipe(yaml.safe_load(r["recipe_yaml"])), out, overwrite=True)
        tasks = str(tmp / "run" / "search" / "tasks")
        raw = evaluate(str(out), proxies, include_path=tasks, max_gen_toks=exp.proxy_eval.max_gen_toks)  # fmt: skip
        for t in proxies:
            # 1e-6: lm-eval batches the requests otherwise, so float32 log-likelihoods (and a
            # Brier score from them) may differ in their last bits (~1e-8 seen); an accuracy
            # differs by at least 1/items when an answer does.
            if abs(task_score(raw, t) - r[f"proxy__{t}"]) > 1e-6:
                mismatches.append((r["recipe_id"], t, task_score(raw, t), r[f"proxy__{t}"]))
    t_loop = time.perf_counter() - t0
    if mismatches:  # the two paths must score a recipe alike, or their speeds are not comparable
        raise RunsFailed("(a): the search and the merge-to-disk loop score recipes differently "
                         "(recipe, proxy, loop, search):\n" + "\n".join(f"  {m}" for m in mismatches))  # fmt: skip
    n = len(evaluated)
    t_trials = max(1e-9, sum(r["t_total_s"] for r in evaluated))
    return {
        "a_throughput": {
            "recipes": n,
            "search_seconds_incl_ray_setup": round(t_search, 1),
            "search_trial_seconds": round(t_trials, 2),
            "loop_seconds": round(t_loop, 1),
            "search_trials_per_hour": round(3600 * n / t_search, 1),
            "loop_trials_per_hour": round(3600 * n / t_loop, 1),
            "speedup_wall": round(t_loop / t_search, 2),
            "speedup_per_trial": round(t_loop / t_trials, 2),
        },
        "b_compose_share": {
            "search_trials": round(sum(r["t_compose_s"] for r in evaluated) / t_trials, 4)
        },
    }


def main(argv=None) -> int:
    """Run (d), or (a)-(c); 1 (saying what failed, reporting nothing) when any trial failed."""
    import shutil

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
