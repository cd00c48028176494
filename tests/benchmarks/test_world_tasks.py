"""benchmarks/world_tasks.py on the tiny world: the candidate language tasks read as they claim.

Run `.venv/bin/python -m pytest tests/benchmarks/test_world_tasks.py -q`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import world_tasks

from layerswap.world.build import world_config_of
from layerswap.world.data import world_languages
from layerswap.world.sft import read_rows


@pytest.fixture(scope="module")
def tasks(tiny_world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tasks") / "tasks"
    assert world_tasks.main(["--world", str(tiny_world), "--out", str(out), "--rows", "60"]) == 0
    return out


def _xa(world: Path):
    return world_languages(world_config_of(world))["xa"]


def test_every_task_is_a_jsonl_of_aya_rows(tasks, tiny_world):
    names = {p.name for p in tasks.iterdir()}
    assert not _xa(tiny_world).digit_words  # count_digits is only made where xa has digit words
    assert names == {f"{t}.jsonl" for t in ("count_number", "count_sentence", "count_answer", "problem_translation", "problem_number", "problem_sentence", "number", "word")}  # fmt: skip
    for path in tasks.iterdir():
        rows = read_rows(tasks, path.name)
        assert len(rows) == 60 and all(set(r) == {"inputs", "targets", "language"} for r in rows)


def test_count_number_answers_the_number_of_the_asked_verb(tasks, tiny_world):
    xa = _xa(tiny_world)
    verbs = {xa.w(v) for v in ("have", "buy", "lose")}
    digit_words = {xa.w(f"n{d}") for d in range(10)} if xa.digit_words else set()
    for r in read_rows(tasks, "count_number.jsonl"):
        passage, question = r["inputs"].split("\n")
        (asked,) = verbs & set(question.rstrip("?").split())
        (fact,) = [s for s in passage.split(". ") if asked in s.rstrip(".").split()]
        assert xa.numeral(int(r["targets"])).split() == [
            t for t in fact.rstrip(".").split() if t.isdigit() or t in digit_words
        ]


def test_count_answer_is_count_number_in_mgsms_answer_sentence(tasks):
    numbers, answers = (read_rows(tasks, f"{t}.jsonl") for t in ("count_number", "count_answer"))
    assert [r["inputs"] for r in answers] == [r["inputs"] for r in numbers]
    assert [r["targets"] for r in answers] == [f"The answer is {r['targets']}." for r in numbers]


def test_problem_number_asks_one_clause_of_its_passage_and_answers_its_number(tasks, tiny_world):
    xa = _xa(tiny_world)
    numbers, sentences = (read_rows(tasks, f"{t}.jsonl") for t in ("problem_number", "problem_sentence"))  # fmt: skip
    assert [r["inputs"] for r in sentences] == [r["inputs"] for r in numbers]
    asked_verbs = set()
    for number, sentence in zip(numbers, sentences, strict=True):
        passage, question = number["inputs"].split("\n")
        assert question.startswith(f"{xa.w('question').capitalize()}: ") and question.endswith("?")
        # the answer is a number of the passage, and the English sentence states that number
        assert xa.numeral(int(number["targets"])) in passage.replace(".", " ").split()
        assert number["targets"] in sentence["targets"].split()
        asked_verbs |= {v for v in ("has", "buys", "loses", "gives", "shares") if v in sentence["targets"].split()}  # fmt: skip
    assert {"has", "gives"} <= asked_verbs  # the problems' verbs, not only count_number's


@pytest.fixture(scope="module", params=["SOV", "SVO"])
def digit_word_world(request, tmp_path_factory) -> Path:
    """A tiny world whose xa writes numbers in its own digit words (two pretraining steps), in
    both word orders: SVO xa is rendered by relexifying English, SOV by its own grammar."""
    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world import build_world

    fields = {"digit_words": True, "xa_word_order": request.param, "model": {"steps": 2}}
    cfg = with_overrides(world_config("tiny", 0), fields, "test")
    return build_world(tmp_path_factory.mktemp("digits") / "w", size="tiny", progress=False, config=cfg)  # fmt: skip


def test_count_digits_answers_its_own_sentences_with_digits_for_number_words(digit_word_world, tmp_path):  # fmt: skip
    world_tasks.main(["--world", str(digit_word_world), "--out", str(tmp_path / "t"), "--rows", "40"])  # fmt: skip
    xa = _xa(digit_word_world)
    assert xa.digit_words
    for r in read_rows(tmp_path / "t", "count_digits.jsonl"):
        numbers = [int(t) for t in r["targets"].replace(".", " ").split() if t.isdigit()]
        assert 2 <= len(numbers) <= 3 and not any(c.isdigit() for c in r["inputs"])
        # every number back in xa digit words gives the inputs, word for word
        back = " ".join(xa.numeral(int(t)) if t.isdigit() else t for t in r["targets"].replace(".", " .").split())  # fmt: skip
        assert back == r["inputs"].replace(".", " .")


def test_no_task_draws_an_mgsm_dev_or_test_problem(tiny_world, tmp_path, monkeypatch):
    # the generator is made to offer a held-out problem first to every task's stream: each
    # task must skip it
    import random

    from layerswap.world import items, lang

    held = {r["question"] for s in ("dev", "test") for r in read_rows(tiny_world, f"data/mgsm/en/{s}.jsonl")}  # fmt: skip
    cfg = world_config_of(tiny_world)
    real, rng = items.make_problem, random.Random(0)
    first = next(p for p in iter(lambda: real(rng, cfg.max_operand, cfg.verb_only_operations), None) if p.text(None) in held)  # fmt: skip
    streams: set[int] = set()

    def offer_held_first(r, *a):
        if id(r) in streams:
            return real(r, *a)
        streams.add(id(r))
        return first

    monkeypatch.setattr(items, "make_problem", offer_held_first)
    world_tasks.main(["--world", str(tiny_world), "--out", str(tmp_path / "t"), "--rows", "20"])
    assert len(streams) == 3  # problem_translation, problem_number, problem_sentence
    targets = [r["targets"] for r in read_rows(tmp_path / "t", "problem_translation.jsonl")]
    assert len(targets) == 20 and first.text(None) not in targets and not held & set(targets)
    first_passage = " ".join(lang.render(c, _xa(tiny_world)) for c in first.clauses)
    for task in ("problem_number", "problem_sentence"):
        passages = [r["inputs"].split("\n")[0] for r in read_rows(tmp_path / "t", f"{task}.jsonl")]
        assert len(passages) == 20 and first_passage not in passages


@pytest.mark.parametrize("argv", [["--rows", "0"], ["--world", "/nonexistent/world"]])
def test_bad_arguments_exit_naming_them_and_write_nothing(tiny_world, tmp_path, argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        world_tasks.main(["--world", str(tiny_world), "--out", str(tmp_path / "t"), *argv])
    assert exit_.value.code != 0 and argv[-1] in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_same_world_same_rows_and_an_existing_out_is_left_alone(tasks, tiny_world, tmp_path):
    again = tmp_path / "again"
    world_tasks.main(["--world", str(tiny_world), "--out", str(again), "--rows", "60"])
    assert all((again / p.name).read_bytes() == p.read_bytes() for p in tasks.iterdir())
    before = {p.name: p.read_bytes() for p in again.iterdir()}
    with pytest.raises(SystemExit):
        world_tasks.main(["--world", str(tiny_world), "--out", str(again), "--rows", "5"])
    assert {p.name: p.read_bytes() for p in again.iterdir()} == before


def test_runs_as_a_user_runs_it_with_relative_paths(tiny_world, run_bench):
    run = run_bench("world_tasks.py", "--world", "world", "--out", "tasks", "--rows", "5", links={"world": tiny_world})  # fmt: skip
    files = sorted((run.cwd / "tasks").iterdir())
    assert len(files) == 8 and "wrote tasks" in run.stdout, run.tail()
    for path in files:
        assert len(read_rows(path.parent, path.name)) == 5
