"""A study plan as data and as `layerswap plan` prints it: StudyPlan (stages of rows, each row's
device-hours, bounds and storage; plain data, `to_json` for `--json`) and `format_study_plan`
(one table per stage, the totals, every profile figure with its provenance, and what was
resolved, assumed, unknown or wrong). study/plan.py fills the plan.
Tests: .venv/bin/pytest -q tests/study/test_study_plan.py
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from layerswap.study.storage import fmt_bytes

STAGES = {
    "train": "expert training",
    "indicators": "indicator scoring of expert checkpoints",
    "search": "merge search trials",
    "promotion": "promotion (lm-eval on test splits)",
}


@dataclass
class Row:
    """One line of a stage: what runs, how often, where, and its device-hours (None: unknown)."""

    name: str
    counts: dict[str, float]
    where: str
    hours: float | None
    figures: list[str]
    hours_low: float | None = None  # a lower bound (fidelity screening prunes trials)
    hours_high: float | None = None  # an upper bound (every batch decodes max_gen_toks)
    storage: float | None = 0.0  # bytes its outputs keep on storage (None: unknown)
    costs: dict[str, float] = field(default_factory=dict)  # a run's step and checkpoint figures
    gpus: float = 0.0  # GPUs one run, trial or evaluation holds (0: CPUs only)
    accelerator: str | None = None  # the GPU type it asks Ray for (scaling.accelerator_type)
    notes: list[str] = field(default_factory=list)


@dataclass
class Stage:
    key: str
    title: str
    rows: list[Row] = field(default_factory=list)

    @property
    def hours(self) -> float | None:
        """The stage's device-hours; None when a row's are unknown."""
        return _sum([r.hours for r in self.rows])

    @property
    def hours_high(self) -> float | None:
        """Device-hours with every generation batch decoding max_gen_toks."""
        return _sum([r.hours if r.hours_high is None else r.hours_high for r in self.rows])

    @property
    def storage(self) -> float | None:
        """Bytes the stage's outputs keep on storage; None when a row's are unknown."""
        return _sum([r.storage for r in self.rows])


def _sum(values: list[float | None]) -> float | None:
    """The sum, or None when a value is unknown."""
    return None if any(v is None for v in values) else sum(values)


@dataclass
class StudyPlan:
    study: str
    source: str
    profile: str
    profile_data: dict
    unit: str
    resolved: list[str] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def hours(self) -> float | None:
        return _sum([s.hours for s in self.stages])

    @property
    def hours_high(self) -> float | None:
        return _sum([s.hours_high for s in self.stages])

    @property
    def storage(self) -> float | None:
        return _sum([s.storage for s in self.stages])

    def to_json(self) -> dict:
        """The plan as JSON data (what `--json` writes)."""
        data = asdict(self)
        totals = ("hours", "hours_high", "storage")
        for s, d in zip(self.stages, data["stages"], strict=True):
            d.update({k: getattr(s, k) for k in totals})
        return {"layerswap_plan": 1, **data, **{k: getattr(self, k) for k in totals}}


def _num(v: float) -> str:
    """A count for the table: 12,345 / 15.8M / 2.5."""
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:,.1f}"


def _hours(h: float | None) -> str:
    """Device-hours: two decimals, or three significant digits below one hour."""
    if h is None:
        return "?"
    return f"{h:,.2f}" if h >= 1 else f"{h:.3g}"


def _storage(nbytes: float | None) -> str:
    return "?" if nbytes is None else fmt_bytes(nbytes)


def _figure(name: str, fig: dict) -> str:
    """`name value unit (origin)`; a figure measured by a run cut short says so and why."""
    m = fig.get("measured")
    origin = "assumed" if not m else f"measured, partial: {m['partial']}" if m.get("partial") else "measured"  # fmt: skip
    return f"{name} {fig['value']:.3g} {fig['unit']} ({origin})"


def _stage_lines(i: int, st: Stage, figs: dict, u: str) -> list[str]:
    """One stage's table: its hours (and storage), a line per row with its bounds and notes."""
    w = max(9, len(u))
    kept = f"; keeps {_storage(st.storage)} on storage" if st.storage != 0 else ""
    out = ["", f"stage {i}: {st.title}: {_hours(st.hours)} {u}{kept}", f"  {u:>{w}}  name: counts"]
    for r in st.rows:
        low = f" (>= {_hours(r.hours_low)} {u})" if r.hours_low is not None else ""
        high = f" (<= {_hours(r.hours_high)} {u})" if r.hours_high is not None else ""
        counts = ", ".join(f"{k} {_num(v)}" for k, v in r.counts.items())
        out.append(f"  {_hours(r.hours):>{w}}  {r.name}: {counts}{low}{high}")
        out.append(f"  {'':>{w}}    on: {r.where}")
        out += [f"  {'':>{w}}    note: {n}" for n in r.notes]
    if not st.rows:
        out.append(f"  {'':>{w}}  (nothing in this study)")
    used = sorted({f for r in st.rows for f in r.figures})
    if used:
        out.append("  rests on: " + "; ".join(_figure(f, figs[f]) for f in used))
    return out


def _total_lines(plan: StudyPlan) -> list[str]:
    """The study's hours, their upper bound, and its storage, by stage."""
    u = plan.unit
    per = ", ".join(f"{s.key} {_hours(s.hours)}" for s in plan.stages)
    out = ["", f"total: {_hours(plan.hours)} {u} ({per})"]
    if plan.hours_high != plan.hours:
        out.append(f"  every generation batch decoding max_gen_toks: {_hours(plan.hours_high)} {u}")
    stored = ", ".join(f"{s.key} {_storage(s.storage)}" for s in plan.stages if s.storage != 0)
    out.append(f"storage when the study ends: {_storage(plan.storage)} ({stored or 'nothing'})")
    return out


def format_study_plan(plan: StudyPlan) -> str:
    """The plan as `layerswap plan` prints it: one table per stage, totals, figures, findings."""
    figs = {k: v for k, v in plan.profile_data.items() if isinstance(v, dict) and "value" in v}
    u = plan.unit
    out = [f"study plan: {plan.study} ({plan.source})", f"profile {plan.profile}: {plan.profile_data['device']}; hours are {u} (device-hours)"]  # fmt: skip
    for i, st in enumerate(plan.stages, 1):
        out += _stage_lines(i, st, figs, u)
    out += _total_lines(plan)
    measured = sorted(k for k, v in figs.items() if v.get("measured"))
    partial = [k for k in measured if figs[k]["measured"].get("partial")]
    of_them = f", {len(partial)} of them partial" if partial else ""
    out.append(f"figures of profile {plan.profile} ({len(measured)} of {len(figs)} measured{of_them}):")  # fmt: skip
    for k, v in figs.items():
        if v.get("measured"):
            m = v["measured"]
            out.append(f"  {_figure(k, v)}: {m['benchmark']} on {m['device']}, {m['date']}: {m['command']}")  # fmt: skip
        else:
            out.append(f"  {_figure(k, v)}: {v['assumed']}")
    for title, lines in (("resolved offline", plan.resolved), ("unknown (not estimated)", plan.unknowns), ("warnings", plan.warnings), ("problems", plan.problems)):  # fmt: skip
        if lines:
            out += ["", f"{title}:"] + [f"  - {x}" for x in lines]
    return "\n".join(out)
