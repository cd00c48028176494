"""The search experiments the merge-search benchmark runs: (a)-(c)'s on the world's experts (or
two quick tiny ones) and (d)'s on a real shape's random experts.

Used by benchmarks/bench_search.py (and search_replay.py, gpu_check/trials.py through it); not
run on its own.
"""

from __future__ import annotations

import json
from pathlib import Path

from .space import SPACES

# Heavy imports (torch, optuna, Ray, lm-eval, the project) sit inside the functions: the
# script's --help and its argument checks stay instant.


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
