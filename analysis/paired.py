"""Paired comparisons on the target task: each promoted model against the better expert and the
base, item by item, with a percentile-bootstrap 95 % CI of the difference.

Per-item correctness comes from the raw lm-eval JSON that promotion keeps (its `raw_json`
column; trainables.evaluate.harness.predictions); a run without those files gets a note instead.
Which expert is "better" is decided by promotion/results.parquet's values (load.target_scores,
the scores every other section uses), not by the raw files that happen to be on disk; a model
whose raw file is missing is named, and a comparison with it is blank with that reason.
Part of `layerswap analyze RUN` (analysis/report.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from layerswap.analysis.load import EXPERIMENT, RunData, target_rows, target_scores, target_tasks
from layerswap.analysis.sections import Section, absent
from layerswap.analysis.stats import bootstrap_indices, percentile_ci
from layerswap.analysis.treatment_modes import promoted_experts
from layerswap.spaces.baselines import EXPERT_BASELINES, expert_baseline
from layerswap.trainables.evaluate.harness import predictions

TITLE = "Against the experts (paired, per item)"
EXPERTS = tuple(EXPERT_BASELINES.values())  # promotion's names (math_expert, math_expert_2, ...)


def _raw_paths(run: RunData, task: str) -> dict[str, list[Path | None]]:
    """{model: its raw lm-eval JSON files as found on disk (None: not there)}, one per promotion
    row of `task`'s test split (load.target_rows: the rows target_scores averages; several
    for a promotion with several seeds); {} when promotion keeps no raw files."""
    p = run.promotion
    if p is None or "raw_json" not in p.columns:
        return {}
    rows = target_rows(p, task)
    out: dict[str, list[Path | None]] = {}
    for model, recorded in zip(rows["model"], rows["raw_json"], strict=True):
        path = run.resolve(recorded) if isinstance(recorded, str) else None
        out.setdefault(str(model), []).append(path if path is not None and path.is_file() else None)  # fmt: skip
    return out


def missing_raw(run: RunData, task: str) -> list[str]:
    """The promoted models of `task` with a raw lm-eval JSON not on disk (of any of its rows:
    the others' items alone would not average to its target score), sorted."""
    return sorted(m for m, paths in _raw_paths(run, task).items() if None in paths)


def _read_items(path: Path, task: str) -> pd.Series:
    """One raw lm-eval JSON's per-item scores of `task`, indexed by doc_id."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        items = predictions(raw, task)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    ids = [r["doc_id"] for r in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: task {task!r} logs a doc_id more than once")
    return pd.Series([r["score"] for r in items], index=ids, dtype=float)


def item_scores(run: RunData, task: str, notes: list[str] | None = None) -> dict[str, pd.Series]:
    """{model: per-item scores on `task`'s test split, indexed by lm-eval's doc_id} for every
    promoted model whose raw lm-eval JSON is on disk (`missing_raw`: the others). Pairs are
    matched by doc_id, never by position: two files may log other items (a sample lost,
    another limit or shard).

    A model with several promotion rows (several seeds) scores each doc as the mean over its
    rows, on the docs every row logged: the one rule of load.target_scores, which averages the
    rows' values, so the mean of its items is that average (when each file holds its row's
    items).

    Args:
        notes: where to append a line per model averaged over several rows (its row count,
            and the docs dropped because not every row logged them).
    Raises:
        ValueError: a raw JSON file that is not JSON, has no logged samples or logs a doc twice
            (naming it).
    """
    out = {}
    for model, paths in _raw_paths(run, task).items():
        if None in paths:
            continue
        runs = [_read_items(path, task) for path in paths]
        if len(runs) == 1:
            out[model] = runs[0]
            continue
        common, every = runs[0].index, runs[0].index
        for r in runs[1:]:
            common, every = common.intersection(r.index), every.union(r.index)
        common = common.sort_values()
        out[model] = pd.concat([r[common] for r in runs], axis=1).mean(axis=1)
        dropped = len(every) - len(common)
        if notes is not None:
            tail = f" ({dropped} doc ids not logged by every row dropped)" if dropped else ""
            notes.append(f"{model}: {len(runs)} promotion rows (seeds); each doc's score is their mean, as its target score is{tail}")  # fmt: skip
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


def references(run: RunData, task: str) -> dict[str, str]:
    """{summary key: model} of the references promotion scored on `task`: the better expert by
    promotion/results.parquet's value (load.target_scores; ties: the first name), and the base.
    No better expert while any expert lacks a usable score (`expert_gaps`): the best of the rest
    is not the better expert. Whether raw files are on disk does not enter: a missing one blanks
    its comparisons."""
    tgt = target_scores(run, task).dropna(subset=["value"])
    experts = tgt[tgt["model"].astype(str).map(expert_baseline).notna()]
    best = experts.sort_values(["value", "model"], ascending=[False, True], kind="stable")
    ok = len(best) and not expert_gaps(run, task)
    refs = {"vs_better_expert": str(best["model"].iloc[0])} if ok else {}
    return refs | ({"vs_base": "base"} if (tgt["model"] == "base").any() else {})


def expert_gaps(run: RunData, task: str) -> list[str]:
    """The experts without a usable promotion score on `task`, each with why: "language_expert
    (no promotion row)" (its evaluation failed, or promotion left it out), "math_expert (score
    NaN)". The experts expected are the pool's (RUN/search/pool.json, by promotion's names)
    when promotion was asked for them (`experts_asked`), else math_expert and language_expert
    once promotion scored any expert; [] when none is expected."""
    tgt = target_scores(run, task)
    names = tgt["model"].astype(str)
    scored = dict(zip(names, tgt["value"], strict=True))
    asked = experts_asked(run)
    expected = [m for m in promoted_experts(run) if expert_baseline(m)] if asked else []
    if not expected and names.map(expert_baseline).notna().any():
        expected = list(EXPERTS)
    expected += sorted(m for m in scored if expert_baseline(m) and m not in expected)
    return [
        f"{m} (no promotion row)" if m not in scored else f"{m} (score NaN)"
        for m in expected
        if m not in scored or pd.isna(scored[m])
    ]


def experts_asked(run: RunData) -> bool:
    """Whether promotion was asked to score the pool's experts: `experts` in the saved search
    experiment's promote.baselines (RUN/search/experiment.json). A run without a readable one
    (an older run, a demo) is taken to have asked, as the default baselines do.

    Args:
        run: the run analysed.
    Returns:
        False only when the saved experiment lists baselines without `experts`.
    """
    try:
        baselines = json.loads((run.root / EXPERIMENT).read_text(encoding="utf-8"))["promote"]["baselines"]  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return True
    return not isinstance(baselines, list) or "experts" in baselines


def paired_rows(scores: dict[str, pd.Series], refs: dict[str, str], n_resamples: int, seed: int) -> list[dict]:  # fmt: skip
    """One record per model with items, best first: its score, its item count, and its
    difference [95 % CI] to each reference of `refs` (`references`), as numbers (summary.json's
    form).

    Each pair is compared on the doc ids both logged (`mismatches` names the pairs whose item
    sets differ), so one model's odd items touch only its own comparisons.

    Returns:
        [{"model", "target", "items", "vs_better_expert", "vs_base"}]; a comparison is
        {"reference", "difference", "low", "high", "items"} (items: the doc ids paired), or None
        (the model itself, no such reference, the reference's raw file missing, or no doc id in
        common: `blank_reason` says which).
    """
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
    """The doc ids both `model` and `ref` logged, sorted (empty when either has no items)."""
    if ref is None or ref not in scores or model not in scores:
        return pd.Index([])
    return scores[model].index.intersection(scores[ref].index).sort_values()


def blank_reason(scores: dict[str, pd.Series], model: str, ref: str) -> str:
    """Why `paired_rows` left the comparison of `model` with `ref` blank ("" for the model
    itself)."""
    if model == ref:
        return ""
    if ref not in scores:
        return f"n/a: {ref}'s raw lm-eval JSON missing"
    return "n/a: no doc id in common"


def mismatches(scores: dict[str, pd.Series], refs: dict[str, str]) -> list[str]:
    """The pairs `paired_rows` compares on fewer items than either logged, as text ("language_expert
    vs base: paired on the 249 doc ids both logged (0 of language_expert's 249 and 1 of base's
    250 dropped)"); "no doc id in common" where the pair is left blank."""
    out = []
    for r in dict.fromkeys(v for v in refs.values() if v in scores):
        for m in sorted(scores):
            na, nb, n = len(scores[m]), len(scores[r]), len(_common(scores, m, r))
            if m == r or n == na == nb:
                continue
            if not n:
                out.append(f"{m} vs {r}: no doc id in common, not paired")
                continue
            out.append(f"{m} vs {r}: paired on the {n} doc ids both logged ({na - n} of {m}'s {na} and {nb - n} of {r}'s {nb} dropped)")  # fmt: skip
    return out


def paired_table(rows: list[dict], scores: dict[str, pd.Series], refs: dict[str, str]) -> pd.DataFrame:  # fmt: skip
    """`paired_rows` as the report's table: a column per reference, each comparison as
    "+d [lo, hi]" text, or `blank_reason` where there is none."""
    out = []
    for r in rows:
        cells = {"model": r["model"], "target": r["target"], "items": r["items"]}
        for key, ref in refs.items():
            c = r[key]
            text = blank_reason(scores, r["model"], ref) if c is None else f"{c['difference']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]"  # fmt: skip
            cells[f"vs {_REFERENCES[key]} ({ref})"] = text
        out.append(cells)
    return pd.DataFrame(out)


def _missing_note(task: str, missing: list[str]) -> str:
    return (
        f"{task}: raw lm-eval JSON missing for {', '.join(missing)} (promotion/results.parquet's "
        "raw_json, not on disk): not in the table, and every comparison with it is blank."
    )


def paired_section(run: RunData, *, n_resamples: int = 2000, seed: int = 0) -> Section:
    """The section: per target task, `paired_table` of the promoted models, with the models
    whose raw files are missing named.

    Returns:
        The Section; its data: {task: `paired_rows`}.
    """
    tasks = target_tasks(run)
    averaged: dict[str, list[str]] = {t: [] for t in tasks}
    scores = {t: item_scores(run, t, averaged[t]) for t in tasks}
    missing = {t: missing_raw(run, t) for t in tasks}
    if not any(scores.values()):
        why = "no per-item target results (promotion's raw lm-eval JSON)"
        notes = [_missing_note(t, m) for t, m in missing.items() if m]
        return absent("paired", TITLE, f"{why}." + "".join(f" {n}" for n in notes))
    sec = Section("paired", TITLE)
    for task in tasks:
        if not scores[task]:
            sec.text(_missing_note(task, missing[task]) if missing[task] else f"{task}: no per-item results.")  # fmt: skip
            continue
        refs = references(run, task)
        rows = paired_rows(scores[task], refs, n_resamples, seed)
        sec.table(
            f"{task} (test): each promoted model's difference to the better expert (by "
            f"promotion's score) and to the base, item by item, with a percentile-bootstrap 95 % "
            f"CI ({n_resamples} paired resamples, seed {seed}); from promotion's raw lm-eval JSON.",
            paired_table(rows, scores[task], refs),
        )
        if gaps := expert_gaps(run, task):
            sec.text(f"{task}: no comparison with the better expert: {', '.join(gaps)}; the best of the other experts is not the better expert (summary.json: vs_better_expert null).")  # fmt: skip
        if missing[task]:
            sec.text(_missing_note(task, missing[task]))
        if averaged[task]:
            sec.text(f"{task}: {'; '.join(averaged[task])}.")
        if odd := mismatches(scores[task], refs):
            sec.text(f"{task}: item sets differ; each pair is compared on the doc ids both logged: {'; '.join(odd)}.")  # fmt: skip
        sec.data[task] = rows  # numbers, not the table's text
    return sec
