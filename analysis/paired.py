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


def item_scores(run: RunData, task: str) -> dict[str, np.ndarray]:
    """{model: per-item scores on `task`'s test split, in doc order} for every promoted model
    whose raw lm-eval JSON is on disk.

    Raises:
        ValueError: a raw JSON file that is not JSON or has no logged samples (naming it).
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
            out[str(model)] = np.array([r["score"] for r in predictions(raw, task)], dtype=float)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    return out


def paired_diff(a: np.ndarray, b: np.ndarray, n_resamples: int, seed: int) -> tuple[float, float, float]:  # fmt: skip
    """mean(a - b) over items and its percentile-bootstrap 95 % CI (items resampled, paired).

    Returns:
        (difference, CI low, CI high).
    """
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)  # bools too
    means = diff[bootstrap_indices(len(diff), n_resamples, seed)].mean(axis=1)
    return (float(diff.mean()), *percentile_ci(means, 0.95))


def paired_table(scores: dict[str, np.ndarray], n_resamples: int, seed: int) -> pd.DataFrame:
    """One row per model, best first: its score and its difference [95 % CI] to the better expert
    and to the base (where present; models scored on other items are left out)."""
    n = {len(v) for v in scores.values()}
    experts = [m for m in scores if m.startswith(EXPERTS)]
    refs = {}
    if experts:
        refs["better expert"] = max(experts, key=lambda m: scores[m].mean())
    if "base" in scores:
        refs["base"] = "base"
    rows = []
    for model in sorted(scores, key=lambda m: -scores[m].mean()):
        row = {"model": model, "target": round(float(scores[model].mean()), 4), "items": len(scores[model])}  # fmt: skip
        for label, ref in refs.items():
            if len(n) == 1 and model != ref:
                d, lo, hi = paired_diff(scores[model], scores[ref], n_resamples, seed)
                row[f"vs {label} ({ref})"] = f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"
            else:
                row[f"vs {label} ({ref})"] = ""
        rows.append(row)
    return pd.DataFrame(rows)


def paired_section(run: RunData, *, n_resamples: int = 2000, seed: int = 0) -> Section:
    """The section: per target task, `paired_table` of the promoted models."""
    tables = {t: item_scores(run, t) for t in target_tasks(run)}
    tables = {t: s for t, s in tables.items() if s}
    if not tables:
        return absent("paired", TITLE, "no per-item target results (promotion's raw lm-eval JSON).")  # fmt: skip
    sec = Section("paired", TITLE)
    for task, scores in tables.items():
        df = paired_table(scores, n_resamples, seed)
        sec.table(
            f"{task} (test): each promoted model's difference to the better expert and to the base, "
            f"item by item, with a percentile-bootstrap 95 % CI ({n_resamples} paired resamples, "
            f"seed {seed}); from promotion's raw lm-eval JSON.",
            df,
        )
        sec.data[task] = df.to_dict(orient="records")
    return sec
