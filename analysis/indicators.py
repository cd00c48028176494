"""Merging indicators: does a cheap signal predict the target score of the merged models?

Points are the fully evaluated merges: the promoted candidates and the merged baselines (soups,
TIES, the paper's default swap). Merge-level indicators are each merge's proxy scores on the dev
splits — from promotion/results.parquet when promotion scored them (the same lm-eval items for
every point), else the search's proxy__* columns — and, for candidates, the search objective;
expert-level indicators are the ind__* scores of the experts a candidate was built from
(experts/registry.parquet). Each is correlated with the merge's target score (MGSM test in the
target language, promotion/results.parquet). No figure depends on the order of the points or the
merges' names: stats.correlate resamples the pairs in sorted order, and ties at a top-k cut are
averaged, not broken (stats.topk_agreement).

Run: .venv/bin/python -m pytest -q tests/analysis/test_indicator_ties.py
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from layerswap.analysis.figures import scatter
from layerswap.analysis.load import (
    RunData,
    indicator_columns,
    merge_scores,
    proxy_columns,
    short,
    target_tasks,
    trial_by_recipe,
)
from layerswap.analysis.sections import Figure, Section, absent, fmt_ci
from layerswap.analysis.stats import METHODS, MIN_PAIRS, Correlation, correlate, topk_agreement
from layerswap.spaces.task_families import N_ITEMS_PREFIX as N_ITEMS
from layerswap.spaces.task_families import find_family, indicator_task

TITLE = "Merging indicators vs target score"
MAX_SCATTERS = 24
# A constant indicator or target ranks nothing: its row states no correlation and no top-k pick
# (which would only be the tie-break's), in the table and as null in summary.json.
CANNOT_TELL = "cannot tell"
# Below stats.MIN_PAIRS merges correlate gives no number; the row's correlation cells say why.
TOO_FEW = "too few merges"
UNDEFINED = Correlation("", 0, float("nan"), float("nan"), float("nan"), float("nan"))
TOPK_COLUMNS = ("top-3 overlap", "top-1 in target top-3", "regret")
# indicator_table's column of the dev items each merge's value of an indicator rests on: kept per
# indicator, as two proxies (a 100-item Belebele, a 50-item MGSM) have different counts.
ITEMS = "_items:"


def _dev_scores(run: RunData) -> dict[tuple[str, str], tuple[float, float]]:
    """{(model, task): (value, n_items)} of the promotion's dev-split rows (empty without them)."""
    p = run.promotion
    if p is None or "split" not in p.columns:
        return {}
    dev = p[p["split"] == "dev"]
    n = dev["n_items"] if "n_items" in dev.columns else [None] * len(dev)
    return {
        (m, t): (float(v), k)
        for m, t, v, k in zip(dev["model"], dev["task"], dev["value"], n, strict=True)
    }


def lower_is_better(run: RunData, task: str) -> bool:
    """Whether a lower score on `task` is the better one: the run's search experiment says so
    for its proxy (Proxy.best < worst), or the task's world metric (a Brier-scored twin's
    brier_score) is not higher-is-better. The one rule for merge- and expert-level indicators.
    """
    if task in run.lower_is_better:
        return True
    fam = find_family(task)
    stems = sorted(fam.world_stems.items(), key=lambda kv: -len(kv[0])) if fam else []
    for stem, metrics in stems:
        if task.startswith(f"{stem}_"):
            return bool(metrics) and metrics[0].get("higher_is_better") is False
    return False


def _oriented(run: RunData, task: str, name: str, value) -> tuple[str, object]:
    """(name, value) with a lower-is-better indicator negated and labelled so, so that a good
    indicator's correlation, top-k and regret read as for the others (higher = better). The
    name does not depend on the value: a merge without one stays a gap in the same column."""
    if not lower_is_better(run, task):
        return name, value
    missing = value is None or pd.isna(value)
    return f"{name} (negated: lower is better)", None if missing else -float(value)


def indicator_table(run: RunData, task: str) -> tuple[pd.DataFrame, dict[str, str]]:
    """One row per fully evaluated merge with a target score on `task`, one column per indicator.

    Returns:
        (table with columns `recipe_id`, `target` and the indicators; {indicator: level}).
    """
    tgt = merge_scores(run, task)
    trials = trial_by_recipe(run)
    if tgt.empty or trials is None:
        return pd.DataFrame(columns=["recipe_id", "target"]), {}
    dev = _dev_scores(run)
    rows, levels = [], {}
    reg = None
    if run.registry is not None and "expert_id" in run.registry.columns:
        reg = run.registry.drop_duplicates("expert_id").set_index("expert_id")
    for _, r in tgt.iterrows():
        rid = r["recipe_id"]
        tr = trials.loc[rid] if rid in trials.index else None
        if tr is None and r.get("kind") != "baseline":
            continue
        fidelity = tr.get("fidelity") if tr is not None and "fidelity" in trials.columns else None
        row = {"recipe_id": rid, "target": float(r["value"]), "_n_items": r.get("n_items")}
        for c in [*proxy_columns(trials), "objective"]:
            if c == "objective":
                if tr is None or c not in trials.columns:
                    continue
                name, value, n = "merge: objective", tr[c], fidelity
            else:
                proxy = c[len("proxy__") :]
                name = f"merge: {short(proxy)}"
                if (r["model"], proxy) in dev:  # promotion's lm-eval items, same for all
                    value, n = dev[(r["model"], proxy)]
                else:
                    value, n = (tr[c] if tr is not None else None), fidelity
                name, value = _oriented(run, proxy, name, value)
            row[name], row[ITEMS + name] = value, n
            levels[name] = "merge"
        for side, col in (
            ("math expert", "task_expert_id"),
            ("language expert", "language_expert_id"),
        ):
            eid = tr.get(col) if tr is not None and col in trials.columns else None
            if reg is None or eid is None or eid not in reg.index:
                continue
            for c in indicator_columns(reg):
                task = indicator_task(c)
                name, value = _oriented(run, task, f"{side}: {short(task)}", reg.loc[eid, c])
                n_col = N_ITEMS + task
                row[name] = value
                row[ITEMS + name] = reg.loc[eid, n_col] if n_col in reg.columns else None
                levels[name] = "expert"
        rows.append(row)
    df = pd.DataFrame(rows)
    for c in levels:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df, levels


def indicators_section(run: RunData, *, n_resamples: int = 2000, seed: int = 0) -> Section:
    """The indicator-correlation section (table + one scatter per indicator)."""
    tasks = target_tasks(run)
    if run.promotion is None:
        return absent(
            "indicators", TITLE, "no promotion/results.parquet (no fully evaluated merges)."
        )
    if run.trials is None:
        return absent("indicators", TITLE, "no search/trials.parquet (no candidate indicators).")
    if not tasks:
        return absent(
            "indicators", TITLE, "no target-language MGSM test task in the promotion results."
        )
    sec = Section("indicators", TITLE)
    _method_paragraph(sec, n_resamples, seed)
    any_rows = False
    for task in tasks:
        if _task_indicators(sec, run, task, n_resamples, seed):
            any_rows = True
    if not any_rows:
        sec.blocks.insert(0, "Not in this run: too few promoted candidates to correlate.")
    return sec


def _method_paragraph(sec: Section, n_resamples: int, seed: int) -> None:
    """What the points, correlations, CIs and top-k columns are."""
    sec.text(
        "Each point is a merged model the promotion step fully evaluated (candidates and merged "
        "baselines). Correlations are "
        f"with its target score; 95% CIs are percentile bootstraps ({n_resamples} paired "
        f"resamples, seed {seed}). Top-k: overlap of the k best merges by the indicator with the "
        "k best by target; top-1 hit: the indicator's best merge is among the target's k best; "
        "regret: best target minus the target of the indicator's best merge. Where merges tie "
        "at a cut (the indicator's best, or the k-th place of either ranking; saturated "
        "accuracies do), no tie-break is chosen: each top-k figure is its expected value over a "
        "uniformly random tie-break, the top-1 hit reads 'tied' with its chance, the regret is "
        "the mean over the merges tied at the indicator's top with its range, and an overlap "
        "that differs between tie-breaks is marked '(tied)'. Expert-level "
        "indicators repeat across the merges built from the same expert, so their points are not "
        "independent; read their CIs as optimistic. An indicator (or a target) with the same value "
        f"for every merge ranks nothing: its row reads '{CANNOT_TELL}' (null in summary.json). "
        f"Correlations need at least {MIN_PAIRS} merges (with fewer, no ranking of the points is "
        "significant at the 5 % level): a row with fewer reads "
        f"'{TOO_FEW} (n=…)' in its correlation cells (null in summary.json)."
    )


def _task_indicators(sec: Section, run: RunData, task: str, n_resamples: int, seed: int) -> bool:
    """One target task's indicator table and scatters; False (and a note) if too few merges."""
    df, levels = indicator_table(run, task)
    if len(df) < 2 or not levels:
        sec.text(
            f"{task}: {len(df)} promoted candidate(s) with a target score and search "
            f"indicators; at least 2 are needed (at least {MIN_PAIRS} for a correlation)."
        )
        return False
    target_items = f"target scored on {_span(df, '_n_items')} test items"
    rows, data, figs = [], [], []
    for ind, level in sorted(levels.items(), key=lambda kv: (kv[1] != "expert", kv[0])):
        pair = df[[ind, "target"]].dropna()
        x, y = pair[ind].to_numpy(float), pair["target"].to_numpy(float)
        constant = _constant(x, y)
        if constant:  # no ranking: a correlation is undefined, a top-k pick is a tie-break
            cors, tk = {m: UNDEFINED for m in METHODS}, {}
        else:
            cors = {c.method: c for c in correlate(x, y, n_resamples=n_resamples, seed=seed)}
            tk = {t.k: t for t in topk_agreement(x, y)}
        items = _span(df.loc[pair.index], ITEMS + ind)
        rows.append(_indicator_row(ind, level, len(x), items, cors, tk, constant))
        data.append(_indicator_data(ind, level, len(x), cors, tk) | {"dev_items": _range(df.loc[pair.index], ITEMS + ind)})  # fmt: skip
        if len(figs) < MAX_SCATTERS and not constant:
            labels = [str(r)[:6] for r in df.loc[pair.index, "recipe_id"]]
            rho = cors["spearman"].estimate
            items = f"{target_items}, the indicator on {items} dev items"
            figs.append(_scatter_figure(task, ind, level, x, y, labels, rho, items, len(figs) + 1))
    table = pd.DataFrame(rows).sort_values(["level", "_rho"], ascending=[True, False])
    sec.table(
        f"Indicators vs {task} (test split), {len(df)} promoted merges ({target_items}; each "
        "indicator's dev items in its row); expert-level rows first, each sorted by Spearman.",
        table.drop(columns="_rho").reset_index(drop=True),
    )
    # Scatters were collected in the loop; they go after the table, which needs every row first.
    sec.blocks.extend(figs)
    sec.data[task] = [data[i] for i in table.index]  # the table's order, as numbers
    return True


def _constant(x: np.ndarray, y: np.ndarray) -> str:
    """Which side has one value for every merge ('' if neither, or too few merges to tell)."""
    if len(x) < 2:
        return ""
    if np.ptp(x) == 0:
        return "indicator"
    return "target" if np.ptp(y) == 0 else ""


def _indicator_row(
    ind: str, level: str, n: int, items: str, cors: dict, tk: dict, constant: str
) -> dict:
    """One table row: correlations with CIs and top-k agreement (`_rho` for sorting); a row
    whose indicator or target is constant says it cannot tell in every statistic's cell."""
    if constant:
        cells = {f"{m} [95% CI]": CANNOT_TELL for m in METHODS} | dict.fromkeys(TOPK_COLUMNS, CANNOT_TELL)  # fmt: skip
        cells["spearman [95% CI]"] = f"{CANNOT_TELL}: constant {constant}"
        return {"level": level, "indicator": ind, "n": n, "dev items": items, **cells, "_rho": float("nan")}  # fmt: skip
    few = n < MIN_PAIRS
    return {
        "level": level,
        "indicator": ind,
        "n": n,
        "dev items": items,
        **{f"{m} [95% CI]": f"{TOO_FEW} (n={n})" if few else fmt_ci(*_e(cors[m])) for m in METHODS},
        "top-3 overlap": _overlap_cell(tk[3]) if 3 in tk else "–",
        "top-1 in target top-3": _hit_cell(tk[3]) if 3 in tk else "–",
        "regret": _regret_cell(tk[1]) if 1 in tk else "–",
        "_rho": cors["spearman"].estimate,
    }


def _overlap_cell(t) -> str:
    """The expected overlap, marked where a tie at a cut changes it."""
    return f"{t.overlap:.2f}" + (" (tied)" if t.overlap_tied else "")


def _hit_cell(t) -> str:
    """'yes' or 'no' only where every tie-break agrees; else the chance of a hit."""
    if t.hit in (0.0, 1.0):
        return "yes" if t.hit else "no"
    return f"tied: {t.hit:.0%} chance"


def _regret_cell(t) -> str:
    """The regret; where tied top merges differ on target, their mean and range."""
    if t.regret_low == t.regret_high:
        return f"{t.regret:.3f}"
    return f"{t.regret:.3f} (mean of {t.tied_top} tied: {t.regret_low:.3f}–{t.regret_high:.3f})"


def _indicator_data(ind: str, level: str, n: int, cors: dict, tk: dict) -> dict:
    """One table row for summary.json: the same results as numbers (None where undefined; NaN
    becomes null on writing), so a script reads them without parsing the table's text."""
    return {
        "level": level,
        "indicator": ind,
        "n": n,
        **{m: {"estimate": c.estimate, "low": c.low, "high": c.high} for m, c in cors.items()},
        "top3_overlap": float(tk[3].overlap) if 3 in tk else None,
        "top1_in_target_top3": float(tk[3].hit) if 3 in tk else None,
        "regret": float(tk[1].regret) if 1 in tk else None,
        "tied_at_top": tk[1].tied_top if 1 in tk else None,
    }


def _scatter_figure(
    task: str,
    ind: str,
    level: str,
    x: np.ndarray,
    y: np.ndarray,
    labels: list[str],
    rho: float,
    items: str,
    nfig: int,
) -> Figure:
    """The indicator-vs-target scatter of one indicator, the `nfig`-th of its task."""
    png = scatter(
        x,
        y,
        title=f"{ind}\n"
        + (
            f"Spearman {rho:+.2f}"
            if np.isfinite(rho)
            else f"{TOO_FEW} for a correlation (n={len(x)})"
        ),
        xlabel=ind,
        ylabel=f"target: {short(task)}",
        labels=labels,
    )
    return Figure(
        f"indicator_{short(task)}_{nfig:02d}",
        png,
        f"{ind} vs {task} (test) of {len(x)} promoted merges (labels: recipe id); "
        f"{items}. "
        f"Sources: {'promotion dev rows (else search/trials.parquet)' if level == 'merge' else 'experts/registry.parquet'}"
        f" + promotion/results.parquet.",
    )


def _e(c) -> tuple[float, float, float]:
    return c.estimate, c.low, c.high


def _range(df: pd.DataFrame, col: str) -> list[int] | None:
    """[fewest, most] items a column gives over the merges (None when unknown)."""
    v = pd.to_numeric(df[col], errors="coerce").dropna() if col in df else pd.Series([])
    return None if v.empty else [int(v.min()), int(v.max())]


def _span(df: pd.DataFrame, col: str) -> str:
    """How many items a column gives over the merges: "250", "25-100" or "unknown"."""
    r = _range(df, col)
    if r is None:
        return "unknown"
    return str(r[0]) if r[0] == r[1] else f"{r[0]}-{r[1]}"
