"""Training throughput under Ray Train (1 worker) vs the plain loop, and FSDP vs DDP (2 workers).

Run `python benchmarks/bench_train.py [--steps 60] [--hidden 256] [--threads 1] [--out F.json]`
(~5-6 min on 2 CPU cores; `--skip-strategies` leaves out FSDP vs DDP: ddp, fsdp, ddp again,
Ray Train with 2 workers of `--threads` each, gloo, fp32, the DDP runs averaged). Tokens/s are measured between the first and the last training step
(from the loop's per-step log), so Ray's fixed start-up (cluster, worker group, process group,
model load) is excluded and reported separately as the time from `fit()` to the first step.
Both arms run the same `run_training` on the same thread count and report every step.
`--world W` reuses a built world (default: a tiny one built in a temporary folder); paths may be
relative (made absolute before Ray's workers read them). A failed training run ends the
benchmark with exit 1 naming it, and no figures.
Smoke run (tests/benchmarks/test_bench_train.py, ~1 min on 2 cores, mostly Ray's start-up):
    bench_train.py --world W --steps 4 --hidden 32 --layers 2 --batch-size 2 --log-every 1
        --skip-strategies --skip-plain2 --out F.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def make_base(world: Path, out: Path, hidden: int, layers: int) -> Path:
    """A randomly initialised Llama of the given width on the world's tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(world / "base")
    cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers = hidden, 3 * hidden, layers
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 8, 4, hidden // 8
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(world / "base").save_pretrained(out)
    return out


class RunFailed(RuntimeError):
    """A training run of the benchmark failed: no figure is reported, the exit is 1."""


def throughput(log: Path) -> dict:
    """Tokens/s between the first and the last step of a step log (at least two steps)."""
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    if len(rows) < 2:
        raise RunFailed(f"{log}: {len(rows)} steps logged; tokens/s needs two")
    a, b = rows[0], rows[-1]
    dt = b["time"] - a["time"]
    return {
        "steps": len(rows),
        "tokens": b["tokens"] - a["tokens"],
        "seconds": dt,
        "tokens_per_s": (b["tokens"] - a["tokens"]) / dt,
        "first_step_time": a["time"],
    }


def compare_strategies(exp, root: Path) -> dict:
    """Ray Train, 2 workers: ddp, fsdp, ddp again (the two DDP runs bracket the FSDP one)."""
    from layerswap.trainables.train.ray_train import train_with_ray

    out = {}
    for tag, strategy in (("ddp_a", "ddp"), ("fsdp", "fsdp"), ("ddp_b", "ddp")):
        res = train_with_ray(exp(tag, workers=2, strategy=strategy))
        if res.error is not None:
            raise RunFailed(f"{tag} ({strategy}, 2 workers): {res.error}")
        out[tag] = throughput(root / f"{tag}.jsonl")
        out[tag].pop("first_step_time")
    ddp = (out["ddp_a"]["tokens_per_s"] + out["ddp_b"]["tokens_per_s"]) / 2
    out["ratio_fsdp_over_ddp"] = out["fsdp"]["tokens_per_s"] / ddp
    return out


def print_results(results: dict) -> None:
    """The side-by-side table: plain loop and Ray Train, then DDP and FSDP when measured."""
    for k in ("plain1", "ray", "plain2"):
        if k not in results:
            continue
        r = results[k]
        print(f"{k:7s} {r['tokens_per_s']:9.0f} tok/s over {r['steps']} steps ({r['seconds']:.1f}s), start-up to first step {r['startup_s']:.1f}s")  # fmt: skip
    print(f"ray.init {results['ray']['ray_init_s']:.1f}s; fit() total {results['ray']['fit_total_s']:.1f}s")  # fmt: skip
    print(f"Ray Train / plain loop tokens/s: {results['ratio_ray_over_plain']:.3f} (target >= 0.9)")  # fmt: skip
    if "fsdp" in results:
        for k in ("ddp_a", "fsdp", "ddp_b"):
            print(f"{k:7s} {results[k]['tokens_per_s']:9.0f} tok/s (2 workers, {results[k]['steps']} steps)")  # fmt: skip
        print(f"FSDP / DDP tokens/s (2 workers, CPU, gloo): {results['ratio_fsdp_over_ddp']:.3f}")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--log-every", type=int, default=10, help="steps between reports (default 10)")
    p.add_argument("--skip-plain2", action="store_true", help="one plain run, before Ray only")
    p.add_argument("--skip-strategies", action="store_true", help="no FSDP vs DDP comparison")
    p.add_argument("--out", type=Path)
    p.add_argument("--world", type=Path, help="a built world (default: a tiny one, built in a temporary folder)")  # fmt: skip
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error(f"--steps {args.steps}: tokens/s is measured between the first and the last step; give at least 2")  # fmt: skip
    if args.world is not None:
        if not (args.world / "world.json").is_file():
            p.error(f"--world {args.world}: no world.json there (build one with `layerswap world build`)")  # fmt: skip
        args.world = args.world.resolve()  # Ray's workers read its data from another directory
    return args


def experiments(args: argparse.Namespace, world: Path, base: Path, root: Path):
    """exp(tag, workers, strategy): the benchmark's experiment, logging steps to root/<tag>.jsonl."""
    from layerswap.spaces.train_experiment import parse_train_experiment

    def exp(tag: str, workers: int = 1, strategy: str = "ddp"):
        return parse_train_experiment(
            {
                "name": f"bench_{tag}",
                "base": str(base),
                "kind": "math",
                "language": "en",
                "datasets": [{"path": str(world / "data/sft/math_en.jsonl")}],
                "mode": "full",
                "hyper": {
                    "lr": 1e-3,
                    "batch_size": args.batch_size,
                    "max_steps": args.steps,
                    "seq_len": 128,
                    "val_share": 0.02,
                    "log_every": args.log_every,
                },
                "scaling": {
                    "num_workers": workers,
                    "cpus_per_worker": args.threads,
                    "strategy": strategy,
                },
                "precision": "fp32",
                "storage_path": str(root / "ray"),
                "debug": {"step_log": str(root / f"{tag}.jsonl")},
            }
        )

    return exp


def plain_run(exp, root: Path, tag: str) -> dict:
    """The plain loop in this process: its throughput and time to the first step."""
    from layerswap.trainables.train import run_training

    t = time.time()
    run_training(exp(tag), workdir=root / tag, report=lambda m, c: None)
    out = throughput(root / f"{tag}.jsonl")
    out["startup_s"] = out.pop("first_step_time") - t
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (see the module doc); 1, naming the run, when a training run failed."""
    args = parse_args(argv)
    try:
        results = measure(args)
    except RunFailed as e:
        print(f"bench_train: FAILED, no figures reported: {e}", file=sys.stderr)
        return 1
    print_results(results)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)  # after minutes of work: not lost
        args.out.write_text(json.dumps(results, indent=1))
    return 0


def measure(args: argparse.Namespace) -> dict:
    """The plain loop, Ray Train and (unless skipped) DDP vs FSDP, in a temporary folder."""
    import ray
    import torch

    from layerswap.trainables.train.ray_train import train_with_ray
    from layerswap.world import build_world

    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="bench_train_"))
    try:
        world = args.world or build_world(root / "world", seed=0, size="tiny", progress=False)
        base = make_base(world, root / "base", args.hidden, args.layers)
        exp = experiments(args, world, base, root)

        results: dict = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}  # fmt: skip
        results["plain1"] = plain_run(exp, root, "plain1")

        t = time.time()
        # a short path: Ray's socket paths are length-limited
        ray_tmp = tempfile.mkdtemp(prefix="lsb", dir="/tmp")
        ray.init(num_cpus=max(2, args.threads), _temp_dir=ray_tmp, include_dashboard=False, log_to_driver=False)  # fmt: skip
        t_init = time.time() - t
        t = time.time()
        res = train_with_ray(exp("ray"))
        t_fit = time.time() - t
        if res.error is not None:
            raise RunFailed(f"ray (1 worker): {res.error}")
        results["ray"] = throughput(root / "ray.jsonl")
        results["ray"]["startup_s"] = results["ray"].pop("first_step_time") - t
        results["ray"] |= {"ray_init_s": t_init, "fit_total_s": t_fit}
        if not args.skip_strategies:
            results |= compare_strategies(exp, root)
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)  # kept after a failure: its logs say why

        plains = ["plain1"] if args.skip_plain2 else ["plain1", "plain2"]
        if not args.skip_plain2:
            results["plain2"] = plain_run(exp, root, "plain2")
        plain = sum(results[k]["tokens_per_s"] for k in plains) / len(plains)
        results["ratio_ray_over_plain"] = results["ray"]["tokens_per_s"] / plain
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
