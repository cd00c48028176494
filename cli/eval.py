"""`layerswap eval MODEL_DIR --tasks T1,T2 [--world DIR]`: lm-eval on a checkpoint folder, or on
a LoRA adapter folder (its base with the adapter applied, as lm-eval's `peft=`).

Thin: checks the folder and the arguments before the slow lm-eval import, then calls
trainables.evaluate.harness.evaluate and prints its metrics table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

from layerswap.cli.args import count, output_file
from layerswap.trainables.devices import explain_device  # light: torch loads when it runs
from layerswap.trainables.evaluate.harness import (  # light: lm_eval and torch load when run
    DEFAULT_MAX_GEN_TOKS,
    check_batch_size,
    eval_target,
    evaluate,
    metrics_table,
)
from layerswap.trainables.evaluate.tasks import task_data_problem, write_world_tasks
from layerswap.trainables.outputs import check_output_file, writing
from layerswap.world.manifest import verify_world

# Bounds on what one evaluation may ask: each few-shot example lengthens every prompt, each
# generated token is a forward pass per item.
MAX_FEWSHOT = 1_000
MAX_GEN_TOKS = 1_048_576


def _limit(text: str) -> int | float:
    """--limit as lm-eval reads it: a fraction of each task's docs when < 1, else a count of docs
    (lm-eval's get_sample_size takes int(limit), so 1.5 would silently mean 1: refused here)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid --limit {text!r} (N docs or a fraction < 1)"
        ) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"--limit must be a finite number, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--limit must be positive, got {text!r}")
    if value >= 1 and not value.is_integer():
        raise argparse.ArgumentTypeError(
            f"--limit {text!r}: a count of docs must be a whole number "
            "(a fraction of each task's docs is < 1)"
        )
    return value if value < 1 else int(value)


def _batch_size(text: str) -> int | str:
    try:
        return check_batch_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid --batch-size {text!r} (a positive int or auto)"
        ) from None


def _is_result_json(path: Path) -> bool:
    """An lm-eval raw result (what `--out` writes): a JSON object with results and configs."""
    import json

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and {"results", "configs"} <= raw.keys()


def _check_world_names(tasks: list[str], tasks_dir: Path | None, world: Path | None) -> None:
    """A world_* task or tag the world does not define fails here, not after lm-eval has
    indexed its ~10k built-in configs (none of which is named world_*).

    Args:
        tasks: the --tasks names.
        tasks_dir: where the world's task YAMLs were written (None: no --world).
        world: the --world folder, for the message.
    """
    asked = [t for t in tasks if t.startswith("world_")]
    if not asked:
        return
    if tasks_dir is None:
        raise ValueError(f"--tasks {', '.join(asked)}: world tasks need --world DIR")
    import yaml

    known: set[str] = set()
    for f in tasks_dir.glob("world_*.yaml"):
        cfg = yaml.safe_load(f.read_text(encoding="utf-8"))
        known |= {cfg["task"], *cfg.get("tag", [])}
    unknown = [t for t in asked if t not in known]
    if unknown:
        raise ValueError(
            f"--tasks {', '.join(unknown)}: not a task of the world {world} "
            f"(it has {', '.join(sorted(known))})"
        )


def _cmd_eval(args: argparse.Namespace) -> int:
    """`layerswap eval`: evaluate a checkpoint folder, print a metrics table, maybe write JSON."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    model = Path(args.model)
    base, adapter, device, problems = _check_inputs(args, model, tasks)
    if problems:  # every independent problem at once, before the slow lm-eval import
        raise ValueError("\n  ".join(problems))
    if args.device == "auto":  # which one and why, before minutes of work (stdout has the table)
        print(f"eval: on {device[0]} ({device[1]})", file=sys.stderr, flush=True)
    inputs = _inputs(args, model, base, adapter)
    # One writer per result file: held from here to the end (checked again under the lock: a
    # writer that finished meanwhile left a file that only --overwrite may replace)
    with writing(args.out) if args.out is not None else nullcontext():
        if args.out is not None:
            _check_out(args, inputs)
        return _run_eval(args, model, tasks, device[0], base, adapter)


def _check_inputs(args: argparse.Namespace, model: Path, tasks: list[str]):
    """Check the model, the world, the tasks, the device and --out independently.

    Args:
        args: the parsed command line.
        model: the MODEL_DIR argument.
        tasks: the --tasks names.
    Returns:
        (base, adapter, (device, why), problems): what eval_target resolved (None, None when the
        model was refused), the device, and one message per problem found (empty: all good).
    """
    problems: list[str] = []
    if not tasks:
        problems.append("--tasks: give at least one task name")
    device = ("cpu", "")
    try:
        device = explain_device(args.device)
    except ValueError as e:
        problems.append(f"--device: {e}")
    base, adapter = None, None
    try:  # an adapter folder names its base
        base, adapter = eval_target(model, args.base)
    except ValueError as e:
        problems.append(str(e))
    if args.world is not None:
        world = Path(args.world)
        found = verify_world(world, hand_made_ok=True)  # by hand: data/ in the world layout
        if not (world / "world.json").exists() and not (world / "data").is_dir():
            found = ["not a world (no world.json, no data/)"]
        if found:
            problems.append(f"--world {args.world}: " + "; ".join(found))
        elif any(t.startswith("world_") for t in tasks):  # names the world lacks (YAMLs: ms)
            with tempfile.TemporaryDirectory(prefix="layerswap-tasks-") as tmp:
                try:
                    write_world_tasks(world, Path(tmp))
                    _check_world_names(tasks, Path(tmp), args.world)
                except ValueError as e:
                    problems.append(str(e))
    else:
        try:
            _check_world_names(tasks, None, None)
        except ValueError as e:
            problems.append(str(e))
    if args.out is not None:
        try:
            _check_out(args, _inputs(args, model, base, adapter))
        except ValueError as e:
            problems.append(str(e))
    return base, adapter, device, problems


def _inputs(args: argparse.Namespace, model: Path, base, adapter) -> list[Path]:
    """What the evaluation reads: --out may be none of them nor lie inside one."""
    inputs = [model] + ([Path(base)] if adapter is not None and Path(base).is_dir() else [])
    return inputs + ([args.world] if args.world is not None else [])


def _check_context(max_gen_toks: int, model: Path, tasks: list[str], include_path) -> None:
    """Refuse a generation budget the model's context cannot hold when a task generates (lm-eval
    asserts it only once the model is loaded and generation starts). A Hub id is left to lm-eval.
    """
    cfg = model / "config.json"
    if not cfg.is_file():
        return
    try:
        n = json.loads(cfg.read_text()).get("max_position_embeddings")
    except (ValueError, OSError):
        return  # the model's own loading names an unreadable config
    if not (isinstance(n, int) and max_gen_toks >= n):
        return
    # lazy: lm-eval's task index (configs only, no data); only for a budget that could not fit
    from layerswap.trainables.evaluate.lm_eval_api import task_configs

    configs = task_configs(tasks, include_path or [])
    gen = [t for t, c in configs.items() if c is not None and c.get("output_type") == "generate_until"]  # fmt: skip
    if gen:
        raise ValueError(
            f"--max-gen-toks {max_gen_toks}: the model's context is {n} tokens "
            f"(max_position_embeddings in {cfg}), and {', '.join(gen)} generate after a prompt: "
            "pass a smaller --max-gen-toks"
        )


def _check_data(tasks: list[str], tasks_dir: Path | None) -> None:
    """Refuse tasks whose data is not in the local cache before the model loads (minutes at
    8B); lm-eval reads the data only after. `tasks_dir` holds the world's YAMLs already."""
    include = [str(tasks_dir)] if tasks_dir else []
    if (problem := task_data_problem(tasks, None, include, command="eval")) is not None:
        raise ValueError(problem)


def _check_out(args: argparse.Namespace, inputs: list[Path]) -> None:
    """--out: a new file, or with --overwrite an lm-eval result; never an input."""
    check_output_file(
        args.out, overwrite=args.overwrite, inputs=inputs, ours=_is_result_json, what="an lm-eval result JSON"
    )  # fmt: skip


def _run_eval(args: argparse.Namespace, model: Path, tasks: list[str], device: str, base, adapter) -> int:  # fmt: skip
    """Evaluate (world tasks from a private copy), print the table, say what was written."""
    kw = dict(
        base=args.base,
        limit=args.limit,
        batch_size=args.batch_size,
        num_fewshot=args.num_fewshot,
        device=device,
        max_gen_toks=args.max_gen_toks,
        out=args.out,
    )
    if args.world is not None:
        # A private copy of the YAMLs: the world folder stays read-only for evaluation.
        with tempfile.TemporaryDirectory(prefix="layerswap-tasks-") as tmp:
            write_world_tasks(Path(args.world), Path(tmp))
            _check_world_names(tasks, Path(tmp), args.world)
            _check_context(args.max_gen_toks, Path(base), tasks, tmp)
            _check_data(tasks, Path(tmp))
            raw = evaluate(model, tasks, include_path=tmp, **kw)
    else:
        _check_context(args.max_gen_toks, Path(base), tasks, None)
        _check_data(tasks, None)
        raw = evaluate(model, tasks, **kw)
    print(metrics_table(raw))
    if adapter is not None:
        print(f"evaluated the adapter {adapter} on its base {base}")
    if args.out is not None:
        print(f"wrote raw results {args.out}")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `eval` subcommand to a `layerswap` subparsers object; returns its parser."""
    e = subparsers.add_parser(
        "eval",
        help="evaluate a checkpoint or a LoRA adapter with lm-eval (world or built-in tasks)",
        description="Evaluate a checkpoint folder with lm-eval's simple_evaluate; an adapter folder "
        "(adapter_config.json) is evaluated on the base its config names, with the adapter "
        "applied (lm-eval's peft=). With --world, "
        "the world's MGSM/Belebele sets are available as world_mgsm_direct_CODE[_dev], "
        "world_belebele_CODE[_dev] and world_belebele_brier_CODE[_dev] (the same Belebele items "
        "reported by lm-eval's brier_score, lower is better; tags world_mgsm_direct[_dev], "
        "world_belebele[_dev], world_belebele_brier[_dev]). Built-in "
        "task names work too when their datasets are reachable (HF_HUB_OFFLINE=0 "
        "HF_DATASETS_OFFLINE=0 to allow downloads).",
    )
    e.add_argument(
        "model",
        type=Path,
        metavar="MODEL_DIR",
        help="checkpoint folder (safetensors), or a PEFT adapter folder (evaluated on its base)",
    )
    e.add_argument(
        "--base",
        metavar="DIR",
        help="an adapter's base model (default: adapter_config.json's base_model_name_or_path)",
    )
    e.add_argument("--tasks", required=True, help="comma-separated lm-eval task or tag names")
    e.add_argument("--world", type=Path, metavar="DIR", help="world folder: adds its tasks")
    e.add_argument(
        "--limit",
        type=_limit,
        help="first N docs per task (a whole number), or a fraction < 1 of each task's docs "
        "(default: every doc)",
    )
    e.add_argument("--out", type=output_file, metavar="FILE", help="write the raw result JSON here")
    e.add_argument("--overwrite", action="store_true", help="replace an existing --out result JSON")
    e.add_argument(
        "--batch-size",
        type=_batch_size,
        default=1,
        help="an int, or auto (lm-eval searches for the largest that fits; default: 1)",
    )
    e.add_argument("--num-fewshot", type=count(MAX_FEWSHOT, low=0), help="default: each task's own")
    e.add_argument(
        "--max-gen-toks",
        type=count(MAX_GEN_TOKS),
        default=DEFAULT_MAX_GEN_TOKS,
        help=f"generation budget for generate_until tasks (default: {DEFAULT_MAX_GEN_TOKS})",
    )
    e.add_argument(
        "--device",
        default="auto",
        help="auto (cuda when there is a GPU, else cpu), cpu, cuda, cuda:N or mps (default: auto)",
    )
    e.set_defaults(func=_cmd_eval)
    return e
