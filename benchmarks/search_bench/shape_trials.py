"""(d) of the merge-search benchmark: seconds per trial (compose + proxies) of a model of a real
shape (benchmarks/shapes.py) with random weights, experts in host memory, on the world's proxies.

Used by benchmarks/bench_search.py (--shape); not run on its own.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from . import RunsFailed
from .experiments import shape_experiment
from .space import enumerate_space

# Heavy imports (torch, optuna, Ray, lm-eval, the project) sit inside the functions: the
# script's --help and its argument checks stay instant.


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
