"""Assemble the analysis of one run directory into a report folder, written atomically:

    OUT/report.html     self-contained (PNG figures embedded as base64)
    OUT/report.md       Markdown summary with the tables, linking figures/*.png
    OUT/figures/*.png   every figure
    OUT/summary.json    machine-readable results (e.g. the ΔW-suggested boundaries)

Run: `layerswap analyze RUN_DIR [--out DIR]`, or `analyze_run(run_dir, out)` from Python.
`report_state` says whether a report folder already holds this run's report as it is now (what
`analyze --continue` keeps).
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from layerswap.analysis.delta import DEFAULT_QUANTILE
from layerswap.analysis.delta_report import delta_section
from layerswap.analysis.indicators import indicators_section
from layerswap.analysis.load import load_run
from layerswap.analysis.paired import paired_section
from layerswap.analysis.search_plots import search_section
from layerswap.analysis.sections import Figure, Section, Table
from layerswap.analysis.treatments import treatments_section
from layerswap.trainables.outputs import MARKER, check_output, output_dir, read_marker, writing

CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.85em}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right} th{background:#f3f3f3}
td:first-child,th:first-child,td:nth-child(2),th:nth-child(2){text-align:left}
figure{display:inline-block;margin:.5em 1em 1em 0;vertical-align:top;max-width:520px}
figure img{max-width:100%} figcaption{font-size:.8em;color:#555}
caption{caption-side:top;text-align:left;font-size:.85em;color:#444;padding:.3em 0}
.note{color:#666}
"""


def build_sections(
    run_dir: Path,
    *,
    n_resamples: int = 2000,
    seed: int = 0,
    delta_threshold: float | None = None,
    delta_quantile: float = DEFAULT_QUANTILE,
    max_experts: int = 2,
) -> tuple[list[Section], list[str]]:
    """Compute every report section from whatever the run has.

    Returns:
        (sections, list of the run's files that were read).
    """
    run = load_run(run_dir)
    sections = [
        indicators_section(run, n_resamples=n_resamples, seed=seed),
        delta_section(
            run, threshold=delta_threshold, quantile=delta_quantile, max_per_kind=max_experts
        ),
        search_section(run),
        treatments_section(run),
        paired_section(run, n_resamples=n_resamples, seed=seed),
    ]
    present = [name for name in RUN_FILES if (run.root / name).exists()]
    return sections, present


# What a report reads from a run folder (each optional, but not all missing).
RUN_FILES = (
    "experts/registry.parquet",
    "search/trials.parquet",
    "search/study.db",
    "promotion/results.parquet",
    "recipe.yaml",
)


def _table_html(t: Table) -> str:
    body = t.df.to_html(index=not isinstance(t.df.index, pd.RangeIndex), escape=True, border=0)
    cut = body.index(">") + 1  # after the opening <table ...> tag
    return body[:cut] + f"<caption>{html.escape(t.caption)}</caption>" + body[cut:]


def render_html(sections: list[Section], title: str, header: str) -> str:
    """The self-contained HTML report (figures inlined as data: URIs)."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p class='note'>{html.escape(header)}</p>",
        "<ul>"
        + "".join(f"<li><a href='#{s.key}'>{html.escape(s.title)}</a></li>" for s in sections)
        + "</ul>",
    ]
    for s in sections:
        parts.append(f"<h2 id='{s.key}'>{html.escape(s.title)}</h2>")
        for b in s.blocks:
            if isinstance(b, Figure):
                data = base64.b64encode(b.png).decode()
                parts.append(
                    f"<figure><img alt='{html.escape(b.name)}' src='data:image/png;base64,{data}'>"
                    f"<figcaption>{html.escape(b.caption)}</figcaption></figure>"
                )
            elif isinstance(b, Table):
                parts.append(_table_html(b))
            else:
                parts.append(f"<p>{html.escape(b)}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _md_table(df: pd.DataFrame) -> str:
    show = df if isinstance(df.index, pd.RangeIndex) else df.reset_index()
    cols = [str(c) for c in show.columns]
    esc = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, cols)) + " |", "|" + "---|" * len(cols)]
    for row in show.itertuples(index=False):
        lines.append("| " + " | ".join(esc(v) for v in row) + " |")
    return "\n".join(lines)


def render_markdown(sections: list[Section], title: str, header: str) -> str:
    """The Markdown summary (tables inline, figures linked from figures/)."""
    out = [f"# {title}", "", header, ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Figure):
                out += [f"![{b.name}](figures/{b.name}.png)", "", f"*{b.caption}*", ""]
            elif isinstance(b, Table):
                out += [f"**{b.caption}**", "", _md_table(b.df), ""]
            else:
                out += [b, ""]
    return "\n".join(out)


def analyze_run(
    run_dir: str | Path,
    out: str | Path | None = None,
    *,
    overwrite: bool = False,
    n_resamples: int = 2000,
    seed: int = 0,
    delta_threshold: float | None = None,
    delta_quantile: float = DEFAULT_QUANTILE,
    max_experts: int = 2,
) -> Path:
    """Analyze a run directory and write the report folder atomically.

    Args:
        run_dir: the run (layout: docs/guides/search.md and docs/guides/train.md).
        out: report folder (default RUN_DIR/analysis).
        overwrite: replace an existing report folder.
        n_resamples, seed: bootstrap settings for the correlation CIs.
        delta_threshold: absolute ΔW row threshold (None: each expert's `delta_quantile`).
        delta_quantile: the per-expert row-MAV quantile used as threshold, in (0, 1).
        max_experts: ΔW maps per expert kind.
    Returns:
        The report folder.
    Raises:
        ValueError naming the file for a missing run directory or malformed result file, or
        when the output policy refuses `out` (trainables/outputs.py). Nothing is written then.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: run directory does not exist")
    if not any((run_dir / name).exists() for name in RUN_FILES):
        # A report of nothing would be written into a folder that is not a run (a merged model,
        # a typo'd path's parent) with every section "not in this run".
        raise ValueError(f"{run_dir}: not a run folder: none of {', '.join(RUN_FILES)} is in it")
    out = report_dir(run_dir, out)
    inputs = _run_inputs(run_dir)
    check_output(out, "analysis", overwrite=overwrite, inputs=inputs)
    with writing(out):  # one writer per report, refused before the statistics, not after
        return _write_report(run_dir, out, inputs, overwrite, n_resamples=n_resamples, seed=seed, delta_threshold=delta_threshold, delta_quantile=delta_quantile, max_experts=max_experts)  # fmt: skip


def _write_report(run_dir: Path, out: Path, inputs: list, overwrite: bool, *, n_resamples: int, seed: int, delta_threshold: float | None, delta_quantile: float, max_experts: int) -> Path:  # fmt: skip
    """Compute every section of `run_dir` and write the report folder `out` (its lock held)."""
    sections, present = build_sections(
        run_dir,
        n_resamples=n_resamples,
        seed=seed,
        delta_threshold=delta_threshold,
        delta_quantile=delta_quantile,
        max_experts=max_experts,
    )
    title = f"layerswap analysis: {run_dir.resolve().name}"
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"Run directory {run_dir.resolve()}; files read: {', '.join(present) or 'none'}. "
        f"Generated {stamp}."
    )
    names = [f.name for s in sections for f in s.figures]
    if len(names) != len(set(names)):
        raise RuntimeError(f"duplicate figure names: {names}")
    with output_dir(out, "analysis", overwrite=overwrite, inputs=inputs, identity=_identity(run_dir)) as tmp:  # fmt: skip
        (tmp / "figures").mkdir()
        for s in sections:
            for f in s.figures:
                (tmp / "figures" / f"{f.name}.png").write_bytes(f.png)
        (tmp / "report.html").write_text(render_html(sections, title, header), encoding="utf-8")
        (tmp / "report.md").write_text(render_markdown(sections, title, header), encoding="utf-8")
        summary = {
            "run_dir": str(run_dir.resolve()),
            "files": present,
            "sections": {s.key: s.data for s in sections},
        }
        text = json.dumps(_strict(summary), indent=2, allow_nan=False)
        (tmp / "summary.json").write_text(text + "\n", encoding="utf-8")
    return out


def _strict(value):
    """`value` with every NaN or infinite float as None: summary.json is standard JSON (a
    section's undefined statistic, e.g. a correlation of a constant, reads null)."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def report_dir(run_dir: Path, out: Path | None = None) -> Path:
    """The report folder: `out`, else RUN_DIR/analysis."""
    return Path(out) if out is not None else Path(run_dir) / "analysis"


def _identity(run_dir: Path) -> str:
    """What a report's marker names as its run (the run folder's absolute path)."""
    return str(Path(run_dir).resolve())


def report_state(run_dir: Path, out: Path | None = None) -> str:
    """Whether the report folder holds this run's report, written after the run last changed.

    Args:
        run_dir: the run.
        out: the report folder (default RUN_DIR/analysis).
    Returns:
        "none" (no folder there), "current" (this run's report, newer than every file the run
        holds), "stale" (this run's report, older than one of them) or "other" (anything else).
    """
    out = report_dir(run_dir, out)
    if not out.exists() and not out.is_symlink():
        return "none"
    found = read_marker(out)
    if found is None or found["kind"] != "analysis":
        return "other"
    # Its run by name, or the report inside the run folder: a run copied or moved (from the
    # cluster to a laptop) keeps its report, whose marker names the old place.
    inside = out.resolve().parent == Path(run_dir).resolve()
    if found.get("identity") != _identity(run_dir) and not inside:
        return "other"
    written = (out / MARKER).stat().st_mtime
    return "current" if _newest_change(_run_inputs(Path(run_dir))) < written else "stale"


def _newest_change(paths: list[Path]) -> float:
    """The newest modification time of these files and folders and everything under them."""
    newest = 0.0
    for path in paths:
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                try:
                    newest = max(newest, (Path(root) / name).lstat().st_mtime)
                except FileNotFoundError:  # removed while this looked (a writer's temporary)
                    continue
        newest = max(newest, path.lstat().st_mtime)
    return newest


def _run_inputs(run_dir: Path) -> list[Path]:
    """What a report reads: every entry of the run folder except earlier reports."""
    return [
        p for p in sorted(run_dir.iterdir()) if (read_marker(p) or {}).get("kind") != "analysis"
    ]
