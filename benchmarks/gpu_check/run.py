"""The GPU check: one process that proves or refutes layerswap's GPU claims on one GPU.

Run on a GPU machine (about 6 minutes on one H100):
    make gpu-check                      # = python benchmarks/gpu_check/run.py --out gpu-check-out
    python benchmarks/gpu_check/run.py --out DIR [--stages evaluator,training] [--budget-s 360]
On a GPU machine without the project's .venv (`python3` is the image's CUDA Python with torch,
transformers, lm-eval and Ray; `python` may not exist there; the budget counts from this
process's start, world build included):
    python3 benchmarks/gpu_check/run.py --out DIR
Smoke run (every stage at a tiny shape on the CPU, ~2 minutes; CI runs it so the check cannot rot):
    python benchmarks/gpu_check/run.py --smoke --out DIR

Stages, in order (one module each in this folder, `run(ctx) -> dict`):
  env        GPU, driver, torch/CUDA, transformers, lm-eval, Ray versions
  evaluator  layerswap's cached evaluator vs lm-eval HFLM at the 8B shape, bf16
  trials     search trials composed from two 8B-shaped experts, both placements
  training   bf16-mixed full SFT at 8B width: tokens/s, MFU, peak vs --plan, masters that moved
  ray_train  `layerswap train` through Ray Train + FSDP2 (+ NCCL on a GPU), killed and resumed
  promotion  lm-eval on the shipped promotion's longest prompts at its batch size
Each stage's JSON is written to DIR/NN_stage.json as soon as it ends (a stage that fails is
recorded with its error and the next one runs), and DIR/report.md is rewritten after every stage,
so a run cut short keeps what it measured. `--update-throughput` then writes the measured figures
into spaces/throughput.yaml (profile --profile) with their provenance.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import importlib
import sys
import tempfile
import time
import traceback
from pathlib import Path

_STARTED = time.monotonic()  # the budget counts from here, torch not yet imported (_context)

# Run as a script, this folder is sys.path[0]; its modules are imported as the gpu_check package
# instead (benchmarks/ on the path), so names like `env` or `report` shadow nothing.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from gpu_check.common import Context, free, write_json  # noqa: E402
from gpu_check.figures import Figure, gpu_spec  # noqa: E402

# (module, seconds it needs at least on a GPU: a stage is skipped, and says so, when less is left)
STAGES: list[tuple[str, float]] = [
    ("env", 0),
    ("evaluator", 60),
    ("trials", 60),
    ("training", 45),
    ("ray_train", 60),
    ("promotion", 20),
]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )  # fmt: skip
    ap.add_argument("--out", type=Path, required=True, help="a new folder for the stages' JSON and report.md")  # fmt: skip
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (CI): checks that every stage still runs")  # fmt: skip
    ap.add_argument("--stages", default=None, help=f"comma-separated subset of {','.join(n for n, _ in STAGES)}")  # fmt: skip
    ap.add_argument("--budget-s", type=float, default=None, help="seconds for the whole check (default 360; smoke 600)")  # fmt: skip
    ap.add_argument("--world", type=Path, default=None, help="a built tiny world (default: built in a temporary folder)")  # fmt: skip
    ap.add_argument("--update-throughput", action="store_true", help="write the measured figures into spaces/throughput.yaml")  # fmt: skip
    ap.add_argument("--profile", default="h100", help="the throughput.yaml profile --update-throughput writes (default h100)")  # fmt: skip
    args = ap.parse_args(argv)
    names = [n for n, _ in STAGES]
    if args.stages:
        bad = [s for s in args.stages.split(",") if s not in names]
        if bad:
            ap.error(f"--stages: unknown stage(s) {', '.join(bad)}; choose from {', '.join(names)}")
    if args.out.exists() and any(args.out.iterdir()):
        ap.error(f"--out {args.out} exists and is not empty; give a new folder")
    if args.update_throughput and args.smoke:
        ap.error("--update-throughput takes a GPU run's figures; a --smoke run measures a tiny shape on the CPU")  # fmt: skip
    return args


def _context(args, world: Path, started: float) -> Context:
    """The run's Context; its deadline counts from `started` (time.monotonic() at the process's
    start), so the world build and the imports spend the budget too: the lent GPU's one command
    has ~6-7 minutes in all, not the budget plus whatever came before the first stage."""
    import torch

    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        raise SystemExit("gpu-check: no usable CUDA device (torch.cuda.is_available() is False); "
                         "run it on a GPU machine, or --smoke on a CPU")  # fmt: skip
    name = torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)"
    sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else None
    spec = gpu_spec(name, sms) if cuda else None
    budget = args.budget_s or (600.0 if args.smoke else 360.0)
    ctx = Context(
        out=args.out, smoke=args.smoke, device="cuda" if cuda else "cpu",
        deadline=started + budget, world=world, gpu_name=name,
        peak_flops=spec[0] if spec else None, bandwidth=spec[1] if spec else None,
    )  # fmt: skip
    if cuda and spec is None:
        ctx.notes.append(f"{name} is not in figures.GPU_SPECS: peak shares are not computed")
    elif spec is not None:
        ctx.notes.append(f"peak {spec[0]:.4g} FLOP/s and {spec[1]:.3g} B/s: {spec[2]}")
    return ctx


def run_stage(ctx: Context, index: int, name: str, min_s: float) -> dict:
    """Run one stage module; its record (status, seconds, result or error) is written at once."""
    record = {"stage": name, "index": index, "status": "ok", "seconds": 0.0}
    if not ctx.smoke and ctx.remaining() < min_s:
        record |= {"status": "skipped", "error": f"{ctx.remaining():.0f} s left, it needs ~{min_s:.0f} s"}  # fmt: skip
    else:
        t0 = time.perf_counter()
        try:
            mod = importlib.import_module(f"gpu_check.{name}")
            record["title"] = mod.TITLE
            res = mod.run(ctx)
            res["figures"] = [f.to_dict() if isinstance(f, Figure) else f for f in res.get("figures", [])]  # fmt: skip
            record["result"] = res
        except Exception as e:  # one stage's failure is its finding; the rest run
            record |= {"status": "failed", "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
            print(f"[{name}] FAILED: {type(e).__name__}: {e}", flush=True)
        record["seconds"] = time.perf_counter() - t0
    # Written before the device is touched again: after a sticky CUDA error (an illegal memory
    # access) even the synchronize in `free` raises, and this stage's record must survive it.
    write_json(ctx.out / f"{index:02d}_{name}.json", record)
    print(f"[{name}] {record['status']} in {record['seconds']:.1f} s", flush=True)
    _free_after(ctx, record)
    return record


def _free_after(ctx: Context, record: dict) -> None:
    """Free what the stage left (out of its except block: an out-of-memory error's traceback
    no longer holds the stage's tensors); a device that cannot even be freed is noted, and the
    next stages still run and write their records."""
    try:
        free(ctx.device)
    except Exception as e:  # the next stage's own failure will say more; this one is noted
        note = f"after stage {record['stage']}, freeing the device failed: {type(e).__name__}: {e}"
        ctx.notes.append(note[:500])
        print(f"[{record['stage']}] {note}", flush=True)


def main(argv=None, started: float | None = None) -> int:
    """The check (module docstring); `started`: time.monotonic() the budget counts from
    (default: now). Returns the exit status: 1 when a stage did not finish."""
    started = time.monotonic() if started is None else started
    args = parse_args(argv)
    from gpu_check.report import write_report
    from gpu_check.throughput import update_throughput

    args.out.mkdir(parents=True, exist_ok=True)
    wanted = set(args.stages.split(",")) if args.stages else None
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        world = args.world
        if world is None:
            from layerswap.world import build_world

            world = build_world(Path(tmp) / "world", size="tiny", progress=False)
        ctx = _context(args, world, started)
        print(f"gpu-check on {ctx.gpu_name} ({'smoke' if ctx.smoke else 'full'}), out {args.out}", flush=True)  # fmt: skip
        records = []
        for i, (name, min_s) in enumerate(STAGES, 1):
            if wanted is None or name in wanted:
                records.append(run_stage(ctx, i, name, min_s))
                write_report(ctx, records, args.out / "report.md")
    print(f"report: {args.out / 'report.md'}")
    if args.update_throughput:
        update_throughput(records, ctx, args.profile, " ".join(sys.argv))
    failed = [r["stage"] for r in records if r["status"] != "ok"]
    if failed:
        print(f"stages not finished: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(started=_STARTED))
