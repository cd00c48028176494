"""The "where the experts changed" report section: ΔW heatmaps per expert, their depth summary
beside the paper's Fig. 2, the math-minus-language contrast and the (b, u) it suggests. Experts
come from experts/registry.parquet (path, base) or, for a demo-style run, from RUN/recipe.yaml
(task_expert, language_expert, base)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from layerswap.analysis.delta import (
    DEFAULT_QUANTILE,
    GROUPS,
    REGIONS,
    Boundaries,
    DeltaMap,
    depth_regions,
    row_mav,
    suggest_boundaries,
)
from layerswap.analysis.figures import heatmap
from layerswap.analysis.load import RunData, ok_trials
from layerswap.analysis.sections import Section, absent
from layerswap.analysis.treatment_modes import read_pool
from layerswap.spaces.recipe import LayerSwapRecipe, load_recipe
from layerswap.spaces.search_space import expert_id

TITLE = "Where the experts changed (ΔW)"
# What the layer-swapping paper (§3.2, Fig. 2, Llama 3.1 8B) reports, to read the regions by.
PAPER_FIG2 = (
    "The paper's Fig. 2 (Llama 3.1 8B): the language expert's attention changes most in the "
    "first and last couple of layers and its MLP not at all until the last few; the math "
    "expert's bottom half barely changes, its top half changes in attention and MLP."
)


@dataclass(frozen=True)
class Threshold:
    """Which rows count as changed: an absolute MAV, else each expert's `quantile` of its own."""

    absolute: float | None = None
    quantile: float = DEFAULT_QUANTILE

    def of(self, dm: DeltaMap) -> float:
        """Args: dm, the expert's ΔW map. Returns: the row-MAV threshold for its map."""
        return self.absolute if self.absolute is not None else dm.threshold_auto(self.quantile)

    def describe(self) -> str:
        """The threshold in words, for the section's method paragraph."""
        if self.absolute is not None:
            return f"absolute threshold {self.absolute:g}"
        return (
            f"per-expert threshold = the {self.quantile:g} quantile of that expert's row MAVs "
            f"over all its 2-D layer parameters, so about {100 - 100 * self.quantile:g} % of its "
            "rows count as changed"
        )


@dataclass(frozen=True)
class Mapped:
    """One expert's ΔW map, cut once: the threshold used and the [L, types] fractions."""

    ref: ExpertRef
    dm: DeltaMap
    threshold: float
    frac: np.ndarray


@dataclass(frozen=True)
class ExpertRef:
    label: str
    kind: str  # "math" | "language"
    path: Path
    base: Path


class _Candidate(NamedTuple):
    """An expert the run names: kind ("math" | "language"), id ("" for a demo recipe's), its
    checkpoint and base as recorded, and whether it is a LoRA adapter (not mapped)."""

    kind: str
    eid: str
    path: object
    base: object
    lora: bool


def _candidates(run: RunData) -> list[_Candidate]:
    """The run's experts, those of the best trial first: the registry's, else the search's pool
    (RUN/search/pool.json: a search of explicit experts), else a demo recipe's."""
    first: list[object] = []
    t = ok_trials(run)
    if t is not None and "objective" in t.columns and t["objective"].notna().any():
        best = t.loc[t["objective"].idxmax()]
        first = [best.get("task_expert_id"), best.get("language_expert_id")]
    found: list[_Candidate] = []
    reg = run.registry
    if reg is not None and {"path", "base"} <= set(reg.columns):
        for _, r in reg.iterrows():
            lora = str(r.get("mode")) == "lora"
            found.append(_Candidate(str(r.get("kind")), r["expert_id"], r["path"], r["base"], lora))
    elif (pool := read_pool(run)) is not None:
        for kind, refs in (("math", pool.task), ("language", pool.language)):
            for ref in refs:
                eid = expert_id(pool, ref.path)
                found.append(_Candidate(kind, eid, ref.path, pool.base, ref.kind == "lora"))
    elif run.recipe_yaml is not None:
        recipe = load_recipe(run.recipe_yaml)
        if isinstance(recipe, LayerSwapRecipe) and recipe.base is not None:
            for kind, ref in (("math", recipe.task_expert), ("language", recipe.language_expert)):
                path = ref if isinstance(ref, str) else None
                found.append(_Candidate(kind, "", path, recipe.base, False))
    return sorted(found, key=lambda c: c.eid not in first)  # stable: the source's order after


def pick_experts(run: RunData, max_per_kind: int = 2) -> tuple[list[ExpertRef], list[str]]:
    """Experts to map: those of the best trial first, then the registry's order (a search of
    explicit experts: its pool's, RUN/search/pool.json; a demo: its recipe's); up to
    `max_per_kind` per kind. Returns (experts, notes on what was skipped)."""
    notes: list[str] = []
    out: list[ExpertRef] = []
    for c in _candidates(run):
        name = c.eid or f"{c.kind} expert"
        if sum(e.kind == c.kind for e in out) >= max_per_kind:
            continue
        if c.lora:
            notes.append(f"{name}: LoRA adapter, not mapped")
            continue
        (path, no_path), (base, no_base) = run.model_folder(c.path), run.model_folder(c.base)
        if path is None or base is None:
            notes.append(f"{name}: not mapped, {no_path or 'its base: ' + no_base}")
            continue
        label = f"{c.kind} expert {c.eid}" if c.eid else f"{c.kind} expert ({path.name})"
        out.append(ExpertRef(label, c.kind, path, base))
    return out, notes


def delta_section(
    run: RunData,
    *,
    threshold: float | None = None,
    quantile: float = DEFAULT_QUANTILE,
    max_per_kind: int = 2,
) -> Section:
    """ΔW heatmaps (fraction of rows per layer × type whose mean |ΔW| exceeds the threshold).

    Args:
        run: the loaded run.
        threshold: an absolute row-MAV threshold; None: each expert's `quantile`.
        quantile: in (0, 1), used when `threshold` is None.
        max_per_kind: experts mapped per kind.
    Returns:
        The section (heatmaps, depth-region table, contrast, suggested boundaries).
    """
    thr = Threshold(threshold, quantile)
    experts, notes = pick_experts(run, max_per_kind)
    if not experts:
        why = "no expert checkpoints with a base (experts/registry.parquet path/base, search/pool.json, or recipe.yaml)."
        sec = absent("delta", TITLE, why + (" " + "; ".join(notes) if notes else ""))
        return sec
    sec = Section("delta", TITLE)
    _method_paragraph(sec, thr)
    if notes:
        _skipped_paragraph(sec, notes)
    maps = _expert_heatmaps(sec, experts, thr)
    _depth_table(sec, maps)
    _contrast(sec, maps, thr)
    return sec


def _method_paragraph(sec: Section, thr: Threshold) -> None:
    """What the heatmaps show and which threshold they use."""
    thr_text = thr.describe()
    sec.text(
        "For each expert against its base: per layer and parameter type, the fraction of rows "
        f"whose mean |W_expert - W_base| exceeds the threshold ({thr_text}), as in the layer-"
        "swapping paper's Fig. 2. Computed streaming from safetensors, a row chunk at a time."
    )


def _skipped_paragraph(sec: Section, notes: list[str]) -> None:
    """The experts pick_experts skipped, the first four named."""
    more = f"; and {len(notes) - 4} more" if len(notes) > 4 else ""
    sec.text("Skipped: " + "; ".join(notes[:4]) + more + ".")


def _expert_heatmaps(sec: Section, experts: list[ExpertRef], thr: Threshold) -> list[Mapped]:
    """One rows-changed heatmap per expert. Returns each expert with its ΔW map, in order."""
    maps: list[Mapped] = []
    for e in experts:
        dm = row_mav(e.path, e.base)
        if (warning := dm.rounded_away()) is not None:
            print(f"analyze: warning: {warning}", flush=True)
            sec.text(f"**Warning:** {warning}.")
        value = thr.of(dm)
        frac = dm.fractions(value)
        maps.append(Mapped(e, dm, value, frac))
        nrows = sum(len(v) for v in dm.mav.values())
        p10, p50, p90 = dm.row_quantiles([0.1, 0.5, 0.9])
        png = heatmap(
            frac,
            dm.types,
            [str(i) for i in range(dm.num_layers)],
            title=f"{e.label}: rows changed (thr {value:.2e})",
            vmin=0.0,
            vmax=1.0,
            cmap="Greens",
            xlabel="parameter type",
            ylabel="layer",
            cbar_label="fraction of rows > threshold",
        )
        # The figure name counts the maps so far, so it stays unique across experts of a kind.
        sec.figure(
            f"delta_{e.kind}_{len(maps)}",
            png,
            f"{e.label} ({e.path}) vs base ({e.base}): {len(dm.mav)} 2-D parameters, "
            f"{nrows} rows, {dm.num_layers} layers; row MAV 10th / 50th / 90th percentile "
            f"{p10:.2e} / {p50:.2e} / {p90:.2e}, threshold {value:.2e}.",
        )
    return maps


def _depth_table(sec: Section, maps: list[Mapped]) -> None:
    """Each expert's rows changed by depth region and column group, beside the paper's
    description of its Fig. 2 (the comparison the paper invites, in numbers)."""
    rows, data = [], {}
    for m in maps:
        e, reg = m.ref, depth_regions(m.frac, m.dm.types)
        data[e.label] = reg  # an empty region (NaN) is null in summary.json, "–" in the table
        rows.append({"expert": e.label} | {f"{g} {r}": reg[g][r] for g in GROUPS for r in REGIONS})
    df = pd.DataFrame(rows)
    for c in df.columns[1:]:
        df[c] = df[c].map(lambda v: "–" if np.isnan(v) else f"{v:.3f}")
    sec.table(
        "Fraction of rows changed by depth (bottom quarter / middle half / top quarter of the "
        "layers) and column group (attention q/k/v/o, MLP gate/up/down). " + PAPER_FIG2,
        df,
    )
    sec.data["depth_regions"] = data


def _contrast(sec: Section, maps: list[Mapped], thr: Threshold) -> None:
    """Contrast the first math and language experts and suggest (b, u); else say why not."""
    math_maps = [m for m in maps if m.ref.kind == "math"]
    lang_maps = [m for m in maps if m.ref.kind == "language"]
    if not (math_maps and lang_maps):
        sec.text("Contrast and suggested boundaries: need one math and one language expert.")
        return
    (m, lg) = math_maps[0], lang_maps[0]
    me, mm, le, lm = m.ref, m.dm, lg.ref, lg.dm
    if mm.types != lm.types or mm.num_layers != lm.num_layers:
        sec.text("Contrast: the math and language experts' parameter layouts differ.")
        return
    used = {"math": m.threshold, "language": lg.threshold}  # each expert's own, for a quantile
    fm, fl = m.frac, lg.frac
    _contrast_figure(sec, me, le, mm, fm - fl)
    _suggested_boundaries(sec, suggest_boundaries(fl, fm), me, le, mm.num_layers, thr, used)


def _contrast_figure(
    sec: Section, me: ExpertRef, le: ExpertRef, mm: DeltaMap, diff: np.ndarray
) -> None:
    """The math − language heatmap of the fractions of rows changed."""
    png = heatmap(
        diff,
        mm.types,
        [str(i) for i in range(mm.num_layers)],
        title="math - language (fraction of rows changed)",
        cmap="RdBu_r",
        center=True,
        xlabel="parameter type",
        ylabel="layer",
        cbar_label="math − language",
    )
    sec.figure(
        "delta_contrast",
        png,
        f"{me.label} minus {le.label}: red = more of the math expert's rows pass its threshold, "
        "blue = more of the language expert's pass its own (with per-expert quantile "
        "thresholds each map marks the same share of its rows, so this shows where each "
        "expert's changes sit relative to the other's, not which changed more).",
    )


def _suggested_boundaries(
    sec: Section,
    b: Boundaries,
    me: ExpertRef,
    le: ExpertRef,
    num_layers: int,
    thr: Threshold,
    used: dict[str, float],
) -> None:
    """The dominance table, the suggested warm-start paragraph and its summary.json entry
    (`used`: the row-MAV threshold each expert's map was cut at, by kind)."""
    sec.table(
        "Language dominance per layer (mean over types of language − math fraction) and the "
        "zone the suggested boundaries give it.",
        _dominance_table(b),
    )
    usable = b.is_warm_start
    caveat = (
        ""
        if usable
        else f" It gives the language expert {b.bottom + b.top} of {num_layers} layers: these "
        "maps do not show the papers' language-outside / math-inside split, so it is no warm "
        "start; search the space's own range instead."
    )
    sec.text(
        f"Suggested warm start: b = {b.bottom}, u = {b.top} (layers [0, {b.bottom}) and "
        f"[{num_layers - b.top}, {num_layers}) from the language expert): the split into "
        "language bottom / math middle / language top that agrees most with the per-layer "
        "dominance (see analysis.delta.suggest_boundaries)." + caveat
    )
    sec.data["suggested_boundaries"] = {
        "bottom": b.bottom,
        "top": b.top,
        "dominance": b.dominance,
        "math_expert": str(me.path),
        "language_expert": str(le.path),
        "threshold": thr.absolute,
        "quantile": None if thr.absolute is not None else thr.quantile,
        "thresholds": used,
        "usable_warm_start": usable,
    }


def _dominance_table(b: Boundaries) -> pd.DataFrame:
    num = len(b.dominance)
    zone = ["language" if (i < b.bottom or i >= num - b.top) else "math" for i in range(num)]
    return pd.DataFrame(
        {
            "layer": range(num),
            "language dominance": [f"{d:+.3f}" for d in b.dominance],
            "zone": zone,
        }
    )
