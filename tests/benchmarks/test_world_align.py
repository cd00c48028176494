"""benchmarks/world_align.py on the tiny world: the gradients it compares are the data's own.

Run `.venv/bin/python -m pytest tests/benchmarks/test_world_align.py -q`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import world_align

from world.data import AYA_KINDS, world_languages
from world.sft import load_base, read_rows


def _row_values(out: str, name: str) -> list[float]:
    line = next(line for line in out.splitlines() if line.startswith(name))
    return [float(v) for v in line[len(name) :].split()]


def test_a_file_of_the_reading_examples_matches_the_target_in_every_block(tiny_world, tmp_path, capsys):  # fmt: skip
    # the same examples, written as an Aya JSONL, shuffled and batched differently: the same
    # mean gradient, so cosine 1 in every block; anything else means the file or loss is wrong
    examples = world_align.reading_examples(tiny_world, "xa", 24, seed=0)
    path = tmp_path / "same.jsonl"
    path.write_text("".join(json.dumps({"inputs": p, "targets": r}) + "\n" for p, r in examples))
    assert world_align.main(["--world", str(tiny_world), "--examples", "24", str(path)]) == 0
    out = capsys.readouterr().out
    model, _ = load_base(tiny_world)
    same = _row_values(out, "same.jsonl")
    assert len(same) == model.config.num_hidden_layers + 1  # the layers, then emb/head
    assert all(v > 0.99 for v in same), same
    other = _row_values(out, "math_en")
    assert min(other) < 0.99  # other data has another gradient


def test_block_gradients_cover_every_parameter_once(tiny_world):
    model, tok = load_base(tiny_world)
    grads = world_align.block_gradients(model, tok, [("Question: 1 + 1\nAnswer:", "2")])
    n_params = sum(p.numel() for p in model.parameters())
    assert sum(g.numel() for g in grads.values()) == n_params
    assert list(grads)[-1] == "emb/head" and next(iter(grads)) == "L00"


def test_aya_kinds_name_the_rows_they_index(tiny_world):
    # world_align --by-kind splits lang_xa by AYA_KINDS[i % 8]; a plural row asks for a plural
    cfg_seed = json.loads((tiny_world / "world.json").read_text())["config"]
    from spaces.world import WorldConfig

    xa = world_languages(WorldConfig(**cfg_seed))["xa"]
    rows = read_rows(tiny_world, "data/sft/lang_xa.jsonl")
    plural = AYA_KINDS.index("plural")
    picked = [r for i, r in enumerate(rows) if i % len(AYA_KINDS) == plural]
    assert picked and all(r["inputs"].startswith(xa.w("plural").capitalize()) for r in picked)
    into_english = AYA_KINDS.index("translate into English")
    assert all(
        r["inputs"].split("\n")[0].endswith(xa.w("english") + ":")
        for i, r in enumerate(rows)
        if i % len(AYA_KINDS) == into_english
    )


@pytest.mark.parametrize("argv", [["--examples", "0"], ["--world", "/nonexistent/world"]])
def test_bad_arguments_exit_naming_them(tiny_world, argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        world_align.main(["--world", str(tiny_world), *argv])
    assert exit_.value.code != 0
    assert argv[1] in capsys.readouterr().err
