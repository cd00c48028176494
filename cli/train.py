"""`layerswap train EXPERIMENT.yaml [--out RUN_DIR]`: validate once, train an expert, say where.
`--plan [--gpu-memory GIB]` prints the memory plan (trainables/train/memory_plan.py) instead.

Thin: checks every input before any work (cli/train_inputs.py), then calls trainables.train.train_expert (Ray
Train, or this process with `--no-ray`); an experiment with a `sweep:` block goes to the expert
sweep (experts.sweep.run_sweep; its run folder: cli/train_sweep.py). torch and ray load only
when the command runs.

`--continue` takes the run wherever it stands (what a study's exported commands.sh passes): it
starts a run RUN_DIR does not hold, resumes an unfinished one and says a finished one is finished
(exit 0). A sweep likewise: one that has run its course leaves SWEEP_FINISHED in its folder and
is skipped (unless a dataset file changed since it trained: refused, as an unfinished one is); an unfinished sweep of the same experiment is resumed from its Ray Tune state
(cli/train_sweep.py sweep_folder, experts/sweep_tuner.py make_tuner).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from layerswap.cli.args import continue_clash, finite_float
from layerswap.cli.train_inputs import check_inputs
from layerswap.cli.train_sweep import (
    SWEEP_FINISHED,
    check_sweep_data,
    finished_sweep,
    put_back_rows,
    run_sweep_recorded,
    sweep_data_problem,
    sweep_folder,
)
from layerswap.spaces.train_experiment import (
    TrainExperiment,
    absolute_local_paths,
    load_train_experiment,
)
from layerswap.trainables.evaluate.lm_eval_api import offline_defaults
from layerswap.trainables.outputs import OutputError, nothing_to_do, output_problems
from layerswap.trainables.storage import is_uri, join


def _inputs(exp: TrainExperiment) -> list[Path]:
    """The local files and folders the experiment reads (a Hub id or a URI is none)."""
    named = [exp.base, *(ds.path for ds in exp.datasets if ds.path is not None)]
    named += [f for ds in exp.datasets for f in ds.data_files or []]
    if exp.sweep is not None and exp.sweep.world is not None:
        named.append(exp.sweep.world)
    return [Path(p) for p in named if not is_uri(p) and Path(p).expanduser().exists()]


def check_run_folder(exp: TrainExperiment, run: Path) -> None:
    """Fail before any work when the run folder RUN/train/<name> is, holds or lies inside an
    input (e.g. `--out` at the base model, or a base inside the run `--overwrite` replaces),
    or cannot be created."""
    # a finished run writes nothing inside; one the rerun rule continues is checked there
    # (trainables/train/run.py `_train_local`: a read-only run folder, refused before work)
    problems = output_problems(run, "train", allow_existing=True, inputs=_inputs(exp), inside=False)
    if problems:
        raise OutputError("\n  ".join(problems))


# What to type, in the error of a command line that names no experiment (or two).
_USAGE = "layerswap train EXPERIMENT.yaml [--out RUN_DIR] [--resume [CKPT] | --continue]"
_YAML = (
    ".yaml",
    ".yml",
    ".json",
)  # an experiment file (JSON is YAML too); a checkpoint is a folder


def experiment_and_resume(args: argparse.Namespace) -> tuple[Path, bool | Path]:
    """The experiment file and what `--resume` asks for, however the user ordered them.

    `--resume` takes an optional CKPT, so in `train --resume exp.yaml --out RUN` argparse gives
    exp.yaml to --resume and sees no experiment. A checkpoint is a folder, never a YAML file:
    a YAML value of --resume is the experiment, and --resume the bare flag.

    Args:
        args: the parsed `train` command line.
    Returns:
        (experiment YAML, resume): resume is False, True (the run in RUN_DIR) or a CKPT folder.
    """
    experiment, resume = args.experiment, args.resume
    if isinstance(resume, Path) and resume.suffix.lower() in _YAML:
        if experiment is not None and experiment.is_dir():  # `--resume EXP.yaml CKPT`: swapped
            return resume, experiment
        if experiment is not None:
            raise ValueError(
                f"--resume {resume}: CKPT is a checkpoint folder, not a second experiment "
                f"(the experiment is {experiment}); type {_USAGE}"
            )
        experiment, resume = resume, True
    if experiment is None:
        raise ValueError(f"train: no experiment YAML given; type {_USAGE}")
    return experiment, resume


def _cmd_sweep(exp: TrainExperiment, args: argparse.Namespace) -> int:
    """An experiment with a `sweep:` block: refused, skipped (`--continue` of a finished one),
    resumed (`--continue` of an unfinished one) or run into RUN/train/<name>."""
    if args.resume:
        raise ValueError(
            "--resume: an expert sweep is resumed with --continue (it also skips a finished "
            "one); --overwrite reruns it"
        )
    if args.out is None and is_uri(exp.storage_path):
        raise ValueError(
            f"storage_path {exp.storage_path}: an expert sweep scores and registers its "
            "checkpoints in a local run folder; pass --out RUN"
        )
    run_dir = args.out if args.out is not None else Path(exp.storage_path)
    folder = run_dir / "train" / exp.name
    check_run_folder(exp, folder)
    if args.cont and (done := finished_sweep(exp, folder)) is not None:
        check_sweep_data(exp, folder, done)  # finished on the data it trained on, or refused
        put_back_rows(run_dir, folder)  # a finished sweep moved back over a killed --overwrite
        failed = sum(s != "ok" for s in done.get("trials", {}).values())
        note = f", {failed} of them failed" if failed else ""
        nothing_to_do(folder, f"{folder}: this expert sweep is already finished ({len(done.get('trials', {}))} trials{note}); nothing to do")  # fmt: skip
        return 0
    if (problem := sweep_data_problem(exp)) is not None:
        raise ValueError(problem)
    # refuses an earlier sweep (or an unfinished one it cannot resume) before Ray starts
    where, resume = sweep_folder(exp, run_dir, args.overwrite, args.cont)
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.experts.sweep import start_sweep_ray

    start_sweep_ray(exp, int(args.verbose))  # every node sees the inputs: before the folder
    if resume:
        print(f"{folder}: resuming this unfinished expert sweep (finished trials are kept)")
    with where:
        return run_sweep_recorded(exp, run_dir, args.verbose, resume=resume)


def _say_out_replaces(exp: TrainExperiment, out: Path) -> None:
    """One line on stderr when `--out` sends the checkpoints elsewhere than the experiment's own
    `storage_path` (an s3://... run went to the local --out folder without a word)."""
    where = out / "train" / exp.name
    if is_uri(exp.storage_path) or Path(exp.storage_path).resolve() != where.parent.resolve():
        print(f"layerswap: --out {out} replaces storage_path {exp.storage_path}: checkpoints go to {where}", file=sys.stderr)  # fmt: skip


def _cmd_train(args: argparse.Namespace) -> int:
    args.experiment, args.resume = experiment_and_resume(args)
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.trainables.train import train_expert
    from layerswap.trainables.train.run import run_started

    if args.plan:  # the memory plan only: no weights, no data, no Ray
        # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
        from layerswap.trainables.train.memory_plan import format_plan, plan_experiment

        print(format_plan(plan_experiment(load_train_experiment(args.experiment), args.gpu_memory)))  # fmt: skip
        return 0
    if clash := continue_clash(args, "starts, resumes or skips the run as it stands"):
        raise ValueError(clash)
    loaded = load_train_experiment(args.experiment)
    exp = absolute_local_paths(loaded)  # Ray workers run elsewhere
    # Only a storage_path the YAML chose: a config written out whole (model_dump, an export)
    # carries the default too, and replacing that is what --out is for.
    chosen = loaded.storage_path != TrainExperiment.model_fields["storage_path"].default
    if args.out is not None and "storage_path" in loaded.model_fields_set and chosen:
        _say_out_replaces(exp, args.out)
    if exp.sweep is not None:
        # A sweep runs offline by default (its task-data check sets it, and every trial gets
        # the driver's variables): its inputs are checked as its trials will read them.
        offline_defaults()
    check_inputs(exp)
    if exp.sweep is not None:
        return _cmd_sweep(exp, args)
    # --out RUN follows the run layout (RUN/train/<name>/); else the config's storage_path.
    storage = str(args.out / "train") if args.out is not None else exp.storage_path
    if not is_uri(storage):
        check_run_folder(exp, Path(storage) / exp.name)
    resume = args.resume
    if args.cont:  # a finished run: train_expert says so and trains nothing (in a store too)
        resume = run_started(join(storage, exp.name))
    last = train_expert(
        exp,
        storage,
        use_ray=not args.no_ray,
        resume=resume,
        overwrite=args.overwrite,
        verbose=args.verbose,
    )
    where = f"{storage.rstrip('/')}/{exp.name}"
    print(f"trained {exp.name} ({exp.mode.type}); checkpoints under {where}")
    if not is_uri(where):
        # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
        from layerswap.trainables.train import find_checkpoints

        for ck in find_checkpoints(where):
            print(f"  {ck}")
    print(f"last checkpoint: {last}")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `train EXPERIMENT.yaml [--out RUN_DIR] [--no-ray] [--resume CKPT] [--plan]`."""
    t = subparsers.add_parser(
        "train",
        help="train an expert (full, lora, partial, simultaneous, mix) from an experiment YAML",
        description="Validate the experiment, train it on Ray Train (or in-process with "
        "--no-ray) and write HF checkpoints with a manifest every checkpoint_every_samples "
        "samples under RUN_DIR/train/<name>/. A `sweep:` block runs an expert sweep instead.",
    )
    # Optional to argparse only: `--resume exp.yaml` gives it to --resume (experiment_and_resume
    # takes it back); a command line without one is refused there, saying what to type.
    t.add_argument(
        "experiment",
        nargs="?",
        type=Path,
        help="experiment YAML (see spaces/examples/); required, in any place on the line",
    )
    t.add_argument(
        "--out",
        type=Path,
        help="run folder RUN: the run goes to RUN/train/<name>/, in place of the config's "
        "storage_path (said on stderr when it sets one; default: <storage_path>/<name>/)",
    )
    t.add_argument("--no-ray", action="store_true", help="train in this process (1 worker)")
    t.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        type=Path,
        metavar="CKPT",
        help="continue the unfinished run of this experiment in RUN_DIR (with --no-ray also: "
        "start from the checkpoint folder CKPT; a YAML file after --resume is the experiment)",
    )
    t.add_argument(
        "--continue",
        dest="cont",
        action="store_true",
        help="take this experiment's run in RUN_DIR as it stands (what a study's exported "
        "commands.sh passes): start it when there is none, resume it when unfinished, say it is "
        "finished (exit 0) when it is. A sweep is skipped when it ran its course (its folder "
        f"holds {SWEEP_FINISHED}) and resumed when unfinished: its finished trials are kept, the "
        "rest run until the sweep has num_samples trials",
    )
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="start the run over (the old one is kept until the new one finishes)",
    )
    t.add_argument(
        "--plan",
        action="store_true",
        help="print the per-GPU memory plan (from the base's config, no weights) and whether it "
        "fits scaling.accelerator_type, then exit without training",
    )
    t.add_argument(
        "--gpu-memory",
        type=finite_float(0, low_open=True),
        metavar="GIB",
        help="with --plan: GPU memory in GiB to check against (instead of accelerator_type's)",
    )
    t.add_argument(
        "--verbose",
        action="store_true",
        help="also Ray's own output: its workers' and controller's logs and its notices; an "
        "expert sweep also Ray Tune's (its configuration box, status tables, the trials' logs) "
        "and Optuna's (default: layerswap's progress lines and summary, warnings and errors)",
    )
    t.set_defaults(func=_cmd_train)
    return t
