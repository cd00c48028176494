"""`layerswap plan STUDY.yaml [--profile NAME] [--json OUT] [--cluster CLUSTER.yaml] [--export DIR]`:
plan a whole study offline: resolve its names, count its runs, trials and evaluations, and
estimate device-hours per stage from the model shapes and a throughput profile
(spaces/throughput.yaml); `--export DIR` also writes each experiment as the study resolved it,
with the commands that run the study (study/export.py).

Thin: validates the study and every config it names (spaces/study.py), then prints
study.plan.plan_study's plan. Problems (a task or dataset source that does not resolve,
a sweep trial that cannot run, ...) are listed and exit 2; `--json` is then not written.
Nothing trains, loads weights or reaches the network. Run `layerswap plan --help`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from layerswap.cli.args import output_file
from layerswap.spaces.base import load_yaml
from layerswap.spaces.study import load_study
from layerswap.study.export import export_files
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.outputs import check_output, check_output_file, output_dir, writing


def _is_plan_json(path: Path) -> bool:
    """A plan layerswap wrote (what --json writes): a JSON object with `layerswap_plan`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "layerswap_plan" in data


def _inputs(loaded) -> list[Path]:
    """The study file and the configs it names (--json must not land on any of them)."""
    return [loaded.path, *(e.config for e in loaded.experts), *(s.config for s in loaded.searches)]


def node_types(cluster: Path) -> dict[str, dict]:
    """A Ray cluster YAML's `available_node_types` (name -> declared resources).

    Raises:
        ValueError naming the file when it cannot be read or is not a Ray cluster config.
    """
    data = load_yaml(cluster, "cluster config")
    types = data.get("available_node_types") if isinstance(data, dict) else None
    if not isinstance(types, dict) or not types:
        raise ValueError(f"--cluster {cluster}: not a Ray cluster config (no available_node_types)")  # fmt: skip
    return {n: (t.get("resources") or {}) for n, t in types.items() if isinstance(t, dict)}


def cluster_fit(plan, res: dict[str, dict], cluster: Path) -> list[str]:
    """Which node types of a Ray cluster YAML declare the GPUs each stage's runs hold.

    Reads only `available_node_types[*].resources` (`GPU`, `accelerator_type:NAME`); Ray detects
    undeclared resources when a node starts, so a type without them cannot be judged here.

    Args:
        plan: the study plan.
        res: `node_types(cluster)`.
        cluster: the file, for the heading.
    """
    out = [f"cluster {cluster}:"]
    for n, r in res.items():
        kinds = [k.split(":", 1)[1] for k in r if k.startswith("accelerator_type:")]
        out.append(f"  node type {n}: {r['GPU']} x {'/'.join(kinds) or 'GPU'}" if "GPU" in r else f"  node type {n}: GPUs not declared (Ray detects them at start)")  # fmt: skip
    for st in plan.stages:
        for row in (r for r in st.rows if r.gpus > 0):
            need, kind = max(row.gpus, 1), row.accelerator
            fit = [n for n, r in res.items() if r.get("GPU", 0) >= need and (kind is None or f"accelerator_type:{kind}" in r)]  # fmt: skip
            want = f"{row.gpus:g} x {kind or 'GPU'}"
            out.append(f"  {st.key} {row.name}: {want} per run -> {', '.join(fit) or 'no node type declares them'}")  # fmt: skip
    return out


def _cmd_plan(args: argparse.Namespace) -> int:
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.trainables.evaluate.lm_eval_api import offline_defaults

    offline_defaults()  # a plan never reaches the network (an explicit HF_HUB_OFFLINE=0 is kept)

    loaded = load_study(args.study)
    # before the plan is printed: a wrong --cluster is refused, not reported after 70 lines
    types = node_types(args.cluster) if args.cluster is not None else None
    check = dict(overwrite=args.overwrite, inputs=_inputs(loaded), ours=_is_plan_json, what="a layerswap plan JSON")  # fmt: skip
    if args.json is not None:
        check_output_file(args.json, **check)
    if args.export is not None:
        check_output(args.export, "study-export", overwrite=args.overwrite, inputs=_inputs(loaded))
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.study.plan import plan_study
    from layerswap.study.report import format_study_plan

    plan = plan_study(loaded, args.profile)
    print(format_study_plan(plan))
    if types is not None:
        print("\n" + "\n".join(cluster_fit(plan, types, args.cluster)))
    if plan.problems:
        lines = "\n  ".join(plan.problems)
        print(f"layerswap: error: {args.study}: {len(plan.problems)} problem(s)\n  {lines}", file=sys.stderr)  # fmt: skip
        return 2
    if args.json is not None:
        with writing(args.json):  # one writer per file; checked again under the lock
            check_output_file(args.json, **check)
            atomic_write_text(args.json, json.dumps(plan.to_json(), indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.export is not None:
        _export(loaded, args.export, args.overwrite)
    return 0


def _export(loaded, folder: Path, overwrite: bool) -> None:
    """Write the study's experiments and commands into `folder` (one output, atomically)."""
    files = export_files(loaded, folder.resolve())
    with output_dir(folder, "study-export", overwrite=overwrite, inputs=_inputs(loaded)) as tmp:
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text, encoding="utf-8")
        (tmp / "commands.sh").chmod(0o755)
    print(f"wrote {folder}: {len(files) - 1} experiment(s) and the commands that run them ({folder / 'commands.sh'})")  # fmt: skip


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `plan STUDY.yaml [--profile NAME] [--json OUT] [--overwrite] [--cluster FILE]`."""
    p = subparsers.add_parser(
        "plan",
        help="plan a whole study offline: runs, trials, evaluations and device-hours per stage",
        description="Resolve every name a study uses without network (model configs from "
        "local folders, the HF cache or built-in copies; lm-eval task names; dataset sources), "
        "count the expert training runs, indicator scorings, merge-search trials and promotion "
        "evaluations, and estimate device-hours per stage from the model shapes and a throughput "
        "profile, naming the figures each estimate rests on and whether they were measured or "
        "assumed. Problems are listed and exit 2. See spaces/examples/real_study.yaml.",
    )
    p.add_argument("study", type=Path, help="study YAML (see spaces/examples/*_study.yaml)")
    p.add_argument(
        "--profile",
        metavar="NAME",
        help="throughput profile of spaces/throughput.yaml (default: the study's `profile`)",
    )
    p.add_argument(
        "--json", type=output_file, metavar="OUT", help="also write the plan as JSON here"
    )
    p.add_argument(
        "--export",
        type=Path,
        metavar="DIR",
        help="also write each experiment as the study resolves it (DIR/experts/*.yaml with the "
        "study's overrides and sweep, DIR/searches/*.yaml) and DIR/commands.sh, the commands "
        "that run the study in order",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing --json plan or --export DIR"
    )
    p.add_argument(
        "--cluster",
        type=Path,
        metavar="FILE",
        help="a Ray cluster YAML: say which node types declare the GPUs each stage needs",
    )
    p.set_defaults(func=_cmd_plan)
    return p
