"""benchmarks/world_probe.py's arguments (the probe itself is minutes: run it by hand).

Run `.venv/bin/python -m pytest tests/benchmarks/test_world_probe.py -q`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import world_probe
import world_probe_blocks


def test_a_missing_lang_data_file_is_refused_by_name_before_any_training(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(SystemExit) as exit_:
        world_probe.parse_args(["--world", str(tmp_path), "--lang-data", str(missing)])
    assert exit_.value.code != 0 and str(missing) in capsys.readouterr().err


def test_an_existing_lang_data_file_is_taken(tmp_path):
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"inputs": "a", "targets": "b"}\n')
    assert world_probe.parse_args(["--world", str(tmp_path), "--lang-data", str(data)]).lang_data == data  # fmt: skip


def test_true_equations_are_the_rows_problems_and_a_foreign_world_is_refused(tiny_world, tmp_path):
    from layerswap.world.sft import read_rows

    rows = read_rows(tiny_world, "data/mgsm/en/test.jsonl")
    equations = world_probe.true_equations(tiny_world, "test", rows)
    assert [int(e.rsplit("=", 1)[1]) for e in equations] == [r["answer_number"] for r in rows]
    swapped = [rows[1], rows[0], *rows[2:]]  # a world whose rows are not this code's draws
    with pytest.raises(ValueError, match="not the MGSM this code draws"):
        world_probe.true_equations(tiny_world, "test", swapped)


def test_experts_are_taken_from_checkpoints_not_trained(tiny_world, tmp_path, capsys, monkeypatch):
    from layerswap.world.sft import load_base

    with pytest.raises(SystemExit):
        world_probe.parse_args(["--world", str(tiny_world), "--experts", str(tmp_path), str(tmp_path)])  # fmt: skip
    assert "not a checkpoint folder" in capsys.readouterr().err
    model, _ = load_base(tiny_world)
    for name, shift in (("math", 1.0), ("lang", 2.0)):  # two distinguishable "experts"
        for p in model.parameters():
            p.data += shift
        model.save_pretrained(tmp_path / name)
    args = world_probe.parse_args(["--world", str(tiny_world), "--experts", str(tmp_path / "math"), str(tmp_path / "lang")])  # fmt: skip
    monkeypatch.setattr(
        "layerswap.world.sft.sft", lambda *a, **k: pytest.fail("trained although --experts")
    )
    states, _, _ = world_probe.train_experts(tiny_world, args)
    key = next(iter(states["base"]))
    assert torch.equal(states["math"][key], states["base"][key] + 1.0)
    assert torch.equal(states["language"][key], states["math"][key] + 2.0)  # the same float ops


def test_attribution_scores_the_base_with_exactly_one_block_of_each_expert(capsys):
    # Two layers and one non-layer weight; each expert shifts every weight by its own amount,
    # so a score that reads the three weights tells which block came from which expert.
    keys = ("model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight", "model.norm.weight")  # fmt: skip
    states = {
        name: {k: torch.full((2,), shift) for k in keys}
        for name, shift in (("base", 0.0), ("math", 1.0), ("language", 2.0))
    }

    def score(state):  # -> (layer 0, layer 1): stands in for (xa, en) MGSM
        return float(state[keys[0]][0]), float(state[keys[1]][0])

    def read(state):  # the non-layer weight: stands in for the Brier score
        return float(state[keys[2]][0])

    out = world_probe_blocks.attribution(states, 2, score, read)
    assert out["base"] == [0.0, 0.0, 0.0]
    assert out["math"] == {"0": [1.0, 0.0, 0.0], "1": [0.0, 1.0, 0.0], "non-layer": [0.0, 0.0, 1.0]}  # fmt: skip
    assert out["language"]["1"] == [0.0, 2.0, 0.0] and out["language"]["non-layer"] == [0.0, 0.0, 2.0]  # fmt: skip
    printed = capsys.readouterr().out
    assert "non-layer  0.000 / 0.000 / 1.000" in printed and "non-layer  0.000 / 0.000 / 2.000" in printed  # fmt: skip


@pytest.mark.slow
def test_runs_as_a_user_runs_it_with_every_reading(tiny_world, run_bench):
    # the whole probe on the tiny world: experts trained (2 steps each), every merge scored,
    # --select (world_probe_select), --attribution and --per-layer (world_probe_blocks)
    run = run_bench(
        "world_probe.py", "--world", "world", "--math-steps", "2", "--lang-steps", "2",
        "--resamples", "50", "--select", "--attribution", "--per-layer", "--json", "out/probe.json",
        links={"world": tiny_world}, timeout=900,
    )  # fmt: skip
    raw = json.loads((run.cwd / "out" / "probe.json").read_text())
    depth = 4  # the tiny world's
    names = [r["name"] for r in raw["table"]]
    assert names[:3] == ["base", "math", "language"] and names[3].startswith("paper default")
    assert len(names) == len(world_probe.recipes(depth)) + 3, run.tail()
    assert all(0 <= r["xa_mgsm"] <= 1 and r["ci"][0] <= r["ci"][1] for r in raw["table"])
    assert raw["select"]["pick"] in names and raw["select"]["per_indicator"], raw["select"]
    assert set(raw["proxy_scores"]) == set(names)
    for expert in ("math", "language"):
        assert len(raw["attribution"][expert]) == depth + 1  # each layer, then the non-layer
    assert "with one block from" in run.stdout  # --per-layer's table
