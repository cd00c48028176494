"""benchmarks/world_tasks.py on the tiny world: the candidate language tasks read as they claim.

Run `.venv/bin/python -m pytest tests/benchmarks/test_world_tasks.py -q`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import world_tasks

from spaces.world import WorldConfig
from world.data import world_languages
from world.sft import read_rows


@pytest.fixture(scope="module")
def tasks(tiny_world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tasks") / "tasks"
    assert world_tasks.main(["--world", str(tiny_world), "--out", str(out), "--rows", "60"]) == 0
    return out


def _xa(world: Path):
    return world_languages(WorldConfig(**json.loads((world / "world.json").read_text())["config"]))["xa"]  # fmt: skip


def test_every_task_is_a_jsonl_of_aya_rows(tasks):
    names = {p.name for p in tasks.iterdir()}
    assert names == {f"{t}.jsonl" for t in ("count_number", "count_sentence", "problem_translation", "number", "word")}  # fmt: skip
    for path in tasks.iterdir():
        rows = read_rows(tasks, path.name)
        assert len(rows) == 60 and all(set(r) == {"inputs", "targets", "language"} for r in rows)


def test_count_number_answers_a_number_its_passage_states(tasks, tiny_world):
    xa = _xa(tiny_world)
    for r in read_rows(tasks, "count_number.jsonl"):
        passage = r["inputs"].split("\n")[0]
        assert r["targets"].isdigit() and xa.numeral(int(r["targets"])) in passage


def test_no_translated_problem_is_an_mgsm_dev_or_test_problem(tasks, tiny_world):
    held = {r["question"] for s in ("dev", "test") for r in read_rows(tiny_world, f"data/mgsm/en/{s}.jsonl")}  # fmt: skip
    targets = [r["targets"] for r in read_rows(tasks, "problem_translation.jsonl")]
    assert targets and not held & set(targets)


def test_same_world_same_rows_and_an_existing_out_is_left_alone(tasks, tiny_world, tmp_path):
    again = tmp_path / "again"
    world_tasks.main(["--world", str(tiny_world), "--out", str(again), "--rows", "60"])
    assert all((again / p.name).read_bytes() == p.read_bytes() for p in tasks.iterdir())
    before = {p.name: p.read_bytes() for p in again.iterdir()}
    with pytest.raises(SystemExit):
        world_tasks.main(["--world", str(tiny_world), "--out", str(again), "--rows", "5"])
    assert {p.name: p.read_bytes() for p in again.iterdir()} == before
