"""Compare lm-eval result files item by item: the same model scored twice (e.g. on cuda and on
the CPU), or two runs of one evaluation. For each task both files hold, on its scoring metric
(items read by `layerswap.trainables.evaluate.harness.predictions`): the two aggregates, how many items
gave the same answer (generation: the filtered answer, e.g. MGSM's extracted number; multiple
choice: the option with the highest log-likelihood), how many the same generated text, how many
the same per-item score, and the largest per-item score difference.

Run: `python benchmarks/compare_items.py A.json B.json [A2.json B2.json ...]` (pairs; lm-eval's
JSON with its samples logged, as `layerswap eval --out` and a promotion's
promotion/lm_eval/MODEL/TASK.json write it). Prints a Markdown table, then what only one file
of a pair holds. Exit 2 naming a bad file; exit 1 when a pair has no task in common (nothing
was compared). Smoke run: tests/benchmarks/test_compare_items.py, on a `layerswap eval --out`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from layerswap.trainables.evaluate.harness import predictions
from layerswap.trainables.evaluate.scoring import score_key


def load(path: Path) -> dict:
    """An lm-eval result file that logged its samples.

    Args:
        path: the JSON file.
    Returns:
        the parsed result dict.
    Raises:
        ValueError: naming the file, when it is not JSON or has no samples.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable lm-eval JSON ({e})") from e
    if not isinstance(data, dict) or not data.get("samples") or "results" not in data:
        raise ValueError(f"{path}: no results with per-item samples (run lm-eval with log_samples)")  # fmt: skip
    return data


def compare(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> tuple[list[dict], list[str]]:  # fmt: skip
    """Compare two results item by item on each task's scoring metric (`harness.predictions`).

    Args:
        a, b: lm-eval result dicts with samples.
        names: how the two are called in messages (their file names).
    Returns:
        (rows, notes): one row per task, with task, metric, items, a, b (aggregates),
        same_answer, same_text (None for multiple choice), same_score, max_abs; notes say what
        only one of the two holds.
    Raises:
        ValueError: naming file, task and doc, when a sample cannot be read.
    """
    rows, notes = [], []
    for only, mine, other in ((names[0], a, b), (names[1], b, a)):
        notes += [f"task {t} only in {only}" for t in sorted(set(mine["samples"]) - set(other["samples"]))]  # fmt: skip
    for task in sorted(set(a["samples"]) & set(b["samples"])):
        read = []
        for name, raw in zip(names, (a, b), strict=True):
            try:
                read.append({r["doc_id"]: r for r in predictions(raw, task)})
            except (KeyError, ValueError) as e:
                raise ValueError(f"{name}: {e}") from e
        pa, pb = read
        ids = sorted(set(pa) & set(pb))
        if len(ids) < max(len(pa), len(pb)):
            notes.append(f"{task}: {len(pa) - len(ids)} items only in {names[0]}, {len(pb) - len(ids)} only in {names[1]}")  # fmt: skip
        metric = ",".join(score_key(a, task))
        diffs = [abs(pa[i]["score"] - pb[i]["score"]) for i in ids]
        generated = bool(ids) and all(pa[i]["response"] is not None for i in ids)
        rows.append({"task": task, "metric": metric, "items": len(ids),
                     "a": a["results"][task].get(metric, math.nan), "b": b["results"][task].get(metric, math.nan),
                     "same_answer": sum(pa[i]["prediction"] == pb[i]["prediction"] for i in ids),
                     "same_text": sum(pa[i]["response"] == pb[i]["response"] for i in ids) if generated else None,
                     "same_score": sum(d == 0 for d in diffs),
                     "max_abs": max(diffs) if diffs else math.nan})  # fmt: skip
    return rows, notes


def main(argv: list[str] | None = None) -> int:
    """Print the comparison of each pair of files; exit 2 naming the file on bad input, 1
    when a pair has no task in common."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="pairs of lm-eval JSON files: A B [A B ...]")  # fmt: skip
    args = ap.parse_args(argv)
    if len(args.files) % 2:
        ap.error(f"files come in pairs; got {len(args.files)}")
    print("| A | B | task | metric | A | B | items | same answer | same text | same item score | max item diff |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    notes, empty = [], []
    for fa, fb in zip(args.files[::2], args.files[1::2], strict=True):
        try:
            rows, more = compare(load(fa), load(fb), (fa.name, fb.name))
        except ValueError as e:
            ap.exit(2, f"compare_items: {e}\n")
        notes += [f"{fa.name} / {fb.name}: {n}" for n in more]
        if not rows:
            empty.append(f"{fa} / {fb}")
        for r in rows:
            text = "—" if r["same_text"] is None else r["same_text"]
            print(f"| {fa.name} | {fb.name} | {r['task']} | {r['metric']} | {r['a']:.6f} | {r['b']:.6f} "
                  f"| {r['items']} | {r['same_answer']} | {text} | {r['same_score']} | {r['max_abs']:.2e} |")  # fmt: skip
    for n in notes:
        print(f"\nnote: {n}")
    if empty:  # an empty table is no comparison: say so, and exit as a failed run
        print(f"compare_items: no task in common, nothing compared: {'; '.join(empty)}", file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
