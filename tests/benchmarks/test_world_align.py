"""benchmarks/world_align.py on the tiny world: the gradients it compares are the data's own.

Run `.venv/bin/python -m pytest tests/benchmarks/test_world_align.py -q`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import world_align

from layerswap.world.build import world_config_of
from layerswap.world.data import AYA_KINDS, world_languages
from layerswap.world.sft import load_base, read_rows


def _row_values(out: str, name: str) -> list[float]:
    line = next(line for line in out.splitlines() if line.startswith(name))
    return [float(v) for v in line[len(name) :].split()]


def test_a_file_of_the_reading_examples_matches_the_target_in_every_block(tiny_world, tmp_path, capsys):  # fmt: skip
    # the same examples, written as an Aya JSONL, shuffled and batched differently: the same
    # mean gradient, so cosine 1 in every block; anything else means the file or loss is wrong
    examples = world_align.reading_examples(world_config_of(tiny_world), "xa", 24, seed=0)
    path = tmp_path / "same.jsonl"
    path.write_text("".join(json.dumps({"inputs": p, "targets": r}) + "\n" for p, r in examples))
    assert world_align.main(["--world", str(tiny_world), "--examples", "24", str(path)]) == 0
    out = capsys.readouterr().out
    model, _ = load_base(tiny_world)
    same = _row_values(out, str(path))
    assert len(same) == model.config.num_hidden_layers + 1  # the layers, then emb/head
    assert all(v > 0.99 for v in same), same
    other = _row_values(out, "math_en")
    assert min(other) < 0.99  # other data has another gradient


def test_block_gradients_put_each_layer_in_its_block_and_ignore_batching(tiny_world):
    model, tok = load_base(tiny_world)
    examples = world_align.reading_examples(world_config_of(tiny_world), "xa", 10, seed=0)
    one = world_align.block_gradients(model, tok, examples, batch_size=32)
    small = world_align.block_gradients(model, tok, examples, batch_size=3)  # 4 uneven batches
    assert list(one) == [f"L{i:02d}" for i in range(model.config.num_hidden_layers)] + ["emb/head"]
    for block in one:  # the mean over all response tokens, however they are batched
        assert torch.allclose(one[block], small[block], atol=1e-6, rtol=1e-4), block
    for i in range(model.config.num_hidden_layers):
        size = sum(p.numel() for k, p in model.named_parameters() if f"layers.{i}." in k)
        assert one[f"L{i:02d}"].numel() == size
    assert sum(g.numel() for g in one.values()) == sum(p.numel() for p in model.parameters())


def test_aya_kinds_name_the_rows_they_index(tiny_world):
    # world_align --by-kind splits lang_xa by AYA_KINDS[i % 8]; each kind has its own prompt
    xa = world_languages(world_config_of(tiny_world))["xa"]
    w = xa.w
    marks = {
        "translate into": lambda q: (
            q.split("\n")[0] == f"{w('translate').capitalize()} {w('to')} Xa:"
        ),
        "translate into English": lambda q: q.split("\n")[0].endswith(f"{w('english')}:"),
        "passage question": lambda q: f"\n{w('question').capitalize()}: " in q,
        "reverse": lambda q: q.startswith(w("reverse").capitalize()),
        "plural": lambda q: q.startswith(w("plural").capitalize()),
        "continue": lambda q: q.startswith(w("continue").capitalize() + ":"),
        "multiple choice": lambda q: q.startswith("P: ") and "\nD: " in q,
    }
    rows = read_rows(tiny_world, "data/sft/lang_xa.jsonl")
    assert len(rows) >= 2 * len(AYA_KINDS)
    for i, row in enumerate(rows):
        assert marks[AYA_KINDS[i % len(AYA_KINDS)]](row["inputs"]), (i, row["inputs"])


@pytest.mark.parametrize(
    "argv", [["--examples", "0"], ["--world", "/nonexistent/world"], ["/nonexistent/data.jsonl"]]
)
def test_bad_arguments_exit_naming_them(tiny_world, argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        world_align.main(["--world", str(tiny_world), *argv])
    assert exit_.value.code != 0
    assert argv[-1] in capsys.readouterr().err


def test_runs_as_a_user_runs_it_with_relative_paths(tiny_world, tmp_path, run_bench):
    examples = world_align.reading_examples(world_config_of(tiny_world), "xa", 4, seed=0)
    data = tmp_path / "same.jsonl"
    data.write_text("".join(json.dumps({"inputs": p, "targets": r}) + "\n" for p, r in examples))
    run = run_bench("world_align.py", "--world", "world", "--examples", "4", "--by-kind", "data/same.jsonl", links={"world": tiny_world, "data/same.jsonl": data})  # fmt: skip
    blocks = len(run.stdout.splitlines()[1].split())  # the header: one column per block
    for name in ("[en reading]", "math_en", "lang_xa", "lang_xa: reverse", "data/same.jsonl"):
        values = _row_values(run.stdout, name)
        assert len(values) == blocks and all(-1 <= v <= 1 for v in values), run.tail()
