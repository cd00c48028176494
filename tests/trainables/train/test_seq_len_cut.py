"""Rows longer than `hyper.seq_len` are counted and said: dropped (the prompt turn fills seq_len)
and truncated (the answer turn cut, its end-of-turn token lost) per dataset, in one printed line
each at the start of training and in the manifest (`n_dropped`, `n_truncated`). They were cut or
dropped silently, with only `n_dropped` recorded.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_seq_len_cut.py   (~5 s)
"""

from __future__ import annotations

import re

from transformers import AutoTokenizer

from layerswap.trainables.train import find_checkpoints, read_manifest, run_training
from layerswap.trainables.train.data import load_pairs
from tests.trainables.train.train_helpers import make_exp

NOTE = re.compile(
    r"^layerswap: data: datasets\[(\d)\] \((.+)\): (\d+) of (\d+) rows dropped \(the prompt "
    r"fills hyper\.seq_len 64\), (\d+) truncated \(the answer turn cut, its end-of-turn token "
    r"lost\)$"
)


def _lengths(tok, spec) -> list[tuple[int, int]]:
    """(prompt turn, whole chat) token counts per row, by the template's own tokenizing."""
    out = []
    for p, r in load_pairs(spec):
        user = [{"role": "user", "content": p}]
        head = tok.apply_chat_template(user, add_generation_prompt=True, return_dict=False)
        full = tok.apply_chat_template([*user, {"role": "assistant", "content": r}], return_dict=False)  # fmt: skip
        out.append((len(head), len(full)))
    return out


def test_cut_and_dropped_rows_are_printed_once_and_recorded(tiny_world, tmp_path, capsys):
    exp = make_exp(tiny_world, "mix", hyper={"seq_len": 64, "max_steps": 1})
    tok = AutoTokenizer.from_pretrained(tiny_world / "base")
    want = []
    for spec in exp.datasets:
        rows = _lengths(tok, spec)
        dropped = sum(h >= 64 for h, _ in rows)
        cut = sum(h < 64 < n for h, n in rows)
        want.append((dropped, len(rows), cut))
    assert all(d or c for d, _, c in want)  # the tiny world has both kinds at seq_len 64

    run_training(exp, workdir=tmp_path / "run")
    out = capsys.readouterr().out.splitlines()
    notes = [m for m in map(NOTE.match, out) if m]
    assert len(notes) == len([ln for ln in out if ln.startswith("layerswap: data:")]) == 2, out
    assert [(int(m[3]), int(m[4]), int(m[5])) for m in notes] == want
    assert [m[2] for m in notes] == [s.label for s in exp.datasets]
    data = read_manifest(find_checkpoints(tmp_path / "run")[-1])["data"]
    assert [(d["n_dropped"], d["n_dropped"] + d["n_train"] + d["n_val"], d["n_truncated"]) for d in data] == want  # fmt: skip


def test_nothing_is_said_when_every_row_fits(tiny_world, tmp_path, capsys):
    run_training(make_exp(tiny_world, hyper={"seq_len": 128, "max_steps": 1}), workdir=tmp_path / "r")  # fmt: skip
    assert "layerswap: data:" not in capsys.readouterr().out
    data = read_manifest(find_checkpoints(tmp_path / "r")[-1])["data"]
    assert [(d["n_dropped"], d["n_truncated"]) for d in data] == [(0, 0)]
