"""Compare lm-eval result files item by item: the same model scored twice (e.g. on cuda and on
the CPU), or two runs of one evaluation. For each task both files hold and each per-item metric
both report (the task's scoring metric first): the two aggregates, how many items gave the same
answer (generation: the filtered answer, e.g. MGSM's extracted number; multiple choice: the
option with the highest log-likelihood), how many the same generated text, how many the same
per-item score, and the largest per-item score difference.

Run: `python benchmarks/compare_items.py A.json B.json [A2.json B2.json ...]` (pairs; lm-eval's
JSON with its samples logged, as `layerswap eval --out` and a promotion's
promotion/lm_eval/MODEL/TASK.json write it). Prints a Markdown table, then what only one file
of a pair holds.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from trainables.evaluate.scoring import score_key

PER_ITEM = ("exact_match", "acc", "acc_norm", "brier_score")  # metrics lm-eval logs per sample


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


def _metrics(a: dict, b: dict, task: str) -> list[str]:
    """The "metric,filter" keys both results report per item for `task`, the scoring one first."""
    metric, filt = score_key(a, task)
    first = f"{metric},{filt}"
    keys = [first] + [k for k in a["results"][task] if k != first and k.split(",")[0] in PER_ITEM]
    return [k for k in keys if k.split(",")[0] in PER_ITEM and k in b["results"].get(task, {})]


def _item_score(sample: dict, metric: str, where: str) -> float:
    """One item's score; lm-eval logs a Brier item as [gold index, "[p0 p1 ...]"] (numpy text)."""
    name = metric.split(",")[0]
    if name not in sample:
        raise ValueError(f"{where}: no per-item {name!r} in the sample")
    value = sample[name]
    try:
        if name == "brier_score":
            gold, probs = value
            p = [float(x) for x in str(probs).strip("[]").split()]
            return sum((q - (k == int(gold))) ** 2 for k, q in enumerate(p))
        return float(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: cannot read {name} {value!r} ({e})") from e


def _answer(sample: dict):
    """The filtered answer of a generation; the chosen option of a multiple choice, whose
    filtered_resps are one [log-likelihood, is_greedy] pair per option."""
    resp = sample.get("filtered_resps")
    if isinstance(resp, list) and resp and all(isinstance(r, list) and len(r) == 2 for r in resp):
        lls = [float(r[0]) for r in resp]
        return lls.index(max(lls))
    return json.dumps(resp)


def _text(sample: dict) -> str | None:
    """The generated text of a generation sample (None for a multiple choice)."""
    resps = sample.get("resps")
    flat = resps[0] if isinstance(resps, list) and resps and isinstance(resps[0], list) else resps
    return json.dumps(flat) if flat and all(isinstance(r, str) for r in flat) else None


def _by_doc(samples: list[dict], metric: str) -> dict:
    """The samples of the metric's filter by doc_id (a task with two filters logs each item
    once per filter)."""
    wanted = metric.split(",")[1]
    return {s["doc_id"]: s for s in samples if s.get("filter", wanted) == wanted}


def compare(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> tuple[list[dict], list[str]]:  # fmt: skip
    """Compare two results item by item.

    Args:
        a, b: lm-eval result dicts with samples.
        names: how the two are called in messages (their file names).
    Returns:
        (rows, notes): one row per task and metric, with task, metric, items, a, b
        (aggregates), same_answer, same_text (None for multiple choice), same_score, max_abs;
        notes say what only one of the two holds.
    Raises:
        ValueError: naming file, task and doc_id, when a sample cannot be read.
    """
    rows, notes = [], []
    for only, mine, other in ((names[0], a, b), (names[1], b, a)):
        notes += [f"task {t} only in {only}" for t in sorted(set(mine["samples"]) - set(other["samples"]))]  # fmt: skip
    for task in sorted(set(a["samples"]) & set(b["samples"])):
        try:
            metrics = _metrics(a, b, task)
        except ValueError as e:
            raise ValueError(f"{names[0]}: {e}") from e
        for metric in metrics:
            sa, sb = _by_doc(a["samples"][task], metric), _by_doc(b["samples"][task], metric)
            ids = sorted(set(sa) & set(sb))
            if len(ids) < max(len(sa), len(sb)):
                notes.append(f"{task} {metric}: {len(sa) - len(ids)} items only in {names[0]}, {len(sb) - len(ids)} only in {names[1]}")  # fmt: skip
            diffs = [abs(_item_score(sa[i], metric, f"{names[0]} {task} doc {i}") - _item_score(sb[i], metric, f"{names[1]} {task} doc {i}")) for i in ids]  # fmt: skip
            texts = [(_text(sa[i]), _text(sb[i])) for i in ids]
            generated = bool(texts) and all(x is not None for x, _ in texts)
            rows.append({"task": task, "metric": metric, "items": len(ids),
                         "a": a["results"][task][metric], "b": b["results"][task][metric],
                         "same_answer": sum(_answer(sa[i]) == _answer(sb[i]) for i in ids),
                         "same_text": sum(x == y for x, y in texts) if generated else None,
                         "same_score": sum(d == 0 for d in diffs),
                         "max_abs": max(diffs) if diffs else math.nan})  # fmt: skip
    return rows, notes


def main(argv: list[str] | None = None) -> int:
    """Print the comparison of each pair of files; exit 2 naming the file on bad input."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="pairs of lm-eval JSON files: A B [A B ...]")  # fmt: skip
    args = ap.parse_args(argv)
    if len(args.files) % 2:
        ap.error(f"files come in pairs; got {len(args.files)}")
    print("| A | B | task | metric | A | B | items | same answer | same text | same item score | max item diff |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    notes = []
    for fa, fb in zip(args.files[::2], args.files[1::2], strict=True):
        try:
            rows, more = compare(load(fa), load(fb), (fa.name, fb.name))
        except ValueError as e:
            ap.exit(2, f"compare_items: {e}\n")
        notes += [f"{fa.name} / {fb.name}: {n}" for n in more]
        for r in rows:
            text = "—" if r["same_text"] is None else r["same_text"]
            print(f"| {fa.name} | {fb.name} | {r['task']} | {r['metric']} | {r['a']:.6f} | {r['b']:.6f} "
                  f"| {r['items']} | {r['same_answer']} | {text} | {r['same_score']} | {r['max_abs']:.2e} |")  # fmt: skip
    for n in notes:
        print(f"\nnote: {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
