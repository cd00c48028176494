"""A partial or simultaneous run says, before it trains, what each side of its partition trains
(and that embeddings, final norm and lm_head stay frozen under a named partition), which dataset
trains which side, and warns when the default dataset-order `sides` look swapped
(trainables/train/side_notes.py).

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_side_notes.py (~15 s: one
two-step run on the tiny world)
"""

from __future__ import annotations

import pickle

from safetensors.torch import load_file

from layerswap.spaces.train_experiment import (
    absolute_local_paths,
    parse_train_experiment,
    with_overrides,
)
from layerswap.trainables.train.loop import run_training
from layerswap.trainables.train.side_notes import side_notes
from tests.trainables.train.train_helpers import make_exp

# r5 of the paper red-team: the Swahili data listed first, `sides` left to its default.
SWAPPED = {
    "name": "sim",
    "base": "meta-llama/Llama-3.1-8B-Instruct",
    "kind": "math",
    "language": "swh",
    "datasets": [{"source": "aya", "language": "swh"}, {"source": "orca_math"}],
    "mode": {"type": "simultaneous", "partition": "C"},
    "hyper": {"lr": 1e-5, "batch_size": 8, "max_steps": 10, "seq_len": 128},
}


def _warnings(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.startswith("layerswap: warning:")]


def test_named_partition_lines_say_sides_and_frozen_non_layer():
    exp = parse_train_experiment(SWAPPED, "t")
    lines = side_notes(exp, 32)
    assert lines[0].startswith("layerswap: simultaneous training, partition C on 32 layers:")
    assert "the task side trains layers 6-29 (attention and MLP)" in lines[0]
    assert "the language side trains layers 0-5, 30-31 (attention and MLP)" in lines[0]
    assert "embeddings, final norm and lm_head stay frozen" in lines[0]
    mapping = "datasets[0] (aya:swh) -> task, datasets[1] (orca_math:) -> language"
    assert lines[1] == f"layerswap: data -> side: {mapping}"
    one = {"datasets": [{"source": "orca_math"}], "language": "en"}
    partial = parse_train_experiment(SWAPPED | one | {"mode": {"type": "partial", "partition": "A", "train": "task"}}, "t")  # fmt: skip
    first = side_notes(partial, 28)[0]
    assert "the task side trains MLP of layers 6-25" in first
    assert "frozen: the language side, attention of layers 0-27, MLP of layers 0-5, 26-27" in first
    assert "embeddings, final norm and lm_head stay frozen" in first
    own = with_overrides(exp, {"mode": {"type": "simultaneous", "partition": {"bottom": 2, "top": 1, "non_layer": "language"}}})  # fmt: skip
    assert "embeddings, final norm and lm_head train with the language side" in side_notes(own, 8)[0]  # fmt: skip


def test_swapped_default_sides_warn_explicit_sides_do_not():
    exp = parse_train_experiment(SWAPPED, "t")
    # the copies every run path makes (Ray workers, sweeps) keep `sides` a default
    for copy in (exp, absolute_local_paths(exp), with_overrides(exp, {"hyper.lr": 1e-4}), pickle.loads(pickle.dumps(exp))):  # fmt: skip
        (warning,) = _warnings(side_notes(copy, 32))
        assert "datasets[0] (aya:swh) looks like language data but trains the task side" in warning
        assert "datasets[1] (orca_math:) looks like task data but trains the language side" in warning  # fmt: skip
    chosen = parse_train_experiment(SWAPPED | {"mode": SWAPPED["mode"] | {"sides": ["task", "language"]}}, "t")  # fmt: skip
    assert _warnings(side_notes(absolute_local_paths(chosen), 32)) == []
    right = parse_train_experiment(SWAPPED | {"datasets": SWAPPED["datasets"][::-1]}, "t")
    assert _warnings(side_notes(right, 32)) == []


def test_run_says_the_lines_before_training_and_non_layer_stays_base(tiny_world, tmp_path):
    # the world's xa data first, default sides: the run warns, and with partition C-like EDGE
    # (no non_layer) embeddings and lm_head come out bit-identical to the base
    exp = make_exp(tiny_world, {"type": "simultaneous", "partition": {"bottom": 1, "top": 1}}, hyper={"max_steps": 2})  # fmt: skip
    exp = with_overrides(exp, {"datasets": [d.model_dump(mode="json", exclude_none=True) for d in exp.datasets[::-1]]})  # fmt: skip
    said: list[str] = []
    res = run_training(exp, workdir=tmp_path / "run", say=said.append)
    assert said[0].startswith("layerswap: simultaneous training, partition custom on 4 layers:")
    assert "lang_xa.jsonl) -> task" in said[1]
    assert "lang_xa.jsonl) looks like language data but trains the task side" in _warnings(said)[0]
    base = load_file(tiny_world / "base" / "model.safetensors")
    out = load_file(res.final_checkpoint / "model.safetensors")
    non_layer = [n for n in base if ".layers." not in n]
    assert non_layer and all((out[n] == base[n]).all() for n in non_layer)
    assert any(not (out[n] == base[n]).all() for n in base if ".layers." in n)
