"""`layerswap demo` end to end on the tiny world: Ray Train experts, registry, search, promotion,
leaderboard, best model, then `layerswap analyze` on the run (slow: ~2 min on 2 cores)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from cli import main

BASELINES = ["base", "math_expert", "language_expert", "soup_uniform", "soup_magnitude", "ties",
             "paper_default"]  # fmt: skip


@pytest.mark.slow
def test_demo_pipeline_on_the_tiny_world(tmp_path, ray_session):
    run = tmp_path / "run"
    code = main(["demo", "--world-size", "tiny", "--trials", "3", "--train-steps", "4",
                 "--out", str(run)])  # fmt: skip
    assert code == 0

    reg = pq.read_table(run / "experts" / "registry.parquet").to_pylist()
    assert {r["kind"] for r in reg} == {"math", "language"}
    assert all("ind__world_mgsm_direct_en_dev" in r for r in reg)

    trials = pq.read_table(run / "search" / "trials.parquet").to_pylist()
    assert len(trials) == 3

    board = (run / "leaderboard.md").read_text()
    for name in BASELINES:
        assert f"| {name} |" in board, name
    assert "(best)" in board and "world_mgsm_direct_xa (target, test)" in board

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "best")
    assert model.config.num_hidden_layers == 4
    assert (run / "best" / "layerswap_recipe.yaml").is_file()

    # A second demo into the same folder refuses without --overwrite (exit 2, nothing changed).
    assert main(["demo", "--world-size", "tiny", "--out", str(run)]) == 2

    assert main(["analyze", str(run), "--out", str(tmp_path / "report")]) == 0
    assert "data:image/png;base64," in (tmp_path / "report" / "report.html").read_text()
