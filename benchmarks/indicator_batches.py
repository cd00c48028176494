"""Do a demo run's merging indicators read the same when scored in batches? Re-scores every
checkpoint in RUN/experts/registry.parquet on the demo's indicator tasks at `--batch-size` and
compares with the registry's readings (what the demo scored), checkpoint by checkpoint, with the
wall time of the re-scoring. Padding a batch can move a float near-tie, so a changed batch size
is checked, not assumed.

Run: `python benchmarks/indicator_batches.py RUN [--batch-size auto] [--device cpu]`
(RUN: a `layerswap demo` folder). Exit 1 when any reading differs, 2 on bad input (no demo
run, or a registry with no checkpoint: nothing to compare). Smoke run: tests/benchmarks/
test_indicator_batches.py, on a demo-shaped run of two tiny experts scored as the demo scores them.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def compare(run: Path, batch_size, device: str) -> tuple[list[dict], float]:
    """Re-score each registry checkpoint of `run` with the demo's own indicator scorer (its
    default settings but `batch_size`) and pair the readings with the registry's.

    Args:
        run: a demo run folder (experts/registry.parquet, world/).
        batch_size: an int or "auto".
        device: "cpu", "cuda" or "auto".
    Returns:
        (rows of checkpoint, task, registry reading, new reading; seconds spent scoring).
    Raises:
        ValueError: naming what is missing from `run`.
    """
    from layerswap.demo.pipeline import INDICATORS, DemoSettings, indicator_scorer
    from layerswap.trainables.atomic import read_parquet
    from layerswap.trainables.evaluate.tasks import write_world_tasks

    reg_path = run / "experts" / "registry.parquet"
    if not reg_path.is_file() or not (run / "world" / "base").is_dir():
        raise ValueError(f"{run}: not a demo run (needs experts/registry.parquet and world/base)")
    reg = read_parquet(reg_path).to_pandas()
    if reg.empty:  # "0 of 0 readings equal" would read as a pass
        raise ValueError(f"{reg_path}: no checkpoint in the registry, nothing to re-score")
    missing = [t for t in INDICATORS if f"ind__{t}" not in reg.columns]
    if missing:
        raise ValueError(f"{reg_path}: no readings of {', '.join(missing)}")
    tasks_dir = run / "experts" / "tasks"  # the demo's own task YAMLs
    if not tasks_dir.is_dir():  # written afresh elsewhere: nothing is added to the run
        tasks_dir = Path(tempfile.mkdtemp(prefix="indicator_batches_"))
        write_world_tasks(run / "world", tasks_dir)
    scorer = indicator_scorer(run / "world", tasks_dir, DemoSettings(indicator_batch_size=batch_size), device)  # fmt: skip
    rows, spent = [], 0.0
    for _, entry in reg.iterrows():
        t0 = time.perf_counter()
        scores = scorer.score_checkpoint(entry["path"]).scores
        spent += time.perf_counter() - t0
        name = f"{Path(entry['path']).parent.name}/{Path(entry['path']).name}"
        rows += [{"checkpoint": name, "task": t, "registry": float(entry[f"ind__{t}"]), "now": scores[t]} for t in INDICATORS]  # fmt: skip
    return rows, spent


def _batch(text: str):
    """--batch-size: "auto" or a positive int (argparse names the bad value)."""
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive int or auto")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    """Print the comparison; exit 1 when a reading differs."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a layerswap demo run folder")
    ap.add_argument("--batch-size", default="auto", type=_batch, help='rows per forward pass: an int or "auto"')  # fmt: skip
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    args = ap.parse_args(argv)
    batch = args.batch_size
    try:
        rows, spent = compare(args.run, batch, args.device)
    except ValueError as e:
        ap.exit(2, f"indicator_batches: {e}\n")
    print("| checkpoint | indicator | registry (the demo's) | batch " + str(batch) + " |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['checkpoint']} | {r['task']} | {r['registry']:.4f} | {r['now']:.4f} |")
    differ = [r for r in rows if r["registry"] != r["now"]]
    n = len({r["checkpoint"] for r in rows})
    print(f"\n{len(rows) - len(differ)} of {len(rows)} readings equal; {n} checkpoints re-scored in {spent:.1f} s on {args.device}")  # fmt: skip
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
