"""`layerswap train EXPERIMENT.yaml [--out RUN_DIR]`: validate once, train an expert, say where.

Runs the experiment on Ray Train (trainables/ray_train.py) or, with `--no-ray`, in this process
(trainables/train). An experiment with a `search:` block is handed to the expert sweep.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spaces.experiment import Experiment, absolute_local_paths, load_experiment, with_overrides


def check_inputs(exp: Experiment) -> None:
    """Fail before any work when a local base or dataset named in the experiment is missing.

    A `base` that looks like a path (starts with /, ., ~ or exists) must be a folder with
    config.json; anything else is taken as a Hub id. Dataset `source` names must be registered.
    """
    if exp.scaling.strategy == "fsdp" and exp.scaling.num_workers > 1:
        raise ValueError("scaling.strategy: fsdp is not implemented yet; use ddp")
    base = Path(exp.base).expanduser()
    if exp.base.startswith(("/", ".", "~")) or base.exists():
        if not (base / "config.json").is_file():
            raise ValueError(f"base: {exp.base} is not a model folder (no config.json)")
    for i, ds in enumerate(exp.datasets):
        if ds.path is not None and not Path(ds.path).is_file():
            raise ValueError(f"datasets[{i}].path: {ds.path} does not exist")
        if ds.source is not None:
            from trainables.datasets import get_source

            get_source(ds.source)  # DataSourceError (a ValueError) names the known ones
        for f in ds.data_files or []:
            if not Path(f).is_file():
                raise ValueError(f"datasets[{i}].data_files: {f} does not exist")


def run_sweep(exp: Experiment, run_dir: Path) -> int:
    """Hook for experiments with a `search:` block: the expert sweep (search/sweep.py).

    Args:
        exp: the validated experiment (exp.search is set).
        run_dir: the run folder (RUN/ of the contract: train/, experts/registry.parquet).
    Returns:
        exit status.
    """
    from search.sweep import sweep_cli

    return int(sweep_cli(exp, run_dir) or 0)


def train(exp: Experiment, storage: str, *, use_ray: bool = True, resume: Path | None = None) -> Path | None:  # fmt: skip
    """Train one expert into `storage/<name>/` and return its last checkpoint dir.

    Args:
        storage: Ray storage path (local folder or cloud URI; local only with use_ray=False).
    """
    if not use_ray:
        if "://" in storage:
            raise ValueError(f"storage_path {storage}: --no-ray writes local folders only")
        from trainables.train import run_training

        if exp.scaling.num_workers != 1:
            print(f"--no-ray: running 1 worker (config asks for {exp.scaling.num_workers})")
            exp = with_overrides(exp, {"scaling.num_workers": 1})
        res = run_training(
            exp,
            workdir=Path(storage) / exp.name,
            resume_from=resume,
            report=lambda m, p: print(
                f"step {m['step']} samples {m['samples']} loss {m['loss']:.4f}"
                + (f" val {m['val_loss']:.4f}" if "val_loss" in m else "")
                + (f" -> {p}" if p else "")
            ),
        )
        return res.final_checkpoint
    if resume is not None:
        raise ValueError("--resume is for --no-ray; Ray resumes its own runs from storage")
    from trainables.ray_train import train_with_ray

    res = train_with_ray(exp, storage_path=storage)
    if res.error is not None:
        raise RuntimeError(f"training failed: {res.error}")
    return res.checkpoint


def cmd_train(args: argparse.Namespace) -> int:
    exp = absolute_local_paths(load_experiment(args.experiment))  # Ray workers run elsewhere
    check_inputs(exp)
    if exp.search is not None:
        run_dir = args.out if args.out is not None else Path(exp.storage_path)
        return run_sweep(exp, run_dir)
    # --out RUN follows the run layout (RUN/train/<name>/); else the config's storage_path.
    storage = str(args.out / "train") if args.out is not None else exp.storage_path
    last = train(exp, storage, use_ray=not args.no_ray, resume=args.resume)
    where = f"{storage.rstrip('/')}/{exp.name}"
    print(f"trained {exp.name} ({exp.mode.type}); checkpoints under {where}")
    if "://" not in where:
        from trainables.train import find_checkpoints

        for ck in find_checkpoints(where):
            print(f"  {ck}")
    print(f"last checkpoint: {last}")
    return 0


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """Add `train EXPERIMENT.yaml [--out RUN_DIR] [--no-ray] [--resume CKPT]`."""
    t = subparsers.add_parser(
        "train",
        help="train an expert (full, lora, partial, simultaneous, mix) from an experiment YAML",
        description="Validate the experiment, train it on Ray Train (or in-process with "
        "--no-ray) and write HF checkpoints with a manifest every checkpoint_every_samples "
        "samples under RUN_DIR/train/<name>/. A `search:` block runs an expert sweep instead.",
    )
    t.add_argument("experiment", type=Path, help="experiment YAML (see spaces/examples/)")
    t.add_argument("--out", type=Path, help="run folder (default: the config's storage_path)")
    t.add_argument("--no-ray", action="store_true", help="train in this process (1 worker)")
    t.add_argument("--resume", type=Path, help="with --no-ray: continue from this checkpoint")
    t.set_defaults(func=cmd_train)
    return t
