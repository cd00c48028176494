"""Paired comparisons on the target task: each promoted model against the better expert and the
base, item by item, with a percentile-bootstrap 95 % CI of the difference.

Per-item correctness comes from the raw lm-eval JSON that promotion keeps (its `raw_json`
column; trainables.evaluate.harness.predictions); a run without those files gets a note instead.
Part of `layerswap analyze RUN` (analysis/report.py).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from layerswap.analysis.load import RunData, target_tasks
from layerswap.analysis.sections import Section, absent
from layerswap.analysis.stats import bootstrap_indices, percentile_ci
from layerswap.trainables.evaluate.harness import predictions

TITLE = "Against the experts (paired, per item)"
EXPERTS = ("math_expert", "language_expert")  # promotion's baseline names (search/promote.py)


def item_scores(run: RunData, task: str) -> dict[str, pd.Series]:
    """{model: per-item scores on `task`'s test split, indexed by lm-eval's doc_id} for every
    promoted model whose raw lm-eval JSON is on disk. Pairs are matched by doc_id, never by
    position: two files may log other items (a sample lost, another limit or shard).

    Raises:
        ValueError: a raw JSON file that is not JSON, has no logged samples or logs a doc twice
            (naming it).
    """
    p = run.promotion
    if p is None or "raw_json" not in p.columns:
        return {}
    rows = p[(p["task"] == task) & (p.get("split", "test") == "test")]
    out = {}
    for model, recorded in zip(rows["model"], rows["raw_json"], strict=True):
        path = run.resolve(recorded) if isinstance(recorded, str) else None
        if path is None or not path.is_file():
            continue
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            items = predictions(raw, task)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        ids = [r["doc_id"] for r in items]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{path}: task {task!r} logs a doc_id more than once")
        out[str(model)] = pd.Series([r["score"] for r in items], index=ids, dtype=float)
    return out


def paired_diff(a: np.ndarray, b: np.ndarray, n_resamples: int, seed: int) -> tuple[float, float, float]:  # fmt: skip
    """mean(a - b) over items and its percentile-bootstrap 95 % CI (items resampled, paired).

    Returns:
        (difference, CI low, CI high).
    """
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)  # bools too
    means = diff[bootstrap_indices(len(diff), n_resamples, seed)].mean(axis=1)
    return (float(diff.mean()), *percentile_ci(means, 0.95))


# What each model is compared with: summary.json's key -> the table's column label.
_REFERENCES = {"vs_better_expert": "better expert", "vs_base": "base"}


def _references(scores: dict[str, pd.Series]) -> dict[str, str]:
    """{summary key: model} of the references present: the better expert (by mean), the base."""
    experts = [m for m in scores if m.startswith(EXPERTS)]
    refs = {"vs_better_expert": max(experts, key=lambda m: scores[m].mean())} if experts else {}
    return refs | ({"vs_base": "base"} if "base" in scores else {})


def paired_rows(scores: dict[str, pd.Series], n_resamples: int, seed: int) -> list[dict]:
    """One record per model, best first: its score, its item count, and its difference [95 % CI]
    to the better expert and to the base, as numbers (summary.json's form).

    Each pair is compared on the doc ids both logged (`mismatches` names the pairs whose item
    sets differ), so one model's odd items touch only its own comparisons.

    Returns:
        [{"model", "target", "items", "vs_better_expert", "vs_base"}]; a comparison is
        {"reference", "difference", "low", "high", "items"} (items: the doc ids paired), or None
        (the model itself, the reference absent, or no doc id in common).
    """
    refs = _references(scores)
    rows = []
    for model in sorted(scores, key=lambda m: -scores[m].mean()):
        row = {"model": model, "target": round(float(scores[model].mean()), 4), "items": len(scores[model])}  # fmt: skip
        for key in _REFERENCES:
            ref = refs.get(key)
            row[key] = None
            common = _common(scores, model, ref)
            if ref is not None and model != ref and len(common):
                a, b = scores[model][common].to_numpy(), scores[ref][common].to_numpy()
                d, lo, hi = paired_diff(a, b, n_resamples, seed)
                row[key] = {"reference": ref, "difference": d, "low": lo, "high": hi, "items": len(common)}  # fmt: skip
        rows.append(row)
    return rows


def _common(scores: dict[str, pd.Series], model: str, ref: str | None) -> pd.Index:
    """The doc ids both `model` and `ref` logged, sorted (empty without a reference)."""
    if ref is None:
        return pd.Index([])
    return scores[model].index.intersection(scores[ref].index).sort_values()


def mismatches(scores: dict[str, pd.Series]) -> list[str]:
    """The pairs `paired_rows` compares on fewer items than either logged, as text ("language_expert
    vs base: paired on the 249 doc ids both logged (0 of language_expert's 249 and 1 of base's
    250 dropped)"); "no doc id in common" where the pair is left blank."""
    out = []
    for r in dict.fromkeys(_references(scores).values()):
        for m in sorted(scores):
            na, nb, n = len(scores[m]), len(scores[r]), len(_common(scores, m, r))
            if m == r or n == na == nb:
                continue
            if not n:
                out.append(f"{m} vs {r}: no doc id in common, not paired")
                continue
            out.append(f"{m} vs {r}: paired on the {n} doc ids both logged ({na - n} of {m}'s {na} and {nb - n} of {r}'s {nb} dropped)")  # fmt: skip
    return out


def paired_table(rows: list[dict], scores: dict[str, pd.Series]) -> pd.DataFrame:
    """`paired_rows` as the report's table: a column per reference present, each comparison as
    "+d [lo, hi]" text (blank where there is none)."""
    refs = _references(scores)
    out = []
    for r in rows:
        cells = {"model": r["model"], "target": r["target"], "items": r["items"]}
        for key, ref in refs.items():
            c = r[key]
            text = "" if c is None else f"{c['difference']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]"  # fmt: skip
            cells[f"vs {_REFERENCES[key]} ({ref})"] = text
        out.append(cells)
    return pd.DataFrame(out)


def paired_section(run: RunData, *, n_resamples: int = 2000, seed: int = 0) -> Section:
    """The section: per target task, `paired_table` of the promoted models."""
    tables = {t: item_scores(run, t) for t in target_tasks(run)}
    tables = {t: s for t, s in tables.items() if s}
    if not tables:
        return absent("paired", TITLE, "no per-item target results (promotion's raw lm-eval JSON).")  # fmt: skip
    sec = Section("paired", TITLE)
    for task, scores in tables.items():
        rows = paired_rows(scores, n_resamples, seed)
        df = paired_table(rows, scores)
        sec.table(
            f"{task} (test): each promoted model's difference to the better expert and to the base, "
            f"item by item, with a percentile-bootstrap 95 % CI ({n_resamples} paired resamples, "
            f"seed {seed}); from promotion's raw lm-eval JSON.",
            df,
        )
        if odd := mismatches(scores):
            sec.text(f"{task}: item sets differ; each pair is compared on the doc ids both logged: {'; '.join(odd)}.")  # fmt: skip
        sec.data[task] = rows  # numbers, not the table's text
    return sec
