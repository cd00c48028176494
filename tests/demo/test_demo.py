"""`layerswap demo` end to end on the tiny world: Ray Train experts, registry, search, promotion,
leaderboard, best model, then `layerswap analyze` on the run (slow: ~2 min on 2 cores).

Run: .venv/bin/python -m pytest -q tests/search/test_demo.py
"""

from __future__ import annotations

import math
import re

import pyarrow.parquet as pq
import pytest

from layerswap.cli import main

BASELINES = ["base", "math_expert", "language_expert", "soup_uniform", "soup_magnitude", "ties",
             "paper_default"]  # fmt: skip
# What promotion evaluates every model on: the target, the proxy's test split, the proxy
# (the world default: xa Belebele, Brier-scored, whose per-item range is [0, 2]).
PROMOTION_TASKS = {"world_mgsm_direct_xa", "world_belebele_brier_xa", "world_belebele_brier_xa_dev"}  # fmt: skip
TOP = {"world_mgsm_direct_xa": 1.0, "world_belebele_brier_xa": 2.0, "world_belebele_brier_xa_dev": 2.0}  # fmt: skip


@pytest.mark.slow
def test_demo_pipeline_on_the_tiny_world(tmp_path, ray_session, capfd):
    run = tmp_path / "run"
    code = main(["demo", "--world-size", "tiny", "--trials", "3", "--train-steps", "4",
                 "--out", str(run)])  # fmt: skip
    assert code == 0

    # Its own progress, in plain lines; lm-eval's per-request bars only with --verbose.
    printed = "".join(capfd.readouterr())
    for k, stage in enumerate(("world", "Ray Train", "merging indicators", "merge search",
                               "promotion"), 1):  # fmt: skip
        assert f"[demo] stage {k}/5: {stage}" in printed, printed[-3000:]
    for k in (1, 2, 3):
        assert re.search(
            rf"^\[search\] trial {k}/3  .* best .* elapsed \S+  ETA \S+", printed, re.M
        )
    assert re.search(r"^promotion: candidate_", printed, re.M), printed[-3000:]
    for noise in ("Running loglikelihood requests", "Running generate_until requests",
                  "Tokenizing inputs", "Building contexts"):  # fmt: skip
        assert noise not in printed, printed[-3000:]

    reg = pq.read_table(run / "experts" / "registry.parquet").to_pylist()
    assert {r["kind"] for r in reg} == {"math", "language"}
    assert all("ind__world_mgsm_direct_en_dev" in r for r in reg)

    trials = pq.read_table(run / "search" / "trials.parquet").to_pylist()
    assert len(trials) == 3
    # Every trial finished with a real score: a demo whose trials all fail must not pass. A
    # repeated recipe is served ("duplicate") with the score of the trial that evaluated it.
    for t in trials:
        assert t["status"] in ("ok", "duplicate"), (t["trial_id"], t["status"], t["error"])
        assert t["objective"] is not None and math.isfinite(t["objective"]), t
        proxies = {k: v for k, v in t.items() if k.startswith("proxy__")}
        assert proxies == {"proxy__world_belebele_brier_xa_dev": proxies.get("proxy__world_belebele_brier_xa_dev")}, t  # fmt: skip
        assert all(v is not None and 0 <= v <= 2 for v in proxies.values()), t
    assert any(t["status"] == "ok" for t in trials)

    # Promotion evaluated the search's best distinct recipes and every baseline on every task.
    ok = [t for t in trials if t["status"] == "ok"]
    ranked = sorted(ok, key=lambda t: (-t["objective"], t["trial_id"]))
    cands = [f"candidate_{r}" for r in dict.fromkeys(t["recipe_id"] for t in ranked)][:3]
    results = pq.read_table(run / "promotion" / "results.parquet").to_pylist()
    got = {(r["model"], r["task"]) for r in results}
    assert got == {(m, task) for m in [*cands, *BASELINES] for task in PROMOTION_TASKS}
    assert len(results) == len(got), "a model was scored twice on a task"
    assert all(r["value"] is not None and 0 <= r["value"] <= TOP[r["task"]] for r in results)
    assert all(r["split"] == ("dev" if r["task"].endswith("_dev") else "test") for r in results)

    board = (run / "leaderboard.md").read_text()
    for name in [*BASELINES, *cands]:
        assert f"| {name} |" in board or f"| **{name}** (best) |" in board, name
    assert "(failed)" not in board
    # The best model is the search's best by proxy objective (the test split does not choose).
    assert f"| **{cands[0]}** (best) |" in board
    assert "world_mgsm_direct_xa (target, test)" in board

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "best")
    assert model.config.num_hidden_layers == 4
    assert (run / "best" / "layerswap_recipe.yaml").is_file()

    # A second demo into the same folder refuses without --overwrite (exit 2, nothing changed).
    assert main(["demo", "--world-size", "tiny", "--out", str(run)]) == 2

    assert main(["analyze", str(run), "--out", str(tmp_path / "report")]) == 0
    assert "data:image/png;base64," in (tmp_path / "report" / "report.html").read_text()


def test_indicators_are_scored_in_batches(tiny_world, tmp_path, monkeypatch):
    """The demo's indicator stage scores at `indicator_batch_size` ("auto" by default: at batch 1
    it took 45 s per checkpoint on a GPU machine), and a given batch size reaches the scorer."""
    from layerswap.demo import pipeline
    from layerswap.demo.pipeline import DemoSettings, _score_experts
    from layerswap.search.progress import Stages

    made = []

    class Scorer(pipeline.IndicatorScorer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(pipeline, "IndicatorScorer", Scorer)
    lines: list[str] = []
    for size, want in ((None, "auto"), (4, 4)):
        st = DemoSettings(world_size="tiny", proxy_limit=2) if size is None else DemoSettings(world_size="tiny", proxy_limit=2, indicator_batch_size=size)  # fmt: skip
        stages = Stages("demo", 1, emit=lines.append)
        stages.start("indicators", "indicators")
        _score_experts(tmp_path / f"run{size}", tiny_world, {}, st, stages)
        assert made[-1].batch_size == want
    assert sum("base " in line for line in lines) == 2  # the base was scored each time
