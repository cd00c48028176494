"""Compare lm-eval result files item by item: the same model scored twice (e.g. on cuda and on
the CPU), or two runs of one evaluation. For each task both files hold: the aggregate metric of
each, how many items gave the same filtered output, and how many the same per-item score.

Run: `python benchmarks/compare_items.py A.json B.json [A2.json B2.json ...]` (pairs; lm-eval's
JSON as written by `layerswap eval --out` or a promotion's promotion/lm_eval/MODEL/TASK.json,
with its samples logged). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

# the metric read per item and in aggregate, by what the task's samples carry
METRICS = ("exact_match,flexible-extract", "brier_score,none", "acc,none")


def load(path: Path) -> dict:
    """An lm-eval result file that logged its samples.

    Raises:
        ValueError: naming the file, when it is not JSON or has no samples.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable lm-eval JSON ({e})") from e
    if not data.get("samples"):
        raise ValueError(f"{path}: no per-item samples (run lm-eval with log_samples)")
    return data


def _item_score(sample: dict, metric: str) -> float:
    """One item's score; lm-eval logs a Brier item as [gold index, "[p0 p1 ...]"] (numpy text)."""
    value = sample[metric.split(",")[0]]
    if metric.startswith("brier_score"):
        gold, probs = value
        p = [float(x) for x in probs.strip("[]").split()]
        return sum((q - (k == gold)) ** 2 for k, q in enumerate(p))
    return float(value)


def _by_doc(samples: list[dict], metric: str) -> dict:
    """The samples of the metric's filter (a task with two filters logs each item twice)."""
    wanted = metric.split(",")[1]
    return {s["doc_id"]: s for s in samples if s.get("filter", wanted) == wanted}


def compare(a: dict, b: dict) -> list[dict]:
    """One row per task both results hold.

    Returns:
        dicts with task, metric, a, b (aggregates), items, same_output, same_score and
        max_abs (largest per-item score difference).
    """
    rows = []
    for task in sorted(set(a["samples"]) & set(b["samples"])):
        for metric in (m for m in METRICS if m in a["results"][task]):
            sa, sb = _by_doc(a["samples"][task], metric), _by_doc(b["samples"][task], metric)
            ids = sorted(set(sa) & set(sb))
            diffs = [abs(_item_score(sa[i], metric) - _item_score(sb[i], metric)) for i in ids]
            same = sum(sa[i]["filtered_resps"] == sb[i]["filtered_resps"] for i in ids)
            rows.append({"task": task, "metric": metric, "items": len(ids),
                         "a": a["results"][task][metric], "b": b["results"][task][metric],
                         "same_output": same, "same_score": sum(d == 0 for d in diffs),
                         "max_abs": max(diffs) if diffs else math.nan})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "files", nargs="+", type=Path, help="pairs of lm-eval JSON files: A B [A B ...]"
    )
    args = ap.parse_args(argv)
    if len(args.files) % 2:
        ap.error(f"files come in pairs; got {len(args.files)}")
    print(
        "| A | B | task | metric | A | B | items | same output | same item score | max item diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for fa, fb in zip(args.files[::2], args.files[1::2], strict=True):
        try:
            rows = compare(load(fa), load(fb))
        except ValueError as e:
            ap.exit(2, f"compare_items: {e}\n")
        for r in rows:
            print(f"| {fa.name} | {fb.name} | {r['task']} | {r['metric']} | {r['a']:.6f} | {r['b']:.6f} "
                  f"| {r['items']} | {r['same_output']} | {r['same_score']} | {r['max_abs']:.2e} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
