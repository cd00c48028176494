"""Build many world variants in parallel and probe each: one table of what every variant shows.

Run `.venv/bin/python benchmarks/world_sweep.py V1.yaml V2.yaml --out runs/sweep --seeds 0 1
--jobs 2 -- --lang-lr 1e-5 --select` (arguments after `--` go to benchmarks/world_probe.py). Each
(variant, seed) is one `layerswap world build --config` then one world_probe run, as
subprocesses on one core each, so `--jobs` should be the core count (16 on the GPU machine, where
`--device cuda` after `--` puts the probes on the GPU). A 12 x 64 world takes ~4.5 min to build
and ~2 min to probe (test split, --select) per core here, ~1.5x that per core of the GPU machine.
`--deadline S` stops what is still running after S seconds and keeps what finished. Writes
OUT/<variant>-s<seed>/ (the world; one already there is reused if it is the same variant),
OUT/<variant>-s<seed>.{build,probe}.log, .json (world_probe --json) and OUT/summary.md, a row per
run: xa MGSM on the probe's split of the base, the experts, the paper default, soup, TIES, the
best swap (a biased pick: a maximum over world_probe.recipes' 33 layer swaps) and, with --select,
the best swap by the search's proxies. A measurement for designing the world (issue 15), not a test.
Exit 1 when a run failed, or none finished (runs stopped at the deadline are not failures).
Paths after `--` are relative to the working directory, as the sweep's own.
Smoke run (tests/benchmarks/test_world_sweep.py, ~30 s): `V.yaml --out DIR --size tiny --jobs 1
-- --experts MATH LANG --resamples 20`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STOPPED = None  # what _run returns for a command stopped (or never started) at the deadline


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The sweep's options, and the arguments after `--` (for world_probe.py).

    Args:
        argv: the command line, without the program name.
    Returns:
        (options, probe arguments); exits with a usage error naming a bad value.
    """
    probe_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, probe_args = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variants", nargs="+", type=Path, help="world variant YAML files")
    p.add_argument("--out", type=Path, required=True, help="folder for worlds, logs, summary")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="world seeds (default 0)")
    p.add_argument("--size", choices=["full", "tiny"], default="full", help="the preset varied")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel runs")
    p.add_argument("--deadline", type=float, default=None, help="seconds until runs are stopped")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be at least 1, not {args.jobs}")
    if args.deadline is not None and args.deadline <= 0:
        p.error(f"--deadline must be positive seconds, not {args.deadline}")
    args.out = args.out.resolve()  # as every path the sweep hands its runs
    for v in args.variants:
        if not v.is_file():
            p.error(f"variant file {v} not found")
    names = [v.stem for v in args.variants]
    if len(set(names)) != len(names):
        p.error(f"variant file names must differ (their stems name the runs): {names}")
    return args, probe_args


def _run(cmd: list[str], log: Path, stop_at: float | None) -> int | None:
    """Run `cmd` with its output in `log`, stopped at `stop_at` (a time.time()).

    Returns:
        its exit code, or STOPPED when the deadline came first (then it may never have started).
    """
    timeout = None if stop_at is None else stop_at - time.time()
    if timeout is not None and timeout <= 0:
        log.write_text("(world_sweep: not started, the deadline had passed)\n")
        return STOPPED
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with log.open("w") as fh:
        # in the caller's working directory: paths among the probe's arguments are relative to it
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # SIGTERM: `world build` then removes what it had half-written
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            fh.write("\n(world_sweep: stopped at the deadline)\n")
            return STOPPED


def one(variant: Path, seed: int, args: argparse.Namespace, probe_args: list[str], stop_at: float | None) -> dict:  # fmt: skip
    """Build and probe one (variant, seed).

    Args:
        variant: the variant YAML; seed: the world seed.
        args: the sweep's options (out, size); probe_args: for world_probe.py.
        stop_at: the deadline (a time.time()), or None.
    Returns:
        a summary row: the probe's scores, or "error" saying which step failed or was stopped.
    """
    out = args.out
    name = f"{variant.stem}-s{seed}"
    world, raw = out / name, out / f"{name}.json"
    row: dict = {"run": name, "variant": str(variant), "seed": seed}
    # a world already there is reused if it is this variant's; a different one fails the build
    probe = [sys.executable, str(REPO / "benchmarks" / "world_probe.py"), "--world", str(world), "--json", str(raw), *probe_args]  # fmt: skip
    build = [sys.executable, "-m", "layerswap.cli", "world", "build", "--out", str(world), "--seed", str(seed), "--size", args.size, "--config", str(variant.resolve())]  # fmt: skip
    for step, cmd in (("build", build), ("probe", probe)):
        rc = _run(cmd, out / f"{name}.{step}.log", stop_at)
        if rc != 0:
            why = "stopped at the deadline" if rc is STOPPED else f"failed (exit {rc})"
            return {**row, "error": f"{step} {why} ({name}.{step}.log)"}
    data = json.loads(raw.read_text())
    row["xa"] = {r["name"]: r["xa_mgsm"] for r in data["table"]}
    row["diff"] = {r["name"]: (r["diff"], *r["ci"]) for r in data["table"]}
    row["select"] = data.get("select")
    return row


def safe_one(variant: Path, seed: int, *rest) -> dict:
    """`one`, with an unexpected error as an error row, so the runs that finished are kept."""
    try:
        return one(variant, seed, *rest)
    except Exception as exc:  # a garbled probe JSON, a full disk: report it, keep the others
        return {"run": f"{variant.stem}-s{seed}", "error": f"{type(exc).__name__}: {exc}"}


def summary(rows: list[dict]) -> str:
    """A markdown table, a row per run: xa MGSM of the base, the experts, the paper default,
    soup and TIES, the best swap and the proxies' pick with their differences and CIs.

    Args:
        rows: `one`'s rows.
    Returns:
        the table.
    """
    head = ["run", "base", "math", "language", "paper default", "soup", "TIES"]
    head += [
        "best swap (diff to better expert, 95 % CI)",
        "best swap by proxy",
        "Spearman proxy vs xa",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['run']} | {r['error']} |" + " |" * 8)
            continue
        xa = r["xa"]
        paper = next(n for n in xa if n.startswith("paper default"))
        swaps = [n for n in xa if n.startswith(("swap ", "paper default"))]
        best = max(swaps, key=lambda n: xa[n])
        d, lo, hi = r["diff"][best]
        cells = [f"{xa[n]:.3f}" for n in ("base", "math", "language", paper, "uniform soup", "ties")]  # fmt: skip
        cells.append(f"{best[5:]} {xa[best]:.3f} ({d:+.3f} [{lo:+.3f}, {hi:+.3f}])")
        sel = r.get("select")
        if sel:
            d, lo, hi = r["diff"][sel["pick"]]
            cells.append(f"{sel['pick']} {xa[sel['pick']]:.3f} ({d:+.3f} [{lo:+.3f}, {hi:+.3f}])")
            rho, lo, hi = (float("nan") if v is None else v for v in sel["spearman"])
            cells.append(f"{rho:+.2f} [{lo:+.2f}, {hi:+.2f}]")
        else:
            cells += ["", ""]
        lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the sweep (see the module's docstring); 1 when a run failed or none finished."""
    args, probe_args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stop_at = None if args.deadline is None else time.time() + args.deadline
    runs = [(v, s) for s in args.seeds for v in args.variants]
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(safe_one, v, s, args, probe_args, stop_at) for v, s in runs]
        rows = []
        for fut in futures:
            rows.append(fut.result())
            print(f"[{time.time() - t0:.0f}s] {rows[-1]['run']}: {rows[-1].get('error', 'done')}", flush=True)  # fmt: skip
    table = summary(rows)
    tmp = args.out / "summary.md.tmp"
    tmp.write_text(f"world_probe arguments: {' '.join(probe_args) or '(defaults)'}\n\n{table}")
    tmp.replace(args.out / "summary.md")
    print(table)
    failed = [r for r in rows if "error" in r and "stopped at the deadline" not in r["error"]]
    if failed or all("error" in r for r in rows):  # a table of errors is no measurement
        done = sum("error" not in r for r in rows)
        print(f"world_sweep: {len(failed)} of {len(rows)} runs failed, {done} finished: " + "; ".join(f"{r['run']}: {r['error']}" for r in failed), file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
