"""The GPU check: one process that proves or refutes layerswap's GPU claims on one GPU.

Run on a GPU machine (about 6 minutes on one H100; it ends by --budget-s + GRACE_S):
    make gpu-check                      # = python benchmarks/gpu_check/run.py --out gpu-check-out
    python benchmarks/gpu_check/run.py --out DIR [--stages evaluator,training] [--budget-s 480]
On the lent GPU machine, without the project's .venv (`python3` is the image's CUDA Python with
torch, transformers, lm-eval and Ray; the budget counts from this process's start, world build
included; 480 + 30 s grace, and the hang watchdog's 20 s after them, end inside the outer
timeout's 540; its -k 15 SIGKILLs what still ignores its SIGTERM; .gpu/ comes from the
workplace's `bash ../shared/gpu/prepare.sh`, slimmed to fit the call by `make gpu-carry`):
    source .gpu/on_device.sh && timeout -k 15 540 python3 benchmarks/gpu_check/run.py --out $OUT/gpu_check
Smoke run (every stage at a tiny shape on the CPU, ~2 minutes; CI runs it so the check cannot rot):
    python benchmarks/gpu_check/run.py --smoke --out DIR

Stages, in order (one module each in this folder, `run(ctx) -> dict`):
  env        GPU, driver, torch/CUDA, transformers, lm-eval, Ray versions
  evaluator  layerswap's cached evaluator vs lm-eval HFLM at the 8B shape, bf16
  trials     search trials composed from two 8B-shaped experts, both placements
  training   bf16-mixed full SFT at 8B width: tokens/s, MFU, peak vs --plan, masters that moved
  promotion  lm-eval on the shipped promotion's longest prompts at its batch size
  ray_train  `layerswap train` through Ray Train + FSDP2 (+ NCCL on a GPU), killed and resumed
(promotion, a quick fits-or-not answer, before ray_train, the longest stage and the likeliest to
hang on NCCL). Each stage's JSON is written to DIR/NN_stage.json with status "running" as it
starts and again as soon as it ends (a stage that fails is recorded with its error and the next
one runs), and DIR/report.md is rewritten at both, so a run cut short keeps what it measured and
a SIGKILL leaves the stage it was in marked "still running". Within a stage, each part that
finishes (an evaluator candidate, a trials placement, a training LR, a promotion case, ...:
Context.keep) is written into its record (status "running") and the report at once; a stage
that then fails or is cut keeps those parts, marked partial, and throughput.py uses their
figures, marked partial too. SIGTERM or SIGINT (an outer `timeout`), or the budget's own alarm at
--budget-s + GRACE_S, ends the running stage: its record says `killed`, the processes it started
are killed, the report names it, and the exit status is 128 + the signal. A stage blocked inside
one C call (a hung CUDA sync or NCCL wait) runs no signal handler: HANG_MARGIN_S after the alarm,
a watchdog thread (faulthandler) writes every thread's traceback into DIR/hung_traceback.txt
(report.HANG_FILE) and ends the process with exit status 1, leaving the processes the stage
started; that stage's record and the report say "running".
On a GPU with more memory than the issue's H100 80 GB (an H200: 139 GiB), the check caps its own
memory at 80 GiB by default (--memory-cap-gib; 0 for none), so what fits is answered as on an
H100; speeds are the GPU's own (an H200's 4.8 TB/s against an H100's 3.35: docs/guides/gpus.md). The throughput
figures measured so far are written under DIR after each stage (throughput_measured.json and
throughput.yaml, for the profile of the GPU present: throughput.py); `--update-throughput` also
writes them into spaces/throughput.yaml. A folder copied back from a GPU machine is applied with
`python benchmarks/gpu_check/throughput.py DIR`.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import faulthandler
import importlib
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

_STARTED = time.monotonic()  # the budget counts from here, torch not yet imported (_context)

# Run as a script, this folder is sys.path[0]; its modules are imported as the gpu_check package
# instead (benchmarks/ on the path), so names like `env` or `report` shadow nothing.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from gpu_check.common import Context, apply_memory_cap, as_result, cap_plan, free, write_json  # noqa: E402
from gpu_check.figures import gpu_spec  # noqa: E402
from gpu_check.report import HANG_FILE, write_report  # noqa: E402
from gpu_check.throughput import assumed_profile, check_profile, save_measured, update_throughput  # noqa: E402

BUDGET_S, SMOKE_BUDGET_S = 480.0, 600.0
# Past the deadline a stage has this long to end on its own before the alarm cuts it (the
# stages check ctx.remaining() at their own steps; a hung CUDA call or NCCL wait does not).
GRACE_S = 30.0
# Past the alarm, the cut stage's cleanup (ray_train's process-group kill, the records) has this
# long before the watchdog ends a process whose main thread never returned to Python (`_watch`):
# 480 + 30 + 20 = 530 s, before the device command's `timeout -k 15 540`.
HANG_MARGIN_S = 20.0
CUT_BY = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGALRM: "the budget's alarm (--budget-s + GRACE_S)"}  # fmt: skip


class Cut(BaseException):
    """A signal ending the run (`CUT_BY`). A BaseException: no stage's `except Exception`
    records it as its own failure and goes on; `finally` blocks (the ray_train stage's process
    group kill) still run."""

    def __init__(self, signum: int):
        super().__init__(CUT_BY[signum])
        self.signum = signum
        self.record: dict | None = None  # the stage it cut, once run_stage has written it


def _on_signal(signum, frame) -> None:
    """Raise Cut in the main thread, once: a second signal while the cut stage's processes are
    being killed is ignored, so that cleanup is not itself cut."""
    for s in CUT_BY:
        signal.signal(s, signal.SIG_IGN)
    raise Cut(signum)


# (module, seconds it needs at least on a GPU: a stage is skipped, and says so, when less is left).
# promotion (a quick fits-or-not) before ray_train: that one took 112 s of the smoke's ~135 and is
# the stage likeliest to hang on an NCCL wait, so it goes last.
STAGES: list[tuple[str, float]] = [
    ("env", 0),
    ("evaluator", 60),
    ("trials", 60),
    ("training", 45),
    ("promotion", 20),
    ("ray_train", 60),
]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )  # fmt: skip
    ap.add_argument("--out", type=Path, required=True, help="a new folder for the stages' JSON and report.md")  # fmt: skip
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (CI): checks that every stage still runs")  # fmt: skip
    ap.add_argument("--stages", default=None, help=f"comma-separated subset of {','.join(n for n, _ in STAGES)}")  # fmt: skip
    ap.add_argument("--budget-s", type=float, default=None, help=f"seconds for the whole check, from the process's start (default {BUDGET_S:.0f}; smoke {SMOKE_BUDGET_S:.0f}); a stage still running {GRACE_S:.0f} s later is cut")  # fmt: skip
    ap.add_argument("--world", type=Path, default=None, help="a built tiny world (default: built in a temporary folder)")  # fmt: skip
    ap.add_argument("--update-throughput", action="store_true", help="also write the measured figures into spaces/throughput.yaml (they are always under --out)")  # fmt: skip
    ap.add_argument("--memory-cap-gib", type=float, default=None, help="cap the check's GPU memory at this many GiB (default: 80, the issue's H100, on a GPU with more; 0: no cap)")  # fmt: skip
    ap.add_argument("--profile", default=None, help="the throughput.yaml profile to write (default: the GPU's own, e.g. h200 on an H200; another GPU's is refused)")  # fmt: skip
    args = ap.parse_args(argv)
    names = [n for n, _ in STAGES]
    if args.stages:
        bad = [s for s in args.stages.split(",") if s not in names]
        if bad:
            ap.error(f"--stages: unknown stage(s) {', '.join(bad)}; choose from {', '.join(names)}")
    if args.memory_cap_gib is not None and not args.memory_cap_gib >= 0:
        ap.error(f"--memory-cap-gib: {args.memory_cap_gib:g} is negative; give GiB, or 0 for no cap")  # fmt: skip
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
    props = torch.cuda.get_device_properties(0) if cuda else None
    sms = props.multi_processor_count if cuda else None
    cap = cap_plan(props.total_memory if cuda else None, args.memory_cap_gib)
    apply_memory_cap(cap)
    spec = gpu_spec(name, sms) if cuda else None
    budget = args.budget_s or (SMOKE_BUDGET_S if args.smoke else BUDGET_S)
    ctx = Context(
        out=args.out, smoke=args.smoke, device="cuda" if cuda else "cpu",
        deadline=started + budget, world=world, gpu_name=name,
        peak_flops=spec[0] if spec else None, bandwidth=spec[1] if spec else None, memory_cap=cap,
    )  # fmt: skip
    ctx.notes.append(cap["note"])
    if cuda and spec is None:
        ctx.notes.append(f"{name} is not in figures.GPU_SPECS: peak shares are not computed")
    elif spec is not None:
        ctx.notes.append(f"peak {spec[0]:.4g} FLOP/s and {spec[1]:.3g} B/s: {spec[2]}")
    ctx.assumed, note = assumed_profile(name, args.smoke)
    ctx.notes.append(note)
    return ctx


def with_kept(record: dict, kept: dict | None) -> dict:
    """`record` of a stage that did not finish, with the parts it kept (Context.keep) as its
    result, marked partial; `record` itself when it kept none."""
    if not kept:
        return record
    result = dict(kept["result"])
    done = ", ".join(kept["parts"])
    result["notes"] = [*result.get("notes", []), f"PARTIAL ({record['status']}): the figures are those of the parts that finished: {done}"]  # fmt: skip
    return record | {"result": result, "partial": {"parts": kept["parts"]}}


def run_stage(ctx: Context, index: int, name: str, min_s: float, report: Callable[[dict], None] | None = None) -> dict:  # fmt: skip
    """Run one stage module; its record is written with status "running" as it starts (a
    SIGKILL or a hang leaves that), again with each part the stage keeps (Context.keep), and
    with its status, seconds and result or error as it ends; `report(record)` after each write.
    A stage that fails or is cut keeps those parts (`with_kept`)."""
    record = {"stage": name, "index": index, "status": "ok", "seconds": 0.0}
    path = ctx.out / f"{index:02d}_{name}.json"
    if not ctx.smoke and ctx.remaining() < min_s:
        record |= {"status": "skipped", "error": f"{ctx.remaining():.0f} s left, it needs ~{min_s:.0f} s"}  # fmt: skip
    else:
        t0 = time.perf_counter()

        def on_keep() -> None:
            running = with_kept(record | {"status": "running", "seconds": time.perf_counter() - t0}, ctx.kept)  # fmt: skip
            write_json(path, running)
            if report is not None:
                report(running)

        ctx.kept, ctx.on_keep = None, on_keep
        on_keep()  # before the stage's first step: a run killed in it says where
        try:
            mod = importlib.import_module(f"gpu_check.{name}")
            record["title"] = mod.TITLE
            record["result"] = as_result(mod.run(ctx))
        except Cut as cut:  # the stage's `finally` blocks have run: its processes are gone
            ctx.on_keep = None
            record |= {"status": "killed", "seconds": time.perf_counter() - t0,
                       "error": f"cut by {cut} after {time.perf_counter() - t0:.0f} s in this stage"}  # fmt: skip
            record = with_kept(record, ctx.kept)
            write_json(path, record)
            print(f"[{name}] killed: {record['error']}", flush=True)
            cut.record = record
            raise
        except Exception as e:  # one stage's failure is its finding; the rest run
            record |= {"status": "failed", "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
            record = with_kept(record, ctx.kept)
            print(f"[{name}] FAILED: {type(e).__name__}: {e}", flush=True)
        finally:
            ctx.on_keep = None
        record["seconds"] = time.perf_counter() - t0
    # Written before the device is touched again: after a sticky CUDA error (an illegal memory
    # access) even the synchronize in `free` raises, and this stage's record must survive it.
    write_json(path, record)
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


def _profile(args, ctx: Context) -> str | None:
    """The profile this run's measurements are written for: the GPU's own (`check_profile`);
    None on a smoke run or a GPU without one (a note says so). SystemExit with a one-line
    error, before any stage runs, when --profile names another GPU's."""
    if ctx.smoke:
        return None
    try:
        return check_profile(args.profile, ctx.gpu_name)
    except ValueError as e:
        if args.update_throughput or args.profile is not None:
            raise SystemExit(f"gpu-check: {e}") from None
        ctx.notes.append(f"throughput figures stay in the stage records: {e}")
        return None


def _write_out(ctx: Context, args, profile: str | None, records: list[dict]) -> None:
    """Rewrite the measurements so far (throughput.save_measured) and the report under --out. Neither stops the run: a failure is noted in ctx.notes (the report says it
    where it can still be written) and the next stages run."""
    steps = [("the report", lambda: write_report(ctx, records, args.out / "report.md"))]
    if profile is not None:
        steps.insert(0, ("the measured figures", lambda: save_measured(args.out, records, ctx.gpu_name, profile, " ".join(sys.argv))))  # fmt: skip
    for what, step in steps:
        try:
            step()
        except Exception as e:  # the stages' JSON records are on disk; the rest still run
            note = f"writing {what} failed: {type(e).__name__}: {e}"[:500]
            if note not in ctx.notes:
                ctx.notes.append(note)
            print(f"gpu-check: {note}", flush=True)


def _stages(ctx: Context, args, profile: str | None) -> list[dict]:
    """Run the wanted stages in order; after each, and after each part a stage keeps, the
    report and the measurements so far are rewritten under --out (`_write_out`)."""
    wanted = [n for n, _ in STAGES if not args.stages or n in args.stages.split(",")]
    records: list[dict] = []
    try:
        for i, (name, min_s) in enumerate(STAGES, 1):
            if name in wanted:
                report = lambda rec: _write_out(ctx, args, profile, [*records, rec])  # noqa: E731
                records.append(run_stage(ctx, i, name, min_s, report))
                _write_out(ctx, args, profile, records)
    except Cut as cut:
        if cut.record is not None:
            records.append(cut.record)
        where = f"during stage {cut.record['stage']}" if cut.record else "between stages"
        left = [n for n in wanted if n not in {r["stage"] for r in records}]
        ctx.notes.append(f"run cut by {cut} {where}" + (f"; not run: {', '.join(left)}" if left else ""))  # fmt: skip
        _write_out(ctx, args, profile, records)
        raise
    return records


def _watch(out: Path, seconds: float, started: float):
    """Arm the hang watchdog: in `seconds`, faulthandler's own thread (it needs neither the GIL
    nor the main thread) writes every thread's traceback into out/HANG_FILE and ends the
    process (exit status 1). Returns the open file, for `_unwatch`."""
    f = open(out / HANG_FILE, "w")  # kept open: faulthandler writes into it until disarmed
    at = time.monotonic() - started + seconds
    f.write(f"run.py's hang watchdog (faulthandler.dump_traceback_later), armed for {at:.0f} s after "
            "the check's start: a traceback below means the process was still running then, its main "
            "thread blocked (a hung CUDA sync or NCCL wait?), and was ended there with exit status 1; "
            "the stage it was in says 'running' in its record and the report. No traceback: the "
            "process was ended from outside (SIGKILL) before.\n\n")  # fmt: skip
    f.flush()
    faulthandler.dump_traceback_later(seconds, exit=True, file=f)
    return f


def _unwatch(f) -> None:
    """Disarm the watchdog; its file goes with it (the run ended on its own, nothing hung)."""
    faulthandler.cancel_dump_traceback_later()
    f.close()
    Path(f.name).unlink(missing_ok=True)


def main(argv=None, started: float | None = None) -> int:
    """The check (module docstring); `started`: time.monotonic() the budget counts from
    (default: now). Returns the exit status: 1 when a stage did not finish, 128 + the signal
    when the run was cut (`Cut`)."""
    started = time.monotonic() if started is None else started
    args = parse_args(argv)
    for s in CUT_BY:
        signal.signal(s, _on_signal)
    watch = None
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            world = args.world
            if world is None:
                from layerswap.world import build_world

                world = build_world(Path(tmp) / "world", size="tiny", progress=False)
            ctx = _context(args, world, started)
            profile = _profile(args, ctx)
            args.out.mkdir(parents=True, exist_ok=True)
            alarm = max(1.0, ctx.remaining() + GRACE_S)
            signal.setitimer(signal.ITIMER_REAL, alarm)
            watch = _watch(args.out, alarm + HANG_MARGIN_S, started)
            print(f"gpu-check on {ctx.gpu_name} ({'smoke' if ctx.smoke else 'full'}), out {args.out}", flush=True)  # fmt: skip
            records = _stages(ctx, args, profile)
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Cut as cut:
        print(f"gpu-check cut by {cut}; report: {args.out / 'report.md'}", file=sys.stderr)
        return 128 + cut.signum
    finally:
        if watch is not None:
            _unwatch(watch)
    print(f"report: {args.out / 'report.md'}")
    if args.update_throughput:
        update_throughput(records, ctx, profile, " ".join(sys.argv))
    failed = [r["stage"] for r in records if r["status"] != "ok"]
    if failed:
        print(f"stages not finished: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(started=_STARTED))
