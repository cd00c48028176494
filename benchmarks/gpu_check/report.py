"""The GPU check's Markdown report: every figure beside its target and what layerswap assumed.

Rewritten after each stage by run.py (a run cut short still has one); `write_report` reads only
the stage records, so a report can be rebuilt from the JSON files:
    python benchmarks/gpu_check/report.py DIR     # DIR/NN_*.json -> DIR/report.md
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the gpu_check package

from gpu_check.figures import Figure, fmt

# run.py's hang watchdog writes the blocked threads' tracebacks here (under the run's folder)
HANG_FILE = "hung_traceback.txt"
RUNNING = (
    "still running when this was written (the run may have been SIGKILLed there, or ended by "
    f"its hang watchdog: then {HANG_FILE} says where it was blocked)"
)
SMOKE = "smoke (tiny shapes, CPU: checks the stages run; the numbers mean nothing)"


def _row(f: Figure) -> str:
    verdict = {"met": "✅ met", "missed": "❌ missed", "not measured": "— not measured"}.get(f.verdict, "")  # fmt: skip
    return (
        f"| {f.name} | {fmt(f.value)} {f.unit} | {f.target or ''} | {verdict} "
        f"| {fmt(f.assumed) + ' ' + f.unit if f.assumed is not None else ''} | {f.note} |"
    )


def _kept(r: dict) -> str:
    """ ", kept: PARTS" for a record that kept finished parts (run.with_kept), else ""."""
    return f"; kept: {', '.join(r['partial']['parts'])}" if r.get("partial") else ""


def render(records: list[dict], header: dict) -> str:
    """The report's Markdown.

    Args:
        records: the stage records run.py wrote (stage, status, seconds, result | error).
        header: {"gpu", "mode", "date", "notes"}.
    """
    lines = [
        f"# layerswap GPU check: {header['gpu']}",
        "",
        f"{header['mode']} run, {header['date']}. Every figure is measured by "
        "benchmarks/gpu_check/run.py in this run; *assumed* is what layerswap assumed for it "
        "(spaces/throughput.yaml, or a memory plan) before.",
        "",
    ]
    lines += [f"- {n}" for n in header.get("notes", [])]
    figures = [
        (r["stage"], Figure.from_dict(d))
        for r in records
        for d in r.get("result", {}).get("figures", [])
    ]
    partial = {r["stage"] for r in records if r.get("partial")}
    targeted = [(s, f) for s, f in figures if f.target is not None]
    missed = [(s, f) for s, f in targeted if f.verdict != "met"]
    not_ok = [r for r in records if r["status"] != "ok"]
    lines += [
        "## Verdict",
        "",
        f"{len(records)} stage(s) run, {len(records) - len(not_ok)} finished; "
        f"{len(targeted) - len(missed)} of {len(targeted)} targets met.",
        "",
    ]
    lines += [
        f"- **{r['stage']}** {r['status']}: {r.get('error') or RUNNING}{_kept(r)}" for r in not_ok
    ]
    lines += [f"- {s}{' (partial)' if s in partial else ''}: {f.name} = {fmt(f.value)} {f.unit}, target {f.target}: {f.verdict}" for s, f in missed]  # fmt: skip
    for r in records:
        lines += ["", f"## {r['index']}. {r.get('title', r['stage'])} ({r['stage']}): {r['status']} in {r['seconds']:.1f} s", ""]  # fmt: skip
        if r["status"] != "ok":
            lines += [f"`{r['error']}`" if r.get("error") else RUNNING]
            if not r.get("partial"):
                continue
            lines += ["", f"**Partial**{_kept(r)}: the figures below are from the parts that finished.", ""]  # fmt: skip
        res = r["result"]
        if res.get("versions"):
            lines += ["| component | version |", "|---|---|"]
            lines += [f"| {k} | {v} |" for k, v in res["versions"].items()]
            lines += [""]
        if res.get("figures"):
            lines += [
                "| figure | measured | target | verdict | layerswap assumed | how |",
                "|---|---|---|---|---|---|",
            ]
            lines += [_row(Figure.from_dict(d)) for d in res["figures"]]
        lines += [f"- {n}" for n in res.get("notes", [])]
    return "\n".join(lines) + "\n"


def write_report(ctx, records: list[dict], path: Path) -> None:
    """Render the records of the run `ctx` into `path` (atomically)."""
    from gpu_check.common import write_text

    header = {
        "gpu": ctx.gpu_name,
        "mode": SMOKE if ctx.smoke else "full",
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "notes": ctx.notes,
    }
    write_text(path, render(records, header))


def main() -> None:
    out = Path(sys.argv[1])
    records = [json.loads(p.read_text()) for p in sorted(out.glob("[0-9][0-9]_*.json"))]
    header = {"gpu": "(rebuilt from JSON)", "mode": "rebuilt", "date": time.strftime("%Y-%m-%d"), "notes": []}  # fmt: skip
    (out / "report.md").write_text(render(records, header))


if __name__ == "__main__":
    main()
