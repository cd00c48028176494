"""The merge benchmark's figures: medians, ratios of medians (and paired per-repeat ratios), the
targets they are judged on, the printed table and the bench_merge.json record.

Used by benchmarks/bench_merge.py; not run on its own.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from .compare import summary_line

TARGET_MERGE_OVER_COPY = 1.33
TARGET_MERGEKIT_OVER_MERGE = 2.0
TARGET_PEAK_RSS_MIB = 1024
TARGETS = {
    "merge_over_copy": f"<= {TARGET_MERGE_OVER_COPY}",
    "engine_over_copy": f"<= {TARGET_MERGE_OVER_COPY}",
    "mergekit_over_merge": f">= {TARGET_MERGEKIT_OVER_MERGE}",
    "peak_rss_merge_mib": f"<= {TARGET_PEAK_RSS_MIB}",
}


def median(xs: list[float]) -> float:
    """The median, NaN for no values."""
    return statistics.median(xs) if xs else float("nan")


@dataclass
class Figures:
    """What the repeats come to: medians per contender, ratios of medians, paired ratios (the
    median of per-repeat ratios) and each target's verdict."""

    med: dict[str, float]
    peak_merge: float
    ratios: dict[str, float]
    paired: dict[str, float]
    verdict: dict[str, bool]


def figures(times: dict[str, list[float]], rss: dict[str, list[float]]) -> Figures:
    """The figures of a run's per-repeat `times` (seconds) and `rss` (MiB), judged on targets.

    Args:
        times: contender -> seconds per repeat.
        rss: child contender -> peak RSS MiB per repeat.
    Returns:
        the Figures.
    """
    med = {k: median(v) for k, v in times.items()}
    peak_merge = max(rss["merge"])
    ratios = {
        "merge_over_copy": med["merge"] / med["copy"],
        "engine_over_copy": med["engine"] / med["copy"],
        "mergekit_over_merge": med["mergekit"] / med["merge"],
        "peak_rss_merge_mib": peak_merge,
        "compose_over_roundtrip": med["compose"] / med["roundtrip"],
    }

    def paired_ratio(a: str, b: str) -> float:
        return median([x / y for x, y in zip(times[a], times[b], strict=True)])

    paired = {
        "merge_over_copy": paired_ratio("merge", "copy"),
        "engine_over_copy": paired_ratio("engine", "copy"),
        "mergekit_over_merge": paired_ratio("mergekit", "merge"),
        "compose_over_roundtrip": paired_ratio("compose", "roundtrip"),
    }
    verdict = {
        "merge_over_copy": ratios["merge_over_copy"] <= TARGET_MERGE_OVER_COPY,
        "engine_over_copy": ratios["engine_over_copy"] <= TARGET_MERGE_OVER_COPY,
        "mergekit_over_merge": ratios["mergekit_over_merge"] >= TARGET_MERGEKIT_OVER_MERGE,
        "peak_rss_merge_mib": peak_merge <= TARGET_PEAK_RSS_MIB,
    }
    return Figures(med, peak_merge, ratios, paired, verdict)


def print_table(shape: str, repeats: int, model_bytes: int, times: dict, rss: dict, fig: Figures) -> None:  # fmt: skip
    """The per-contender table: median, min and max seconds, GB/s and peak RSS."""
    gb = model_bytes / 1e9
    print()
    print(f"layerswap merge benchmark, shape {shape}, {repeats} repeat(s), warm cache")
    print(f"{'contender':<10} {'median s':>9} {'min s':>8} {'max s':>8} {'GB/s':>6}  peak RSS")
    for k in times:
        v = times[k]
        rate = f"{gb / fig.med[k]:6.2f}" if k not in ("startup",) else "     -"
        peak = f"{max(rss[k]):.0f} MiB (max)" if k in rss else ""
        print(f"{k:<10} {fig.med[k]:9.2f} {min(v):8.2f} {max(v):8.2f} {rate}  {peak}")
    print()


def _line(label: str, value: str, ok: bool | None, target: str) -> None:
    mark = "" if ok is None else ("PASS" if ok else "MISS")
    print(f"{label:<24} {value:>12}  {target:<18} {mark}")


def print_targets(fig: Figures, mergekit_vs_ours: dict) -> None:
    """Each ratio against its target (PASS/MISS), the paired ratios and the equality check."""
    r, v = fig.ratios, fig.verdict
    _line("merge (CLI) / copy", f"{r['merge_over_copy']:.2f}", v["merge_over_copy"], "<= 1.33")
    _line("engine / copy", f"{r['engine_over_copy']:.2f}", v["engine_over_copy"], "<= 1.33")
    _line("mergekit / merge", f"{r['mergekit_over_merge']:.2f}", v["mergekit_over_merge"], ">= 2")
    _line("peak RSS merge", f"{fig.peak_merge:.0f} MiB", v["peak_rss_merge_mib"], "<= 1024 MiB")
    _line("compose / roundtrip", f"{r['compose_over_roundtrip']:.3f}", None, "(no target)")
    print(
        "paired medians of per-repeat ratios: "
        + ", ".join(f"{k} {val:.2f}" for k, val in fig.paired.items())
    )
    print(f"mergekit output == ours: {summary_line(mergekit_vs_ours)}")


def environment() -> dict:
    """The versions and thread counts the figures were measured with."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "mergekit": _version("mergekit"),
    }


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def write_json_atomic(path: Path, data: dict) -> None:
    """Write `data` as JSON to `path` through a temporary file and a rename (never half-written)."""
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
