"""The merge search itself: score over (b, u) and over the transitions, best-so-far vs trials,
Optuna parameter importances, and proxy vs target for the promoted recipes."""

from __future__ import annotations

import re
import shutil
import sqlite3
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from layerswap.analysis.figures import bars, best_so_far, heatmap, scatter
from layerswap.analysis.load import (
    RunData,
    merge_scores,
    ok_trials,
    short,
    target_tasks,
    trial_by_recipe,
)
from layerswap.analysis.sections import Section, absent, fmt

TITLE = "The merge search"
# Trials the progress figure counts: scored ones and those the fidelity schedule pruned (both
# ran); failed, duplicate (served from an earlier row) and lost trials did not add a trial.
PROGRESS_STATUSES = ("ok", "pruned")
# What tells two promoted recipes apart (trials.parquet columns, search/results.py); the
# transition weighting among them, else two recipes differing only there read alike.
RECIPE_COLUMNS = (
    "method", "bottom", "top", "bottom_transition", "top_transition", "weights", "non_layer",
    "objective",
)  # fmt: skip


def weights_label(text) -> str:
    """A trial's transition weighting as the table shows it: "magnitude"; "uniform" for equal
    explicit weights; else "explicit (task 0.7, language 0.3)", the weights normalised as the
    merge normalises them (spaces/search_space.py recipe_fields writes "task=T,language=L")."""
    m = re.fullmatch(r"task=([\d.e+-]+),language=([\d.e+-]+)", str(text))
    if m is None:
        return str(text)
    t, lang = float(m[1]), float(m[2])
    if t == lang:
        return "uniform"
    total = t + lang
    return f"explicit (task {t / total:.3g}, language {lang / total:.3g})"


def _grid(t: pd.DataFrame, xcol: str, ycol: str) -> tuple[np.ndarray, np.ndarray, list, list]:
    """Max objective and trial count per (y, x) cell."""
    xs = sorted(int(v) for v in t[xcol].dropna().unique())
    ys = sorted(int(v) for v in t[ycol].dropna().unique())
    best = np.full((len(ys), len(xs)), np.nan)
    count = np.zeros_like(best)
    for (y, x), g in t.groupby([ycol, xcol]):
        i, j = ys.index(int(y)), xs.index(int(x))
        best[i, j] = g["objective"].max()
        count[i, j] = len(g)
    return best, count, xs, ys


def search_section(run: RunData) -> Section:
    """The search section (from search/trials.parquet, search/study.db, promotion results)."""
    if run.trials is None:
        sec = absent("search", TITLE, "no search/trials.parquet.")
        if run.study_db is not None:
            _importances(sec, run.study_db)
        return sec
    sec = Section("search", TITLE)
    if "status" in run.trials.columns:
        _status_paragraph(sec, run.trials)
    t = ok_trials(run)
    if t is None or "objective" not in t.columns or t["objective"].notna().sum() == 0:
        sec.text("Not in this run: no finished trial has an objective.")
        return sec
    t = t[t["objective"].notna()]
    _progress_figure(sec, run.trials)
    _layer_swap_figures(sec, t)
    _importances(sec, run.study_db)
    _promoted(sec, run)
    return sec


def _status_paragraph(sec: Section, raw: pd.DataFrame) -> None:
    """How many trials ended in each status."""
    counts = raw["status"].value_counts().to_dict()
    left = sorted(set(counts) - set(PROGRESS_STATUSES))
    sec.text(
        f"{len(raw)} trials: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + ". The progress figure shows every ok and pruned trial (pruned ones marked, without an "
        "objective); the other figures use ok trials only"
        + (f"; {', '.join(left)} trials are left out of all." if left else ".")
    )


def _fidelity_note(t: pd.DataFrame) -> str:
    """A caption sentence on the fidelities trials were scored at ("" for a single one)."""
    if "fidelity" not in t.columns or t["fidelity"].nunique() <= 1:
        return ""
    return (
        " Trials were scored at several fidelities ("
        + ", ".join(f"{int(k)} items: {v}" for k, v in sorted(t["fidelity"].value_counts().items()))
        + "); early-stopped trials report their low-fidelity score."
    )


def _progress_figure(sec: Section, raw: pd.DataFrame) -> None:
    """Objective per trial that ran (ok or pruned), in finishing order, and the best so far.

    Pruned trials keep their place on the x axis, marked, so that the axis counts the trials the
    search ran (the demo's best trial is its 13th of 16, not the 6th)."""
    t = raw[raw["status"].isin(PROGRESS_STATUSES)] if "status" in raw.columns else raw
    if "finished_at" in t.columns:
        t = t.sort_values("finished_at", kind="stable")
    pruned = (t["status"] == "pruned").to_numpy() if "status" in t.columns else None
    obj = pd.to_numeric(t["objective"], errors="coerce").to_numpy(float)
    png = best_so_far(obj, title="Search progress", ylabel="objective", pruned=pruned)
    n_pruned = int(pruned.sum()) if pruned is not None else 0
    which = f" ({len(t) - n_pruned} scored, {n_pruned} pruned: marked at the bottom)" if n_pruned else ""  # fmt: skip
    sec.figure(
        "search_progress",
        png,
        f"Objective of {len(t)} trials{which} in finishing order and the best so far "
        f"(search/trials.parquet).{_fidelity_note(t[t['objective'].notna()])}",
    )


def _layer_swap_figures(sec: Section, t: pd.DataFrame) -> None:
    """Max-objective heatmaps of the layer-swap trials over (b, u) and over the transitions."""
    ls = t[t["method"] == "layer_swap"] if "method" in t.columns else t
    bu = ["bottom", "top"]
    if not (set(bu) <= set(ls.columns) and ls[bu].notna().all(axis=1).any()):
        sec.text("No layer-swap trials with (b, u) in this run.")
        return
    ls = ls[ls[bu].notna().all(axis=1)]
    png = _max_objective_heatmap(
        ls,
        "top",
        "bottom",
        title="Best objective over (b, u)",
        xlabel="u (top language layers)",
        ylabel="b (bottom language layers)",
    )
    sec.figure(
        "search_bu",
        png,
        f"Max objective per (b, u) over {len(ls)} finished layer-swap trials; n = trials "
        "per cell (search/trials.parquet).",
    )
    tcols = ["bottom_transition", "top_transition"]
    if set(tcols) <= set(ls.columns) and ls[tcols].notna().all(axis=1).any():
        lt = ls[ls[tcols].notna().all(axis=1)]
        png = _max_objective_heatmap(
            lt,
            "top_transition",
            "bottom_transition",
            title="Best objective over transitions",
            xlabel="t_u (top transition)",
            ylabel="t_b (bottom transition)",
        )
        sec.figure(
            "search_transitions",
            png,
            f"Max objective per (t_b, t_u) over {len(lt)} finished layer-swap trials.",
        )


def _max_objective_heatmap(
    t: pd.DataFrame, xcol: str, ycol: str, *, title: str, xlabel: str, ylabel: str
) -> bytes:
    """Heatmap PNG of the max objective per (ycol, xcol) cell, annotated with trial counts."""
    best, count, xs, ys = _grid(t, xcol, ycol)
    return heatmap(
        best,
        [str(x) for x in xs],
        [str(y) for y in ys],
        title=title,
        cmap="viridis",
        annotate=True,
        counts=count,
        xlabel=xlabel,
        ylabel=ylabel,
        cbar_label="max objective",
    )


def _importances(sec: Section, db: Path | None) -> None:
    """Optuna parameter importances of each study in the run's SQLite storage.

    The database is copied to a temporary file first (`_snapshot`): opening an RDB storage may
    create or migrate tables, and analysis must never write into the run.
    """
    if db is None:
        sec.text("Parameter importances: not in this run (no search/study.db).")
        return
    import optuna
    from optuna.importance import get_param_importances

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="layerswap-analyze-") as tmp:
        copy = Path(tmp) / "study.db"
        _snapshot(db, copy)
        storage = f"sqlite:///{copy}"
        try:
            names = optuna.study.get_all_study_names(storage=storage)
            studies = [optuna.load_study(study_name=n, storage=storage) for n in names]
            trials = {st.study_name: st.trials for st in studies}  # read here: named if damaged
        except Exception as e:  # a corrupt or foreign SQLite file
            raise ValueError(f"{db}: not a readable Optuna study database ({e})") from None
        if not studies:
            sec.text(f"Parameter importances: {db} holds no study.")
        for study in studies:
            name = study.study_name
            done = [tr for tr in trials[name] if tr.state == optuna.trial.TrialState.COMPLETE]
            evaluator, label = _evaluator()
            try:
                imp = get_param_importances(study, evaluator=evaluator)
            except Exception as e:  # too few trials, no common parameters, multi-objective, ...
                sec.text(f"Parameter importances of study {name!r}: not computable ({e}).")
                continue
            if not imp:
                sec.text(f"Parameter importances of study {name!r}: no parameters.")
                continue
            png = bars(
                list(imp),
                list(imp.values()),
                title=f"{label} importance ({name})",
                xlabel="importance",
            )
            sec.figure(
                f"importance_{len(sec.figures):02d}",
                png,
                f"Optuna {label} parameter importances (seed 0) of study {name!r}, over its "
                f"{len(done)} complete trials and the parameters common to them (search/study.db).",
            )


def _snapshot(db: Path, copy: Path) -> None:
    """A consistent copy of the SQLite file `db` at `copy`, read-only on the run.

    SQLite's backup under a read-only connection copies the last commit even while a search
    writes (file copies could pair a journal and a database from either side of a commit). A
    search killed mid-commit leaves a hot journal, which only a writer may roll back (the
    read-only open refuses): the files are then copied together and rolled back in the copy.
    """
    try:
        src = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            dst = sqlite3.connect(copy)
            try:
                src.backup(dst)
            finally:
                dst.close()
        finally:
            src.close()
        return
    except sqlite3.Error as e:
        copy.unlink(missing_ok=True)
        if getattr(e, "sqlite_errorname", "") != "SQLITE_READONLY_ROLLBACK":  # not a hot journal
            if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
                raise ValueError(f"{db}: locked by its search for over 30 s; try again") from None
            shutil.copyfile(db, copy)  # a damaged file: named when the copy is read
            return
    journal = db.with_name(db.name + "-journal")
    if journal.is_file():
        shutil.copyfile(journal, copy.with_name(copy.name + "-journal"))
    shutil.copyfile(db, copy)


def _evaluator():
    """fANOVA (Optuna's default; needs scikit-learn), else PED-ANOVA (no extra dependency)."""
    from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator

    try:
        import sklearn  # noqa: F401

        return FanovaImportanceEvaluator(seed=0), "fANOVA"
    except ImportError:
        return PedAnovaImportanceEvaluator(), "PED-ANOVA"


def _promoted(sec: Section, run: RunData) -> None:
    trials = trial_by_recipe(run)
    tasks = target_tasks(run)
    if run.promotion is None or trials is None or not tasks:
        sec.text("Proxy vs target: not in this run (no promotion results with a target task).")
        return
    for task in tasks:
        tgt = merge_scores(run, task)
        tgt = tgt[tgt["recipe_id"].isin(trials.index)]
        if tgt.empty:
            sec.text(f"Proxy vs target on {task}: no promoted candidate matches a trial.")
            continue
        cols = [c for c in RECIPE_COLUMNS if c in trials.columns]
        rows = []
        for _, r in tgt.iterrows():
            tr = trials.loc[r["recipe_id"]]
            recipe = {c: weights_label(tr[c]) if c == "weights" else tr[c] for c in cols}
            rows.append(
                {
                    "model": r["model"],
                    "recipe_id": r["recipe_id"],
                    **recipe,
                    "target": r["value"],
                    "n_items": r["n_items"],
                }
            )
        df = pd.DataFrame(rows).sort_values("target", ascending=False)
        sec.table(
            f"Promoted recipes: search objective vs {task} (test), best first.",
            df.map(fmt).reset_index(drop=True),
        )
        if "objective" in df.columns and len(df) >= 2:
            png = scatter(
                df["objective"].to_numpy(float),
                df["target"].to_numpy(float),
                title="Proxy (search objective) vs target",
                xlabel="search objective (dev proxies)",
                ylabel=f"target: {short(task)} (test)",
                labels=[str(r)[:6] for r in df["recipe_id"]],
            )
            sec.figure(
                f"proxy_target_{short(task)}",
                png,
                f"{len(df)} promoted models whose recipe the search tried: search objective (search/trials.parquet) vs "
                f"{task} test score (promotion/results.parquet).",
            )
