"""Treatments compared on the target task, in the shape of the follow-up paper's Table 1/Table 3,
with a Friedman test across treatments over the conditions (base model × language) present.

Where values come from: promotion/results.parquet (test split) for the base, the baselines and
the promoted layer-swap candidates; experts/registry.parquet for the SFT treatments
(math-only, language-only, data mixing, simultaneous: `kind` and `mode`), read from the column
`ind__<target task>` or, failing that, `ind__<target task>_dev` (marked as dev in the table).
A promotion value wins over a registry value for the same treatment, mode and language. A
promoted model's SFT-type column is its experts' mode (analysis/treatment_modes.py). The
"layer swap" row is chosen per target language (chosen_swaps); the Friedman test ranks
test-split cells only and names what it leaves out (analysis/friedman_cells.py).

Run: .venv/bin/python -m pytest -q tests/analysis/test_treatments_two_languages.py
"""

from __future__ import annotations

import pandas as pd

from layerswap.analysis.friedman_cells import FriedmanCells, friedman_cells, friedman_paragraph
from layerswap.analysis.load import (
    IND,
    RunData,
    is_target_family,
    target_tasks,
    trial_by_recipe,
)
from layerswap.analysis.sections import Section, absent
from layerswap.analysis.treatment_modes import (
    MODES,
    expert_mode,
    expert_row,
    layer_swap_modes,
    promoted_modes,
)
from layerswap.spaces.baselines import expert_baseline, merged_baseline
from layerswap.spaces.task_families import dev_task, heldout_task, task_language, task_split

TITLE = "Treatments"
ROWS = ["base model", "math-only", "language-only", "data mixing", "simultaneous", "layer swap"]
BASELINE_ROWS = {
    "base": "base model",
    "math_expert": "math-only",
    "language_expert": "language-only",
    "soup_uniform": "model soup (uniform)",
    "soup_magnitude": "model soup (magnitude)",
    "ties": "TIES",
    "paper_default": "layer swap (paper default)",
}


def treatment_values(run: RunData) -> pd.DataFrame:
    """Long table: treatment, mode, language, block, value, split, source, model (one row per
    model; the registry's: its expert id). A promotion score that is NaN stays, as NaN, for the
    section to name (`unscored`); the tables and the Friedman test leave it out (`scored`), and
    a registry score of its cell is then kept."""
    tasks = target_tasks(run)
    base_name = "run"
    reg = run.registry
    if reg is not None and "base" in reg.columns and reg["base"].nunique() == 1:
        base_name = str(reg["base"].iloc[0])
    recs = []
    prom = run.promotion
    modes_by_recipe, modes_by_model = layer_swap_modes(run), promoted_modes(run)
    chosen, mean_row = chosen_swaps(run), candidates_mean_row(run)
    for task in tasks:
        lang = task_language(task)
        if prom is not None:
            sel = prom[prom["task"] == task]
            if "split" in sel.columns:
                sel = sel[sel["split"].fillna("test") == "test"]
            for _, r in sel.iterrows():
                model = str(r["model"])
                if _is_candidate(r):
                    # every candidate counts in the mean's row; only the chosen one is the swap
                    mode = modes_by_recipe.get(r.get("recipe_id"), "full")
                    value = float(r["value"])
                    recs.append((mean_row, mode, lang, (base_name, lang), value, "test", "promotion", model))  # fmt: skip
                    if r.get("recipe_id") != chosen.get(task):
                        continue
                    treat = "layer swap"
                elif "revert" in model:
                    continue  # the revert table's
                else:
                    # math_expert_2, language_expert_3: further experts of the pool;
                    # soup_uniform_t2_l1: a merged baseline's further pairs (its cell is the
                    # mean over pairs, the paper's "avg of 9 pairs", n shown)
                    key = expert_baseline(model) or merged_baseline(model) or model
                    treat = BASELINE_ROWS.get(key, model)
                    mode = modes_by_model.get(model, "full")  # its experts' (treatment_modes)
                if treat == "base model":
                    mode = "base"
                value = float(r["value"])
                recs.append((treat, mode, lang, (base_name, lang), value, "test", "promotion", model))  # fmt: skip
        if reg is not None:
            col = next((c for c in (IND + task, IND + dev_task(task)) if c in reg.columns), None)
            if col is None:
                continue
            for _, r in reg.iterrows():
                treat = expert_row(r)
                if treat is None or pd.isna(r[col]):
                    continue
                if treat != "math-only" and "language" in r.index and str(r["language"]) != lang:
                    continue  # a language expert for another language
                block = (str(r.get("base", base_name)), lang)
                split = task_split(col)
                recs.append((treat, expert_mode(r), lang, block, float(r[col]), split, "registry", str(r.get("expert_id", ""))))  # fmt: skip
    df = pd.DataFrame(
        recs,
        columns=["treatment", "mode", "language", "block", "value", "split", "source", "model"],
    )
    if df.empty:
        return df
    # A promotion value wins over registry values of the same cell and language.
    has_prom = (
        scored(df[df["source"] == "promotion"]).groupby(["treatment", "mode", "language"]).size()
    )
    keep = [
        not (s == "registry" and (t, m, lang) in has_prom.index)
        for t, m, lang, s in zip(
            df["treatment"], df["mode"], df["language"], df["source"], strict=True
        )
    ]
    return df[keep].reset_index(drop=True)


def _is_candidate(r: pd.Series) -> bool:
    return r.get("kind") == "candidate" or str(r["model"]).startswith("candidate_")


def _candidates(run: RunData) -> pd.DataFrame:
    """The promotion's rows of layer-swap candidates on a target task (none: empty)."""
    prom = run.promotion
    if prom is None:
        return pd.DataFrame(columns=["model", "recipe_id", "task"])
    sel = prom[prom["task"].isin(target_tasks(run))]
    return sel[[_is_candidate(r) for _, r in sel.iterrows()]]


def chosen_swaps(run: RunData) -> dict[str, str | None]:
    """Per target task, the recipe id of the layer swap the papers' row stands for there.

    Of the candidates promoted on that task, the one with the best search objective (dev proxies
    only), as promotion selects it by default; ties go to the first promoted. Where some of them
    were built with a language expert of the task's language (the registry says), only those
    compete: a search for another language has an objective on another scale. Chosen per task,
    so that a run with two target languages has a swap in each (one choice over all tasks left
    the other language's cell empty, and the greedy Friedman drop then removed the swap).

    Returns:
        {target task: recipe id, or None without a promoted candidate with an objective}.
    """
    trials = trial_by_recipe(run)
    cands = _candidates(run)
    out: dict[str, str | None] = dict.fromkeys(target_tasks(run))
    if trials is None or "objective" not in trials.columns:
        return out
    objective = pd.to_numeric(trials["objective"], errors="coerce")
    langs = _language_expert_languages(run)
    for task in out:
        rids = [r for r in cands.loc[cands["task"] == task, "recipe_id"].unique() if r in objective.index]  # fmt: skip
        rids = [r for r in rids if pd.notna(objective[r])]
        own = [r for r in rids if langs.get(r) == task_language(task)]
        rids = own or rids
        out[task] = (
            max(rids, key=lambda r: objective[r]) if rids else None
        )  # max keeps the first tie
    return out


def _language_expert_languages(run: RunData) -> dict[str, str]:
    """recipe_id -> the language of the language expert it was built with (where known)."""
    trials, reg = trial_by_recipe(run), run.registry
    need = {"expert_id", "language"}
    if trials is None or reg is None or not need <= set(reg.columns):
        return {}
    if "language_expert_id" not in trials.columns:
        return {}
    lang = reg.drop_duplicates("expert_id").set_index("expert_id")["language"].astype(str)
    return {
        rid: lang[eid]
        for rid, eid in trials["language_expert_id"].items()
        if isinstance(eid, str) and eid in lang.index
    }


def candidates_mean_row(run: RunData) -> str:
    """The row label of the mean over every promoted candidate, naming how many it averages."""
    return f"layer swap (mean of {_candidates(run)['model'].nunique()} promoted candidates)"


def _cell(g: pd.DataFrame) -> str:
    mark = "†" if (g["split"] == "dev").any() else ""
    n = f" (n={len(g)})" if len(g) > 1 else ""
    return f"{g['value'].mean():.3f}{mark}{n}"


def scored(vals: pd.DataFrame) -> pd.DataFrame:
    """`treatment_values`' rows with a score (NaN rows: `unscored`)."""
    return vals[vals["value"].notna()]


def unscored(vals: pd.DataFrame) -> str:
    """The promoted models whose score is NaN, as text ("math_expert (math-only / full, xa)"),
    "" when none."""
    nan = vals[vals["value"].isna() & (vals["treatment"] != "layer swap")]  # also in the mean's
    return ", ".join(f"{m} ({_label(t, md)}, {lang})" for m, t, md, lang in zip(nan["model"], nan["treatment"], nan["mode"], nan["language"], strict=True))  # fmt: skip


def treatment_tables(vals: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(Table-1 shape: treatments × modes, averaged over languages; Table-3 shape: languages
    (+ average) × treatment/mode). Cells are means over instances (n shown when > 1); NaN
    scores are left out."""
    vals = scored(vals)
    langs = sorted(vals["language"].unique())
    means = sorted(t for t in set(vals["treatment"]) if t.startswith("layer swap (mean of "))
    order = ROWS + means + sorted(set(vals["treatment"]) - set(ROWS) - set(means))
    t1 = {}
    for treat in [t for t in order if t in set(vals["treatment"])]:
        row = {}
        for mode in ["base", *MODES]:
            g = vals[(vals["treatment"] == treat) & (vals["mode"] == mode)]
            if g.empty:
                continue
            per_lang = g.groupby("language")["value"].mean()
            full = len(per_lang) == len(langs)
            row[mode] = (
                f"{per_lang.mean():.3f}{'' if full else '*'}{'†' if (g['split'] == 'dev').any() else ''}"
            )
        t1[treat] = row
    table1 = (
        pd.DataFrame.from_dict(t1, orient="index")
        .reindex(columns=[c for c in ["base", *MODES] if any(c in r for r in t1.values())])
        .fillna("–")
    )
    cells = [
        (t, m)
        for t in order
        for m in ["base", *MODES]
        if ((vals["treatment"] == t) & (vals["mode"] == m)).any()
    ]
    t3 = {}
    for lang in langs:
        t3[lang] = {
            _label(t, m): _cell(g)
            if not (
                g := vals[
                    (vals["treatment"] == t) & (vals["mode"] == m) & (vals["language"] == lang)
                ]
            ).empty
            else "–"
            for t, m in cells
        }
    if len(langs) > 1:
        avg = {}
        for t, m in cells:
            per = (
                vals[(vals["treatment"] == t) & (vals["mode"] == m)]
                .groupby("language")["value"]
                .mean()
            )
            avg[_label(t, m)] = f"{per.mean():.3f}" if len(per) == len(langs) else "–"
        t3["average"] = avg
    table1.index.name = "treatment"
    table3 = pd.DataFrame.from_dict(t3, orient="index")
    table3.index.name = "language"
    return table1, table3


def _label(treat: str, mode: str) -> str:
    return treat if mode == "base" else f"{treat} / {mode}"


def friedman_matrix(vals: pd.DataFrame) -> FriedmanCells:
    """Conditions × treatments matrix of mean values over the paper's treatments (math-only,
    language-only, data mixing, simultaneous, layer swap; each SFT type a treatment; the base
    model and extra baselines excluded); test-split cells only, gaps dropped greedily
    (friedman_cells)."""
    v = vals[vals["treatment"].isin(ROWS[1:])].copy()
    v["label"] = [_label(t, m) for t, m in zip(v["treatment"], v["mode"], strict=True)]
    v["blk"] = [f"{b[0]} / {b[1]}" for b in v["block"]]
    return friedman_cells(v)


def treatments_section(run: RunData) -> Section:
    """The treatments section: Table-1/Table-3 shaped tables, Friedman test, revert table."""
    vals = (
        treatment_values(run) if (run.promotion is not None or run.registry is not None) else None
    )
    if vals is None or vals.empty:
        sec = absent(
            "treatments",
            TITLE,
            "no target-task scores of any treatment (promotion results or expert indicators).",
        )
        _revert(sec, run)
        return sec
    sec = Section("treatments", TITLE)
    t1, t3 = treatment_tables(vals)
    counted = scored(vals)[
        lambda d: d["treatment"] != "layer swap"
    ]  # the chosen swap is also in the mean's row
    srcs = ", ".join(f"{k}: {v}" for k, v in counted["source"].value_counts().items())
    prom = run.promotion
    if prom is not None and "n_items" in prom.columns:
        n = pd.to_numeric(prom[prom["task"].isin(target_tasks(run))]["n_items"], errors="coerce")
        if n.notna().any():
            lo, hi = int(n.min()), int(n.max())
            srcs += f" (promotion scores on {lo if lo == hi else f'{lo}-{hi}'} test items)"
    sec.table(
        "Target MGSM by treatment and SFT type, averaged over the target languages "
        f"({', '.join(sorted(vals['language'].unique()))}); values from {srcs} models. "
        "* not every language present; † includes dev-split expert scores.",
        t1,
    )
    sec.table("Per language (rows) and treatment / SFT type (columns); n = instances averaged.", t3)
    if nan := unscored(vals):
        sec.text(f"No score (NaN in promotion/results.parquet), left out of the tables and the Friedman test: {nan}.")  # fmt: skip
    _layer_swap_note(sec, run)
    _friedman(sec, vals)
    _revert(sec, run)
    return sec


def _layer_swap_note(sec: Section, run: RunData) -> None:
    """Which model the "layer swap" row is, and what the candidates' mean row averages."""
    chosen, n = chosen_swaps(run), _candidates(run)["model"].nunique()
    if n == 0:
        return
    picks = set(chosen.values())
    how = (
        "search objective (dev proxies only, as promotion selects by default; the test split "
        "does not choose)"
    )
    if picks == {None}:
        which = "not shown: no promoted candidate has a search objective to choose it by"
    elif len(picks) == 1:
        which = f"the swap the search chose: candidate_{picks.pop()}, the promoted candidate with the best {how}"  # fmt: skip
    else:
        each = "; ".join(
            f"{task}: " + (f"candidate_{rid}" if rid else "none (no candidate with an objective)")
            for task, rid in chosen.items()
        )
        which = (
            f"per target language, the swap the search chose there ({each}): of the candidates "
            f"promoted on that task (those built with a language expert of its language, where "
            f"there are some), the one with the best {how}"
        )
    sec.text(
        f'"layer swap" is one model, {which}. "{candidates_mean_row(run)}" averages every '
        "candidate promotion evaluated; it is not one model and is left out of the Friedman test."
    )


def _friedman(sec: Section, vals: pd.DataFrame) -> None:
    """The Friedman test's paragraph, saying what it ranks over what; its numbers to sec.data."""
    friedman_paragraph(sec, friedman_matrix(vals))


def _revert(sec: Section, run: RunData) -> None:
    """Freeze-then-train (experts of mode "partial") vs train-then-revert (promoted models named
    *revert*), per MGSM task (test name; † marks dev-split scores)."""
    recs = []
    if run.registry is not None and "mode" in run.registry.columns:
        part = run.registry[run.registry["mode"] == "partial"]
        for c in [c for c in part.columns if c.startswith(IND) and is_target_family(c)]:
            for _, r in part.iterrows():
                if pd.notna(r[c]):
                    task = c[len(IND) :]
                    recs.append((str(r.get("kind", "")), heldout_task(task), "freeze-then-train", float(r[c]), task_split(task) == "dev"))  # fmt: skip
    if run.promotion is not None:
        p = run.promotion[run.promotion["model"].astype(str).str.contains("revert")]
        for _, r in p.iterrows():
            if is_target_family(str(r["task"])):
                kind = "language" if "lang" in str(r["model"]) else "math"
                split = str(r.get("split", "test"))
                recs.append((kind, heldout_task(str(r["task"])), "train-then-revert", float(r["value"]), split == "dev"))  # fmt: skip
    if not recs:
        sec.text(
            "Freeze-then-train vs train-then-revert: not in this run (no partial-SFT experts or "
            "revert models)."
        )
        return
    df = pd.DataFrame(recs, columns=["expert", "task", "treatment", "value", "dev"])
    cells = {}
    for (kind, task, treat), g in df.groupby(["expert", "task", "treatment"]):
        mark = "†" if g["dev"].any() else ""
        cells.setdefault((kind, task), {})[treat] = f"{g['value'].mean():.3f}{mark} (n={len(g)})"
    tab = pd.DataFrame.from_dict(cells, orient="index").fillna("–")
    tab.index = pd.MultiIndex.from_tuples(tab.index, names=["expert", "task"])
    sec.table(
        "Freeze-then-train (partial-SFT experts, registry indicators) vs train-then-revert "
        "(promoted *revert* models): mean score over n models; † dev split.",
        tab.reset_index(),
    )
