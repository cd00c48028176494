"""Merge benchmark: layerswap's disk merge against a plain file copy, mergekit and in-memory compose.

What it measures, on a Llama-3.2-1B-shaped pair of random bf16 experts ("task" and "language",
~2.47 GB each, two safetensors shards + index, tied embeddings) and the paper's layer-swap recipe
scaled to 16 layers (bottom 3, top 1, one transition layer on each side, equal transition
weights, non-layer tensors averaged):

  copy       shutil.copytree of the task expert's folder (the floor: bytes in, bytes out)
  merge      `layerswap merge recipe.yaml --out DIR -q` as a subprocess; wall time and the peak
             RSS of that process (ru_maxrss from os.wait4 in a small launcher process, so the
             benchmark's own memory is not inherited into the figure)
  mergekit   `mergekit-yaml CONFIG OUT` (CPU) on the config `to_mergekit` makes of the same recipe;
             wall time and peak RSS. Once, its output is compared with ours tensor by tensor.
  compose    in-process `compose_recipe` on state dicts loaded once beforehand (load untimed)
  engine     in-process `merge_to_disk` alone: the merge without the CLI's fixed cost of
             starting Python and importing torch (see `startup`)
  roundtrip  in-process `merge_to_disk` + `safetensors.torch.load_file` of every output shard:
             what compose saves a search trial
  startup    `python -c "import layerswap.cli, layerswap.trainables.merge.engine"`: the fixed interpreter start,
             import and exit cost inside the `merge` time (information only)

All contenders run with a warm page cache: the inputs are read once, untimed, before the first
repeat. Each repeat runs every contender once, in an order rotated per repeat; between contenders
the output is deleted and `os.sync()` is called (untimed), so no contender pays for another's
writeback. The table shows medians; targets are judged on ratios of medians:

  merge / copy        <= 1.33   (judged twice: CLI wall time, and the in-process engine)
  mergekit / merge    >= 2      (layerswap at least 2x faster than mergekit)
  peak RSS of merge   <= 1024 MiB (the largest over repeats)
  compose / roundtrip (reported, no target)

Results also go to WORKDIR/bench_merge.json. The experts are generated once per shape (seeded,
deterministic, streamed through trainables.merge.shard_writer.ShardWriter so generation stays
low-memory) and cached under WORKDIR/experts-SHAPE/.

Run (from the repository root; `1b` writes ~5 GB of experts and needs ~8 GB of free RAM for the
in-memory contenders and ~10 GB of free disk while running):

    python benchmarks/bench_merge.py [--workdir bench-out] [--repeats 3] [--shape 1b|small]

`--shape small` is a ~110 MB variant (same depth and recipe) for a quick check; `--shape tiny
--repeats 1` (~1.3 MB) the smoke run tests/benchmarks/test_bench_merge.py makes (~30 s, mostly
the CLI's and mergekit's start-up). Exit 1 when the outputs disagree (mergekit's and ours, or
compose and the disk round trip): the times of merges that differ compare nothing. A missed
target is reported (MISS), not an exit code: it is a finding, not a failed run.

The code: this script runs the steps; benchmarks/merge_bench/ holds the parts (experts.py: shapes,
recipe and cached experts; contenders.py: the contenders and the RSS launcher; compare.py: the
output comparison; report.py: figures, table and record).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Run as a script from anywhere (the repository for `layerswap`), or imported by a script next to
# it (bench_delta.py): either way merge_bench/ must be importable from benchmarks/.
for _path in (REPO, REPO / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import yaml  # noqa: E402
from merge_bench.contenders import Contenders, commands, run_child  # noqa: E402
from merge_bench.experts import RECIPE_FIELDS, SHAPES, dir_bytes, ensure_experts, warm_read  # noqa: E402
from merge_bench.report import (  # noqa: E402
    TARGETS,
    Figures,
    environment,
    figures,
    print_table,
    print_targets,
    write_json_atomic,
)

from layerswap.spaces.recipe import parse_recipe  # noqa: E402
from layerswap.trainables.merge.checkpoint import Checkpoint  # noqa: E402
from layerswap.trainables.merge.engine import assembly_for, open_checkpoints  # noqa: E402
from layerswap.trainables.merge.mergekit_export import to_mergekit  # noqa: E402

# bench_delta.py imports these two from here (its experts and its RSS launcher are ours).
__all__ = ["ensure_experts", "main", "parse_args", "run_child"]


@dataclass
class RunSetup:
    """One run's inputs: its folder, the recipe (fields, parsed, and as files for both CLIs), and
    what the engine assembles from it."""

    run_dir: Path
    fields: dict
    recipe: object
    recipe_path: Path
    mk_path: Path
    assembly: dict
    depth: int
    n_avg: int
    avg_bytes: int


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring); --repeats must be >= 1."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See the module docstring (benchmarks/bench_merge.py) for what is measured.",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=REPO / "bench-out",
        help="scratch folder: cached experts, outputs, logs, bench_merge.json (default bench-out)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (default 3)")
    p.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="1b",
        help="1b: Llama-3.2-1B shape, ~2.47 GB per expert (default); small: ~110 MB; tiny: ~1.3 MB",
    )
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return args


def find_binaries() -> tuple[Path, Path]:
    """The venv's `layerswap` and `mergekit-yaml`; exits naming the one that is missing."""
    bindir = Path(sys.executable).parent
    layerswap_bin, mergekit_bin = bindir / "layerswap", bindir / "mergekit-yaml"
    for b in (layerswap_bin, mergekit_bin):
        if not b.exists():
            raise SystemExit(f"{b}: not found (run from the project venv)")
    return layerswap_bin, mergekit_bin


def prepare_run(workdir: Path, shape_name: str, experts: dict[str, Path]) -> RunSetup:
    """A fresh run folder with the recipe for both CLIs (recipe.yaml, mergekit.yaml), and the
    engine's assembly of it; prints what the recipe averages and takes.

    Args:
        workdir: the scratch folder (the run folder is workdir/run-SHAPE, emptied first).
        shape_name: a key of SHAPES.
        experts: {"task", "language"} expert folders.
    Returns:
        the RunSetup.
    """
    run_dir = workdir / f"run-{shape_name}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    fields = dict(
        RECIPE_FIELDS,
        task_expert=str(experts["task"]),
        language_expert=str(experts["language"]),
    )
    recipe = parse_recipe(fields)
    recipe_path = run_dir / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(fields, sort_keys=False))
    mk_path = run_dir / "mergekit.yaml"
    mk_path.write_text(yaml.safe_dump(to_mergekit(recipe, SHAPES[shape_name].layers), sort_keys=False))  # fmt: skip
    ckpts = open_checkpoints([fields["task_expert"], fields["language_expert"]])
    assembly, depth = assembly_for(recipe, ckpts)
    for ck in ckpts.values():
        ck.close()
    n_avg = sum(1 for op in assembly.values() if op.take is None)
    avg_bytes = sum(
        ckpts[fields["task_expert"]].tensors[n].nbytes
        for n, op in assembly.items()
        if op.take is None
    )
    return RunSetup(run_dir, fields, recipe, recipe_path, mk_path, assembly, depth, n_avg, avg_bytes)  # fmt: skip


def load_inputs(experts: dict[str, Path]) -> tuple[float, dict]:
    """Untimed: the page cache warmed with both experts, and their state dicts for compose.

    Returns:
        (seconds the warm-up read took, expert path -> state dict).
    """
    warm_s = warm_read([experts["task"], experts["language"]])
    print(f"warm-up read of both experts (untimed): {warm_s:.1f} s", flush=True)
    t0 = time.perf_counter()
    sources = {}
    for side in ("task", "language"):
        with Checkpoint.open(experts[side]) as ck:
            sources[str(experts[side])] = {n: ck.read(n) for n in ck.tensors}
    print(f"loaded both state dicts for compose (untimed): {time.perf_counter() - t0:.1f} s")
    return warm_s, sources


def record(args: argparse.Namespace, setup: RunSetup, model_bytes: int, warm_s: float, c: Contenders, fig: Figures) -> dict:  # fmt: skip
    """bench_merge.json: the run's settings, every time and RSS, the figures and the checks."""
    return {
        "shape": args.shape,
        "shape_dims": SHAPES[args.shape].__dict__,
        "bytes_per_expert": model_bytes,
        "repeats": args.repeats,
        "recipe": RECIPE_FIELDS,
        "tensors": len(setup.assembly),
        "averaged_tensors": setup.n_avg,
        "averaged_bytes": setup.avg_bytes,
        "warm_cache": True,
        "warmup_read_s": warm_s,
        "times_s": c.times,
        "median_s": fig.med,
        "peak_rss_mib": c.rss,
        "ratios_of_medians": fig.ratios,
        "paired_ratio_medians": fig.paired,
        "targets": TARGETS,
        "pass": fig.verdict,
        "mergekit_vs_ours": c.checks["mergekit_vs_ours"],
        "compose_vs_disk_equal": c.checks["compose_vs_disk_equal"],
        "commands": {"merge": c.cmds["merge"], "mergekit": c.cmds["mergekit"]},
        "env": environment(),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (see the module docstring); 1 when the contenders' outputs differ."""
    args = parse_args(argv)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    layerswap_bin, mergekit_bin = find_binaries()
    experts = ensure_experts(workdir, args.shape)
    model_bytes = dir_bytes(experts["task"])
    setup = prepare_run(workdir, args.shape, experts)
    print(
        f"shape {args.shape}: {len(setup.assembly)} tensors, {model_bytes / 1e9:.3f} GB per "
        f"expert; recipe averages {setup.n_avg} tensors ({setup.avg_bytes / 1e9:.3f} GB), "
        "takes the rest",
        flush=True,
    )
    cmds = commands(layerswap_bin, mergekit_bin, setup.recipe_path, setup.mk_path)
    warm_s, sources = load_inputs(experts)
    contenders = Contenders(setup.run_dir, experts, setup.recipe, sources, setup.depth, cmds)
    contenders.run(args.repeats, setup.assembly)
    fig = figures(contenders.times, contenders.rss)
    print_table(args.shape, args.repeats, model_bytes, contenders.times, contenders.rss, fig)
    print_targets(fig, contenders.checks["mergekit_vs_ours"])
    write_json_atomic(workdir / "bench_merge.json", record(args, setup, model_bytes, warm_s, contenders, fig))  # fmt: skip
    print(f"wrote {workdir / 'bench_merge.json'}")
    checks = contenders.checks
    if not (checks["mergekit_vs_ours"]["ok"] and checks["compose_vs_disk_equal"]):
        print("bench_merge: FAILED: the contenders' outputs differ (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
