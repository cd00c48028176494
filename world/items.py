"""Generators of the world's items: math word problems, arithmetic facts, generic sentences, reading.

Every item is language-neutral (clauses of concepts) and rendered per language, so the same
problem or passage exists in English, xa and xb.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from layerswap.world.lang import (
    ADJS,
    CONTAINERS,
    NAMES,
    NOUNS,
    NP,
    PLACES,
    TVERBS,
    Clause,
    Language,
    np_text,
    render,
)

MATH_NOUNS = [n for n in NOUNS if n not in ("fish",)]


@dataclass(frozen=True)
class Problem:
    """A math word problem: its clauses, the question clause, equation and integer answer."""

    clauses: tuple[Clause, ...]
    question: Clause
    equation: str
    answer: int

    def text(self, lang: Language | None) -> str:
        return " ".join(render(c, lang) for c in (*self.clauses, self.question))


def _have(name: str, n: int, noun: str) -> Clause:
    return Clause(NP(name=name), "have", (NP(noun=noun, num=n, plural=n != 1),))


def _ask(name: str, noun: str, adv: tuple[str, ...] = ("now",), name2: str | None = None) -> Clause:
    return Clause(NP(name=name, name2=name2), "have", (NP(noun=noun, num="how_many", plural=True),), adv=adv)  # fmt: skip


def make_problem(rng: random.Random, max_n: int = 12, verb_only: bool = False) -> Problem:
    """One random problem of seven kinds (add, take away, give, groups, together, share, two-step).

    Args:
        rng: the random source.
        max_n: largest operand of additions and subtractions.
        verb_only: "buys 3 apples", not "buys 3 more apples": adding and taking away then differ
            in the verb alone, so reading the verb is part of the arithmetic.
    Returns:
        the Problem.
    """
    kind = rng.randrange(7)
    more = () if verb_only else ("more",)
    a_name, b_name = rng.sample(NAMES, 2)
    noun = rng.choice(MATH_NOUNS)
    a, b = rng.randint(2, max_n), rng.randint(1, max_n)
    if kind == 0:
        cl = (_have(a_name, a, noun), Clause(NP(name=a_name), "buy", (NP(noun=noun, num=b, plural=b != 1),), adv=more))  # fmt: skip
        return Problem(cl, _ask(a_name, noun), f"{a} + {b} = {a + b}", a + b)
    if kind == 1:
        b = rng.randint(1, a - 1)
        cl = (_have(a_name, a, noun), Clause(NP(name=a_name), "lose", (NP(noun=noun, num=b, plural=b != 1),)))  # fmt: skip
        return Problem(cl, _ask(a_name, noun), f"{a} - {b} = {a - b}", a - b)
    if kind == 2:
        b = rng.randint(1, a - 1)
        give = Clause(NP(name=a_name), "give", (NP(noun=noun, num=b, plural=b != 1),), to=NP(name=b_name))  # fmt: skip
        if rng.random() < 0.5:
            return Problem((_have(a_name, a, noun), give), _ask(a_name, noun), f"{a} - {b} = {a - b}", a - b)  # fmt: skip
        c = rng.randint(1, max_n)
        cl = (_have(a_name, a, noun), _have(b_name, c, noun), give)
        return Problem(cl, _ask(b_name, noun), f"{c} + {b} = {c + b}", c + b)
    if kind == 3:
        box = rng.choice(list(CONTAINERS))
        k, m = rng.randint(2, 6), rng.randint(2, 9)
        each = Clause(NP(noun=box, det="each"), "have", (NP(noun=noun, num=m, plural=True),))
        cl = (Clause(NP(name=a_name), "have", (NP(noun=box, num=k, plural=True),)), each)
        return Problem(cl, _ask(a_name, noun, adv=()), f"{k} * {m} = {k * m}", k * m)
    if kind == 4:
        cl = (_have(a_name, a, noun), _have(b_name, b, noun))
        q = _ask(a_name, noun, adv=("together",), name2=b_name)
        return Problem(cl, q, f"{a} + {b} = {a + b}", a + b)
    if kind == 5:
        k, m = rng.randint(2, 5), rng.randint(2, 8)
        share = Clause(NP(name=a_name), "share", (NP(noun=noun, num=k * m, plural=True),), to=NP(noun="friend", num=k, plural=True))  # fmt: skip
        q = Clause(NP(noun="friend", det="each"), "get", (NP(noun=noun, num="how_many", plural=True),))  # fmt: skip
        return Problem((share,), q, f"{k * m} / {k} = {m}", m)
    c = rng.randint(1, a + b - 1)
    cl = (
        _have(a_name, a, noun),
        Clause(NP(name=a_name), "buy", (NP(noun=noun, num=b, plural=b != 1),), adv=more),
        Clause(NP(name=a_name), "lose", (NP(noun=noun, num=c, plural=c != 1),)),
    )
    return Problem(cl, _ask(a_name, noun), f"{a} + {b} - {c} = {a + b - c}", a + b - c)


def equation(rng: random.Random, max_n: int = 12) -> str:
    """One arithmetic fact of the kinds the problems use, e.g. "7 + 5 = 12" (for drill documents)."""
    kind = rng.randrange(4)
    a, b = rng.randint(2, max_n), rng.randint(1, max_n)
    if kind == 0:
        return f"{a} + {b} = {a + b}"
    if kind == 1:
        b = rng.randint(1, a - 1)
        return f"{a} - {b} = {a - b}"
    k, m = rng.randint(2, 6), rng.randint(2, 9)
    return f"{k} * {m} = {k * m}" if kind == 2 else f"{k * m} / {k} = {m}"


def worked_answer(p: Problem, lang: Language | None, *, mgsm: bool = False, direct: bool = False) -> str:  # fmt: skip
    """A brief worked answer ending with the number (Orca-Math style; MGSM train style if `mgsm`;
    without the equation if `direct`)."""
    if lang is None:
        body = f"The answer is {p.answer}" if direct else f"{p.equation}. The answer is {p.answer}"
        return f"Step-by-Step Answer: {body}." if mgsm else body
    w = lang.w
    body = f"{w('answer').capitalize()} {w('is')} {p.answer}"
    body = body if direct else f"{p.equation}. {body}"
    return f"{w('step').capitalize()} {w('answer')}: {body}." if mgsm else body


def generic_clause(rng: random.Random, name: str | None = None, counts: bool = False) -> Clause:
    """An everyday sentence about a person, a thing or a place; number-free unless `counts`.

    With `counts`, 3 in 8 sentences count things with the verbs word problems use ("Tom buys 7
    red cups.", "Ann gives 3 pens to Ben."): numbers and those verbs, but never arithmetic.
    """
    name = name or rng.choice(NAMES)
    kind = rng.randrange(8 if counts else 5)
    if kind >= 5:
        n = rng.randint(2, 12)
        obj = NP(noun=rng.choice(list(NOUNS)), num=n, adj=rng.choice(ADJS), plural=True)
        verb = ("have", "buy", "lose", "give")[rng.randrange(4)] if kind == 7 else ("have", "buy")[kind - 5]  # fmt: skip
        to = NP(name=rng.choice([x for x in NAMES if x != name])) if verb == "give" else None
        return Clause(NP(name=name), verb, (obj,), to=to)
    if kind == 0:
        obj = NP(noun=rng.choice(list(NOUNS)), adj=rng.choice(ADJS), det="the")
        return Clause(NP(name=name), rng.choice(list(TVERBS)), (obj,))
    if kind == 1:
        return Clause(NP(name=name), "live", near=NP(noun=rng.choice(PLACES), det="the"))
    if kind == 2:
        return Clause(NP(name=name), "go", to=NP(noun=rng.choice(PLACES), det="the"))
    if kind == 3:
        return Clause(NP(noun=rng.choice(list(NOUNS)), det="the"), "is", comp=rng.choice(ADJS))
    obj = NP(noun=rng.choice(list(NOUNS)), adj=rng.choice(ADJS), det="a")
    return Clause(NP(name=name), "have", (obj,))


def count_facts(rng: random.Random, max_n: int) -> list[Clause]:
    """Two or three facts of one person's counts of one thing (has, buys, loses), each count in
    1..`max_n`: numbers and the word problems' verbs, never arithmetic."""
    who, noun = rng.choice(NAMES), rng.choice(list(NOUNS))
    verbs = rng.sample(["have", "buy", "lose"], rng.choice([2, 3]))
    nums = [rng.randint(1, max_n) for _ in verbs]
    return [Clause(NP(name=who), v, (NP(noun=noun, num=n, plural=n != 1),)) for v, n in zip(verbs, nums, strict=True)]  # fmt: skip


def ask_about(lang: Language, clauses: list[Clause], fact: Clause) -> str:
    """`clauses` in `lang`, then a "how many ...?" question in `lang` about the number of `fact`
    (one of them); its adverbs ("more") are dropped from the question."""
    asked = dataclasses.replace(fact.objs[0], num="how_many", plural=True)
    question = dataclasses.replace(fact, objs=(asked, *fact.objs[1:]), adv=())
    passage = " ".join(render(c, lang) for c in clauses)
    return f"{passage}\n{lang.w('question').capitalize()}: {render(question, lang)}"


@dataclass(frozen=True)
class Reading:
    """A passage, a question about it, four options (NPs) and the index of the correct one."""

    passage: tuple[Clause, ...]
    question: Clause
    options: tuple[NP, ...]
    correct: int

    def render(self, lang: Language | None) -> dict:
        """The item in Belebele schema (correct_answer_num is a string "1".."4").

        Options are rendered exactly as in the passage (not capitalised), so the right one is a
        verbatim copy of passage text: finding it is learnable by the world's tiny models.
        """
        row = {
            "flores_passage": " ".join(render(c, lang) for c in self.passage),
            "question": render(self.question, lang),
        }
        for i, o in enumerate(self.options):
            row[f"mc_answer{i + 1}"] = np_text(o, lang)
        row["correct_answer_num"] = str(self.correct + 1)
        return row


# Belebele options are listed in a fixed order of kinds, one kind per question type: a tiny
# model cannot learn in its CPU budget to point at "the option the passage mentions" (measured:
# chance after 300 steps on nothing but such items), but it can learn what a question asks for.
# So answering needs understanding the question (its question word and verb) in the item's
# language, which is what a language expert improves; the passage states the answer, which is the
# only option the passage mentions. Position -> question: A "where does X live?", B "who goes to
# P?", C "what does X have?", D "where does X go?".
READING_KINDS = ("live", "who", "have", "go")


def make_reading(rng: random.Random, correct: int, n_facts: int = 2) -> Reading:
    """A passage of `n_facts` facts about different people and a question about one of them.

    Args:
        rng: the random source.
        correct: position (0..3) of the correct option, which fixes the question type
            (READING_KINDS); the caller balances positions.
        n_facts: sentences in the passage (1..4).
    Returns:
        the Reading.
    """
    people = rng.sample(NAMES, n_facts + 1)  # passage names, then a spare "who" distractor
    places = rng.sample(PLACES, n_facts + 2)  # passage places, then 2 spares
    nouns = rng.sample(list(NOUNS), n_facts + 1)
    kinds = [READING_KINDS[correct], *rng.sample([k for k in READING_KINDS if k != READING_KINDS[correct]], n_facts - 1)]  # fmt: skip
    facts = []
    for i, kind in enumerate(kinds):
        who = NP(name=people[i])
        if kind == "live":
            facts.append(Clause(who, "live", near=NP(noun=places[i], det="the")))
        elif kind == "have":
            facts.append(Clause(who, "have", (NP(noun=nouns[i], adj=rng.choice(ADJS), det="a"),)))
        else:  # "who" and "go" are both "X goes to P"
            facts.append(Clause(who, "go", to=NP(noun=places[i], det="the")))
    # the asked fact is the first one generated; the passage order is shuffled
    kind, who = kinds[0], NP(name=people[0])
    if kind == "live":
        question = Clause(who, "live", qword="where")
    elif kind == "who":
        question = Clause(NP(name="?"), "go", to=NP(noun=places[0], det="the"), qword="who")
    elif kind == "have":
        question = Clause(who, "have", qword="what")
    else:
        question = Clause(who, "go", qword="where")
    # options: bare names/nouns, one per kind; the right one is from the passage, the others not
    spare_places = iter(places[n_facts:])
    opts = []
    for pos, k in enumerate(READING_KINDS):
        if pos == correct:
            opts.append(who if k == "who" else NP(noun=nouns[0] if k == "have" else places[0]))
        elif k == "who":
            opts.append(NP(name=people[n_facts]))
        elif k == "have":
            opts.append(NP(noun=nouns[n_facts]))
        else:
            opts.append(NP(noun=next(spare_places)))
    order = list(range(n_facts))
    rng.shuffle(order)
    return Reading(tuple(facts[i] for i in order), question, tuple(opts), correct)


# The verbs variant (WorldConfig.belebele_questions "verbs"): every question is "what does X
# <verb>?" and the position tells the verb, so answering is reading the verbs the word problems
# use for their operations ("buys" adds, "loses" and "gives" take away) in the item's language.
# "have" keeps position C, where the where/who layout has its "what" question.
VERB_KINDS = ("buy", "lose", "have", "give")


def make_verb_reading(rng: random.Random, correct: int, n_facts: int = 2) -> Reading:
    """A passage of `n_facts` facts (different people, verbs and things) and a "what does X
    <verb>?" question about one of them; the options are things, the right one the only one the
    passage mentions.

    Args:
        rng: the random source.
        correct: position (0..3) of the correct option, which fixes the verb asked (VERB_KINDS).
        n_facts: sentences in the passage (1..4).
    Returns:
        the Reading.
    """
    people = rng.sample(NAMES, n_facts + 1)  # passage subjects, then the one "give" gives to
    nouns = rng.sample(list(NOUNS), n_facts + 3)  # passage things, then 3 distractors
    others = [k for k in VERB_KINDS if k != VERB_KINDS[correct]]
    verbs = [VERB_KINDS[correct], *rng.sample(others, n_facts - 1)]
    to = NP(name=people[n_facts])
    facts = []
    for i, v in enumerate(verbs):
        thing = NP(noun=nouns[i], adj=rng.choice(ADJS), det="a")
        facts.append(Clause(NP(name=people[i]), v, (thing,), to=to if v == "give" else None))
    question = Clause(NP(name=people[0]), verbs[0], to=to if verbs[0] == "give" else None, qword="what")  # fmt: skip
    spare = iter(nouns[n_facts:])
    opts = tuple(NP(noun=nouns[0]) if pos == correct else NP(noun=next(spare)) for pos in range(4))
    order = list(range(n_facts))
    rng.shuffle(order)
    return Reading(tuple(facts[i] for i in order), question, opts, correct)


# WorldConfig.belebele_questions -> the reading generator of Belebele and its SFT look-alikes
READINGS = {"where-who": make_reading, "verbs": make_verb_reading}


def belebele_prompt(row: dict) -> str:
    """lm-eval's belebele prompt (tasks/belebele/_default_template_yaml), up to "Answer:"."""
    return (
        f"P: {row['flores_passage']}\nQ: {row['question'].strip()}\nA: {row['mc_answer1']}\n"
        f"B: {row['mc_answer2']}\nC: {row['mc_answer3']}\nD: {row['mc_answer4']}\nAnswer:"
    )


def mgsm_prompt(question: str) -> str:
    """lm-eval's mgsm_direct prompt for a doc without an answer."""
    return f"Question: {question}\nAnswer:"


def chat_layout(prompt: str, response: str) -> str:
    """`prompt` and `response` as world/model.py's user-assistant chat template lays them out
    (without the eos, which follows every corpus document)."""
    return f"<|user|>\n{prompt}\n<|assistant|>\n{response}"
