"""benchmarks/world_probe.py's arguments (the probe itself is minutes: run it by hand).

Run `.venv/bin/python -m pytest tests/benchmarks/test_world_probe.py -q`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import world_probe


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
    from world.sft import read_rows

    rows = read_rows(tiny_world, "data/mgsm/en/test.jsonl")
    equations = world_probe.true_equations(tiny_world, "test", rows)
    assert [int(e.rsplit("=", 1)[1]) for e in equations] == [r["answer_number"] for r in rows]
    swapped = [rows[1], rows[0], *rows[2:]]  # a world whose rows are not this code's draws
    with pytest.raises(ValueError, match="not the MGSM this code draws"):
        world_probe.true_equations(tiny_world, "test", swapped)
