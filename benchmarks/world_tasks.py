"""Candidate xa language-SFT tasks for a built world, one Aya-schema JSONL per task.

Run `.venv/bin/python benchmarks/world_tasks.py --world runs/world --out runs/tasks [--rows 4000]`,
then `benchmarks/world_align.py --world runs/world runs/tasks/*.jsonl` (seconds) or
`benchmarks/world_probe.py --world runs/world --lang-data runs/tasks/count_number.jsonl` (minutes).
None has arithmetic; each is about reading xa text, in a different output format:

- count_number: two or three sentences about one person's counts of one thing (has, buys,
  loses), a "how many ... does X <verb>?" question, answered by the number in digits;
- count_sentence: the same, answered by the English sentence that states it;
- count_answer: count_number's very rows, answered as MGSM's answers end ("The answer is 7."),
  so the language data shares the answer sentence of the math expert's format (not its equation);
- count_digits: the same sentences without a question, answered by themselves with every number
  in Arabic digits (transcribing xa numbers in place; the answer keeps xa's words); only for
  worlds with `digit_words: true`, since otherwise xa already writes numbers in digits;
- problem_number: an xa word problem (never one of MGSM's) without its question, asked "how
  many ... does X <verb>?" of one of its own clauses (has, buys, loses, gives, shares), answered
  by that clause's number in digits: reading which number goes with which verb and person in
  the very sentences MGSM asks about, with no arithmetic;
- problem_sentence: the same, answered by the English sentence of that clause (the answer is
  English, as the math expert's worked answers are);
- problem_translation: an xa word problem (never one of MGSM's dev or test problems) translated
  into English, without its solution;
- number: an xa number written in digits;
- word: one xa word (a verb of the word problems, a noun) translated into English.

Deterministic by the world's seed and --rows. A tool for designing the world (issue 15). Smoke
run (tests/benchmarks/test_world_tasks.py): `--world TINY_WORLD --out DIR --rows 5`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# the word problems' verbs as English writes them after a name
VERBS = {"have": "has", "buy": "buys", "lose": "loses", "give": "gives", "get": "gets", "share": "shares"}  # fmt: skip


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=Path, required=True, help="a built world folder")
    p.add_argument("--out", type=Path, required=True, help="a new folder for the JSONL files")
    p.add_argument("--rows", type=int, default=4000, help="rows per task (default 4000)")
    args = p.parse_args(argv)
    if args.out.exists():
        p.error(f"--out {args.out} exists; name a new folder")
    if not (args.world / "world.json").is_file():
        p.error(
            f"--world {args.world}: no world.json there (build one with `layerswap world build`)"
        )
    if args.rows < 1:
        p.error(f"--rows {args.rows}: give at least 1")
    return args


def count_question(r: random.Random, xa, max_n: int, answer: Callable) -> Callable[[], tuple[str, str]]:  # fmt: skip
    """count_number / count_sentence / count_answer: count facts in xa and a "how many ..."
    question about one of them, answered by `answer(fact, count)`."""
    from layerswap.world.items import ask_about, count_facts

    def make() -> tuple[str, str]:
        facts = count_facts(r, max_n)
        fact = facts[r.randrange(len(facts))]
        return ask_about(xa, facts, fact), answer(fact, fact.objs[0].num)

    return make


def problem_question(r: random.Random, xa, fresh_problem: Callable, answer: Callable) -> Callable[[], tuple[str, str]]:  # fmt: skip
    """problem_number / problem_sentence: a word problem's clauses in xa (`fresh_problem(r)`, none
    of MGSM's) and a "how many ..." question about one clause that has a number, answered by
    `answer(clause)`."""
    from layerswap.world.items import ask_about

    def make() -> tuple[str, str]:
        while True:
            p = fresh_problem(r)
            counted = [c for c in p.clauses if c.objs and isinstance(c.objs[0].num, int)]
            if counted:
                break
        fact = r.choice(counted)
        return ask_about(xa, p.clauses, fact), answer(fact)

    return make


def count_digits(r: random.Random, xa, max_n: int) -> Callable[[], tuple[str, str]]:
    """count_digits: count facts in xa, answered by themselves with the numbers in 0-9."""
    from layerswap.world.items import count_facts
    from layerswap.world.lang import render

    in_digits = dataclasses.replace(xa, digit_words=False)  # the same xa, numbers as 0-9

    def make() -> tuple[str, str]:
        facts = count_facts(r, max_n)
        return " ".join(render(c, xa) for c in facts), " ".join(render(c, in_digits) for c in facts)  # fmt: skip

    return make


def task_makers(world: Path) -> dict[str, Callable[[], tuple[str, str]]]:
    """{task: a function returning one (inputs, targets) pair}, drawing from one seeded stream
    per task (count_answer a fresh copy of count_number's), so a task's rows do not depend on
    which other tasks are made."""
    from layerswap.world.build import world_config_of
    from layerswap.world.data import world_languages
    from layerswap.world.items import make_problem
    from layerswap.world.lang import NOUNS, TVERBS, render
    from layerswap.world.sft import read_rows

    cfg = world_config_of(world)
    xa = world_languages(cfg)["xa"]
    w = xa.w
    translate = f"{w('translate').capitalize()} {w('to')} {w('english')}"
    held_out = {r["question"] for split in ("dev", "test") for r in read_rows(world, f"data/mgsm/en/{split}.jsonl")}  # fmt: skip

    def rng(task: str) -> random.Random:
        return random.Random(f"{cfg.seed}-world-tasks-{task}")

    def fresh_problem(r: random.Random):
        """A word problem that is none of MGSM's dev or test problems."""
        while True:
            p = make_problem(r, cfg.max_operand, cfg.verb_only_operations)
            if p.text(None) not in held_out:
                return p

    def problem(r: random.Random) -> Callable[[], tuple[str, str]]:
        def make() -> tuple[str, str]:
            p = fresh_problem(r)
            return f"{translate}:\n{p.text(xa)}", p.text(None)

        return make

    def number(r: random.Random) -> Callable[[], tuple[str, str]]:
        def make() -> tuple[str, str]:
            n = r.randint(1, cfg.max_operand)
            return f"{translate}: {xa.numeral(n)}", str(n)

        return make

    def word(r: random.Random) -> Callable[[], tuple[str, str]]:
        english = {**VERBS, **TVERBS, **{n: n for n in NOUNS}}

        def make() -> tuple[str, str]:
            concept = r.choice(sorted(english))
            return f"{w('translate').capitalize()} {w('word')} {w('to')} {w('english')}: {w(concept)}", english[concept]  # fmt: skip

        return make

    makers = {
        "count_number": count_question(
            rng("count_number"), xa, cfg.max_operand, lambda fact, n: str(n)
        ),
        "count_sentence": count_question(
            rng("count_sentence"), xa, cfg.max_operand, lambda fact, n: render(fact, None)
        ),
        # count_number's own stream: the same rows, only the answer's form differs
        "count_answer": count_question(
            rng("count_number"), xa, cfg.max_operand, lambda fact, n: f"The answer is {n}."
        ),
        "problem_translation": problem(rng("problem_translation")),
        "problem_number": problem_question(
            rng("problem_number"), xa, fresh_problem, lambda fact: str(fact.objs[0].num)
        ),
        # problem_number's own stream: the same rows, answered in English
        "problem_sentence": problem_question(
            rng("problem_number"), xa, fresh_problem, lambda fact: render(fact, None)
        ),
        "number": number(rng("number")),
        "word": word(rng("word")),
    }
    if xa.digit_words:  # elsewhere xa already writes 0-9 and the answers would be the inputs
        makers["count_digits"] = count_digits(rng("count_digits"), xa, cfg.max_operand)
    return makers


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from layerswap.trainables.atomic import atomic_dir

    with atomic_dir(args.out) as tmp:  # all files or none
        for task, make in task_makers(args.world).items():
            rows = [dict(zip(("inputs", "targets"), make(), strict=True), language="Xa") for _ in range(args.rows)]  # fmt: skip
            (tmp / f"{task}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))  # fmt: skip
            print(f"{task}: {rows[0]}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
