"""ΔW analysis benchmark: peak RSS and wall time of `layerswap.analysis.delta.row_mav` (+ the heatmap) on
two Llama-3.2-1B-shaped bf16 checkpoints (~2.47 GB each, the merge benchmark's cached experts;
generated under WORKDIR/experts-1b/ when missing, see benchmarks/bench_merge.py).

The analysis runs in a child process started through the merge benchmark's small launcher, so
ru_maxrss is the child's own peak, not inherited from this process. Target: peak RSS <= 1 GiB.
The "language" expert is compared against the "task" expert standing in as the base (the
benchmark has no base checkpoint; the cost is the same: every 2-D layer tensor of both
checkpoints is read once, a row chunk at a time).

    nice -n 10 python benchmarks/bench_delta.py [--workdir bench-out] [--shape 1b|small|tiny]

`--shape tiny` (~1.3 MB experts) is the smoke run tests/benchmarks/test_bench_delta.py makes
(seconds); exit 1 when the peak RSS misses the target or the analysis fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

TARGET_PEAK_RSS_MIB = 1024


def child(expert: Path, base: Path, out_png: Path) -> None:
    """The measured work: row MAVs, fractions, suggested boundaries, one heatmap PNG."""
    from layerswap.analysis.delta import row_mav, suggest_boundaries
    from layerswap.analysis.figures import heatmap

    t0 = time.perf_counter()
    dm = row_mav(expert, base)
    t_mav = time.perf_counter() - t0
    frac = dm.fractions()
    b = suggest_boundaries(frac, frac[::-1])  # any second map of the same shape will do here
    png = heatmap(frac, dm.types, [str(i) for i in range(dm.num_layers)], title="ΔW rows changed")
    out_png.write_bytes(png)
    rows = sum(len(v) for v in dm.mav.values())
    print(
        json.dumps(
            {
                "tensors": len(dm.mav),
                "rows": rows,
                "layers": dm.num_layers,
                "threshold": dm.threshold_auto(),
                "row_mav_s": round(t_mav, 2),
                "total_s": round(time.perf_counter() - t0, 2),
                "suggested": [b.bottom, b.top],
            }
        )
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, default=REPO / "bench-out")
    p.add_argument("--shape", choices=("1b", "small", "tiny"), default="1b")
    p.add_argument(
        "--child", nargs=3, type=Path, metavar=("EXPERT", "BASE", "PNG"), help=argparse.SUPPRESS
    )
    args = p.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    from bench_merge import ensure_experts, run_child

    # absolute: the child runs in the repository, not in this working directory
    args.workdir = args.workdir.resolve()
    paths = ensure_experts(args.workdir, args.shape)
    log = args.workdir / f"bench_delta_{args.shape}.log"
    png = args.workdir / f"bench_delta_{args.shape}.png"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(paths["language"]), str(paths["task"]), str(png)]  # fmt: skip
    wall, rss = run_child(cmd, log)
    result = json.loads(log.read_text().strip().splitlines()[-1])
    result.update(
        shape=args.shape,
        wall_s=round(wall, 2),
        peak_rss_mib=round(rss, 1),
        target_mib=TARGET_PEAK_RSS_MIB,
    )
    (args.workdir / f"bench_delta_{args.shape}.json").write_text(
        json.dumps(result, indent=2) + "\n"
    )
    ok = rss <= TARGET_PEAK_RSS_MIB
    print(
        f"ΔW analysis of {paths['language']} vs {paths['task']}: {result['tensors']} tensors, "
        f"{result['rows']} rows; wall {wall:.1f} s (row MAVs {result['row_mav_s']} s); "
        f"peak RSS {rss:.0f} MiB (target <= {TARGET_PEAK_RSS_MIB} MiB: {'ok' if ok else 'MISSED'})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
