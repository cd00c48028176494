"""benchmarks/indicator_batches.py as a new user runs it (a relative RUN folder), on a run shaped
as `layerswap demo` leaves it (world/, experts/tasks/, experts/registry.parquet) with two tiny
experts scored as the demo's own indicator stage scores them: re-scored at the demo's batch size,
every reading is the registry's; a registry with no checkpoint compares nothing and is refused.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_indicator_batches.py   (slow: ~30 s)
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from layerswap.demo.pipeline import INDICATORS, DemoSettings, indicator_scorer
from layerswap.experts.registry import append_rows, expert_row, registry_path
from layerswap.trainables.atomic import read_parquet
from layerswap.trainables.evaluate.tasks import write_world_tasks


@pytest.fixture(scope="module")
def demo_like_run(tiny_world, tiny_experts, tmp_path_factory) -> Path:
    """RUN with the demo's layout; registry rows as demo.pipeline._score_experts writes them."""
    run = tmp_path_factory.mktemp("demo_like") / "run"
    (run / "experts").mkdir(parents=True)
    (run / "world").symlink_to(tiny_world)
    tasks = run / "experts" / "tasks"
    write_world_tasks(run / "world", tasks)
    scorer = indicator_scorer(run / "world", tasks, DemoSettings(), device="cpu")
    rows = []
    for kind, lang in (("math", "en"), ("language", "xa")):
        ck = tiny_experts["task" if kind == "math" else "language"]
        exp = {"name": f"tiny_{kind}", "kind": kind, "language": lang, "mode": {"type": "full"}, "base": str(tiny_world / "base")}  # fmt: skip
        manifest = {"step": 2, "samples": 8, "seed": 0, "hparams": {}}
        rows.append(expert_row(exp, ck, manifest, exp["name"], scorer.score_checkpoint(ck).columns()))  # fmt: skip
    append_rows(registry_path(run), rows)
    return run


@pytest.mark.slow
def test_every_reading_is_the_registrys_at_the_demos_batch_size(demo_like_run, run_bench):
    run = run_bench("indicator_batches.py", "run", "--batch-size", "auto", links={"run": demo_like_run})  # fmt: skip
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]  # fmt: skip
    assert {r[1].strip() for r in rows} == set(INDICATORS) and len(rows) == 2 * len(INDICATORS)
    assert all(r[2] == r[3] for r in rows), run.tail()
    assert f"{len(rows)} of {len(rows)} readings equal; 2 checkpoints re-scored" in run.stdout


def test_a_registry_with_no_checkpoint_is_refused(demo_like_run, tmp_path, run_bench):
    empty = tmp_path / "empty"
    (empty / "experts").mkdir(parents=True)
    (empty / "world").symlink_to(demo_like_run / "world")
    pq.write_table(read_parquet(registry_path(demo_like_run)).slice(0, 0), registry_path(empty))
    run = run_bench("indicator_batches.py", "empty", links={"empty": empty}, expect=2)
    assert "no checkpoint in the registry" in run.stderr
