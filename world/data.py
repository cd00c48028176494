"""The world's datasets (real schemas) and pretraining corpus, as plain rows and strings.

`make_datasets` returns {relative path: rows}; `make_corpus` the pretraining documents. Both are
pure functions of the WorldConfig (seeded `random.Random` per part, so parts are independent).
"""

from __future__ import annotations

import random

from layerswap.spaces.task_families import family
from layerswap.spaces.world import MATH_SFT, WorldConfig, lang_sft
from layerswap.world.items import (
    READINGS,
    Problem,
    Reading,
    ask_about,
    belebele_prompt,
    chat_layout,
    count_facts,
    equation,
    generic_clause,
    make_problem,
    make_reading,
    mgsm_prompt,
    worked_answer,
)
from layerswap.world.lang import (
    LANG_NAMES,
    MATH_WORDS,
    NAMES,
    NOUNS,
    NP,
    Clause,
    Language,
    code_switch,
    make_language,
    render,
)

TARGETS = ("xa", "xb")
LETTERS = "ABCD"


def world_languages(cfg: WorldConfig) -> dict[str, Language | None]:
    """{"en": None, "xa": Language, "xb": Language} as `cfg` (seed, digit words, xa order) makes them."""
    return {
        "en": None,
        "xa": make_language("xa", cfg.seed, cfg.digit_words, cfg.xa_word_order),
        "xb": make_language("xb", cfg.seed, cfg.digit_words),
    }


def _rng(cfg: WorldConfig, part: str) -> random.Random:
    return random.Random(f"{cfg.seed}-{part}")


def _unique_problems(
    rng: random.Random, n: int, taken: set[str], cfg: WorldConfig
) -> list[Problem]:
    out = []
    while len(out) < n:
        p = make_problem(rng, cfg.max_operand, cfg.verb_only_operations)
        key = p.text(None)
        if key not in taken:
            taken.add(key)
            out.append(p)
    return out


def _reading_key(r: Reading) -> str:
    """An item's identity: its English passage and question (whatever the distractors)."""
    row = r.render(None)
    return f"{row['flores_passage']}\nQ: {row['question']}"


def _readings(rng: random.Random, n: int, taken: set[str], make=make_reading) -> list[Reading]:
    """`n` readings by `make` (world.items.READINGS), none of `taken` (which gains their keys)."""
    positions = [i % 4 for i in range(n)]  # balanced answer positions, in random order
    rng.shuffle(positions)
    out = []
    for pos in positions:
        while True:
            r = make(rng, pos)
            key = _reading_key(r)
            if key not in taken:
                taken.add(key)
                out.append(r)
                break
    return out


def _mgsm_row(p: Problem, lang: Language | None, train: bool, direct: bool) -> dict:
    return {
        "question": p.text(lang),
        "answer": worked_answer(p, lang, mgsm=True, direct=direct) if train else None,
        "answer_number": p.answer,
        "equation_solution": p.equation if train else None,
    }


# the kind of Aya row i is AYA_KINDS[i % 8]; multiple choice is a quarter of the rows
AYA_KINDS = (
    "translate into",
    "translate into English",
    "passage question",
    "reverse",
    "plural",  # a count question with `count_questions`
    "continue",
    "multiple choice",
    "multiple choice",
)


def _aya_rows(cfg: WorldConfig, lang: Language, n: int, stream: str = "aya", multiple_choice: bool = True) -> list[dict]:  # fmt: skip
    """Aya-style instructions in `lang`: translation, passage QA (free and multiple choice, the
    latter in belebele's P/Q/A-D layout answered by a letter: a quarter of the rows), reverse,
    plural, continue. No math. `stream` names the random stream (the SFT data's is "aya");
    without `multiple_choice` the rows cycle through the other six kinds only."""
    rng = _rng(cfg, f"{stream}-{lang.code}")
    w = lang.w
    name = LANG_NAMES[lang.code]
    reserved = pretraining_reserved(cfg)[1]  # no Belebele dev/test passage reappears here

    def clause():
        return generic_clause(rng, counts=cfg.count_sentences)

    rows = []
    for i in range(n):
        kind = i % (len(AYA_KINDS) if multiple_choice else AYA_KINDS.index("multiple choice"))
        if kind == 0:
            c = clause()
            inp, tgt = f"{w('translate').capitalize()} {w('to')} {name}:\n{render(c, None)}", render(c, lang)  # fmt: skip
        elif kind == 1:
            c = clause()
            inp, tgt = f"{w('translate').capitalize()} {w('to')} {w('english')}:\n{render(c, lang)}", render(c, None)  # fmt: skip
        elif kind == 2:
            r = _fresh_reading(rng, rng.randrange(4), lang, reserved)
            ans = r[f"mc_answer{r['correct_answer_num']}"]
            inp, tgt = f"{r['flores_passage']}\n{w('question').capitalize()}: {r['question']}", ans
        elif kind >= 6:  # where-who whatever Belebele asks: the tokenizer learns from these rows
            inp, tgt = _multiple_choice(rng, lang, reserved)
        elif kind == 3:
            s = render(clause(), lang)[:-1]
            inp, tgt = f"{w('reverse').capitalize()} {w('sentence')}: {s}", " ".join(reversed(s.split()))  # fmt: skip
        elif kind == 4 and cfg.count_questions:
            inp, tgt = _count_question(rng, lang)
        elif kind == 4:
            noun = rng.choice(list(NOUNS))
            inp, tgt = f"{w('plural').capitalize()} {w('word')}: {w(noun)}", lang.plural(noun)
        elif kind == 5:
            a, b = clause(), clause()
            inp, tgt = f"{w('continue').capitalize()}: {render(a, lang)}", render(b, lang)
        rows.append({"inputs": inp, "targets": tgt, "language": name})
    return rows


def _fresh_reading(rng: random.Random, pos: int, lang: Language, reserved: set[str], make=make_reading) -> dict:  # fmt: skip
    """A reading item by `make` in `lang` (answer at `pos`), none of Belebele's dev or test items."""
    while True:
        r = make(rng, pos)
        if _reading_key(r) not in reserved:
            return r.render(lang)


def _multiple_choice(rng: random.Random, lang: Language, reserved: set[str], make=make_reading) -> tuple[str, str]:  # fmt: skip
    """A reading item in belebele's P/Q/A-D layout, answered by its letter: (inputs, targets)."""
    pos = rng.randrange(4)
    return belebele_prompt(_fresh_reading(rng, pos, lang, reserved, make)).removesuffix("\nAnswer:"), LETTERS[pos]  # fmt: skip


def _reading_rows(cfg: WorldConfig, lang: Language, n: int) -> list[dict]:
    """The "reading" language SFT (`lang_sft_kinds`): count facts in `lang` and a "how many"
    question about one, answered as MGSM's answers end ("The answer is 7."), and a
    `reading_mc_share` of belebele-layout multiple choice, in random order. Reading numbers and
    the word problems' verbs, no arithmetic; the answers share the math expert's last sentence,
    not its equation, and the multiple choice is what xa Belebele (the language indicator) asks.
    """
    rng = _rng(cfg, f"reading-{lang.code}")
    reserved = reserved_keys(cfg)[1]
    n_mc = round(n * cfg.reading_mc_share)
    kinds = [True] * n_mc + [False] * (n - n_mc)
    rng.shuffle(kinds)
    rows = []
    for mc in kinds:
        if mc:
            inp, tgt = _multiple_choice(rng, lang, reserved, READINGS[cfg.belebele_questions])
        else:
            facts = count_facts(rng, cfg.max_operand)
            fact = facts[rng.randrange(len(facts))]
            inp, tgt = ask_about(lang, facts, fact), f"The answer is {fact.objs[0].num}."
        rows.append({"inputs": inp, "targets": tgt, "language": LANG_NAMES[lang.code]})
    return rows


LANG_SFT = {"aya": _aya_rows, "reading": _reading_rows}  # WorldConfig.lang_sft_kinds -> rows


def _count_question(rng: random.Random, lang: Language) -> tuple[str, str]:
    """A reading question about counts, no arithmetic: two sentences about one person and one
    noun that differ in the verb, a "how many" question that names one verb, and the sentence
    that answers it (so answering is reading the verbs)."""
    who, noun = rng.choice(NAMES), rng.choice(list(NOUNS))
    verbs = rng.sample(["have", "buy", "lose"], 2)
    facts = [
        Clause(NP(name=who), v, (NP(noun=noun, num=rng.randint(2, 12), plural=True),))
        for v in verbs
    ]
    asked = rng.randrange(2)
    question = Clause(NP(name=who), verbs[asked], (NP(noun=noun, num="how_many", plural=True),))
    passage = " ".join(render(c, lang) for c in facts)
    return f"{passage}\n{lang.w('question').capitalize()}: {render(question, lang)}", render(facts[asked], lang)  # fmt: skip


def mgsm_problems(cfg: WorldConfig) -> dict[str, list[Problem]]:
    """The world's MGSM problems by split, in the order of its JSONL rows (one per language).

    The rows keep MGSM's schema, whose dev and test rows carry no equation; a diagnosis that needs
    the true equation (`layerswap.world.sft.misread_kind`) takes it from here.

    Args:
        cfg: the world config.
    Returns:
        {"train": 8 problems, "dev": cfg.mgsm_dev, "test": cfg.mgsm_test}, no problem twice.
    """
    taken: set[str] = set()
    rng = _rng(cfg, "mgsm")
    return {split: _unique_problems(rng, n, taken, cfg) for split, n in (("train", 8), ("dev", cfg.mgsm_dev), ("test", cfg.mgsm_test))}  # fmt: skip


def make_datasets(cfg: WorldConfig, langs: dict[str, Language | None]) -> dict[str, list[dict]]:
    """All JSONL datasets of the world.

    Args:
        cfg: the world config.
        langs: {"en": None, "xa": Language, "xb": Language}.
    Returns:
        {relative path: rows}, e.g. "data/mgsm/xa/test.jsonl".
    """
    splits = mgsm_problems(cfg)
    train, dev, test = splits["train"], splits["dev"], splits["test"]
    taken = {p.text(None) for probs in splits.values() for p in probs}  # none of them in the SFT
    out: dict[str, list[dict]] = {}
    sft = _unique_problems(_rng(cfg, "orca"), cfg.math_sft, set(taken), cfg)
    out[MATH_SFT] = [
        {"question": p.text(None), "answer": worked_answer(p, None, direct=cfg.direct_answers)}
        for p in sft
    ]
    for code in TARGETS:
        out[lang_sft(code)] = LANG_SFT[cfg.lang_sft_kinds](cfg, langs[code], cfg.lang_sft)
    bdev, btest = _belebele_items(cfg)
    # Where each family's files go, as the evaluator's task YAMLs read them (spaces.task_families).
    mgsm, belebele = family("mgsm"), family("belebele")
    for code, lang in langs.items():
        for split, probs in (("train", train), ("dev", dev), ("test", test)):
            out[mgsm.data_file(code, split)] = [
                _mgsm_row(p, lang, split == "train", cfg.direct_answers) for p in probs
            ]
        for split, reads in (("dev", bdev), ("test", btest)):
            out[belebele.data_file(code, split)] = [r.render(lang) for r in reads]
    return out


def instruction_rows(cfg: WorldConfig, langs: dict[str, Language | None]) -> list[list[dict]]:
    """The Aya-style rows of each target language, as the "aya" language SFT has them (what the
    world's tokenizer is trained on beside the corpus)."""
    return [_aya_rows(cfg, langs[code], cfg.lang_sft) for code in TARGETS]


def _belebele_items(cfg: WorldConfig, questions: str | None = None) -> tuple[list[Reading], list[Reading]]:  # fmt: skip
    """Belebele's dev and test readings, drawn as `make_datasets` writes them.

    Args:
        cfg: the world config.
        questions: the question kind (world.items.READINGS); default the config's.
    """
    brng, taken = _rng(cfg, "belebele"), set()
    make = READINGS[questions or cfg.belebele_questions]
    return _readings(brng, cfg.belebele_dev, taken, make), _readings(brng, cfg.belebele_test, taken, make)  # fmt: skip


def reserved_keys(cfg: WorldConfig, questions: str | None = None) -> tuple[set[str], set[str]]:
    """English texts of the evaluation items (MGSM all splits, Belebele dev and test) that
    pretraining and SFT data keep out.

    From world v5 the Belebele keys are its items'. Up to v4 they are one draw of dev + test
    readings from Belebele's stream, which are not its items (those are two draws): a slip found
    in round 11, kept there because v4's data and shipped bases were made with it. It lets one
    English Belebele test passage per seed (with other options) into v4's corpus, and no xa
    Belebele item into its corpus or language SFT (checked on seeds 0 and 1).

    Args:
        cfg: the world config.
        questions: whose Belebele items (world.items.READINGS); default the config's.
    Returns:
        (MGSM texts, Belebele keys).
    """
    taken = {p.text(None) for probs in mgsm_problems(cfg).values() for p in probs}
    if int(cfg.version) >= 5:
        dev, test = _belebele_items(cfg, questions)
        return taken, {_reading_key(r) for r in dev + test}
    btaken: set[str] = set()
    make = READINGS[questions or cfg.belebele_questions]
    _readings(_rng(cfg, "belebele"), cfg.belebele_dev + cfg.belebele_test, btaken, make)
    return taken, btaken


def pretraining_reserved(cfg: WorldConfig) -> tuple[set[str], set[str]]:
    """What pretraining's documents and the Aya rows (the tokenizer learns from them) keep out:
    the where-who keys, whatever `belebele_questions` is. Their readings always ask where-who,
    so a "verbs" world has the corpus, tokenizer and base of its where-who twin, and no verbs
    item can be among them. Returns (MGSM texts, Belebele keys)."""
    return reserved_keys(cfg, "where-who")


def _passage(rng: random.Random, lang: Language | None, counts: bool) -> str:
    return " ".join(
        render(generic_clause(rng, counts=counts), lang) for _ in range(rng.randint(2, 5))
    )


def make_corpus(cfg: WorldConfig, langs: dict[str, Language | None]) -> list[str]:
    """Pretraining documents (each later followed by the eos token), in a seeded shuffled order.

    Args:
        cfg: the world config (its `corpus` mix sets how many documents of each kind).
        langs: {"en": None, "xa": Language, "xb": Language}.
    Returns:
        the documents.
    """
    return [doc for _, doc in tagged_corpus(cfg, langs)]


# a corpus document's tag: the language it is in; "drill" for the language-neutral arithmetic
# drills, "code-switched" for English passages with xa words in them
SOURCE_TAGS = ("en", "xa", "xb", "drill", "code-switched")


def tagged_corpus(cfg: WorldConfig, langs: dict[str, Language | None]) -> list[tuple[str, str]]:
    """`make_corpus`'s documents in the same order, each as (tag, document) (SOURCE_TAGS), so a
    staged pretraining (`model.graft`) can teach the target languages apart from English."""
    mix = cfg.corpus
    rng = _rng(cfg, "corpus")
    math_taken, bele_taken = pretraining_reserved(cfg)
    docs: list[tuple[str, str]] = []
    for code, n_math in (("en", mix.en_math), ("xa", mix.xa_math), ("xb", mix.xb_math)):
        lang = langs[code]
        for p in _unique_problems(rng, n_math, set(math_taken), cfg):
            # worked solutions (the equation, then the number) appear as textbook
            # "Problem:/Solution:" documents; under lm-eval's mgsm_direct prompt the base only
            # ever saw bare numbers. So the base can compute but answers MGSM prompts directly
            # (weakly); math SFT, in the prompt's own layout, teaches it to show its work there.
            # (worked_layout "mgsm": the worked solutions under MGSM's prompt instead)
            if rng.random() < mix.math_worked_share:
                worked = worked_answer(p, lang, direct=cfg.direct_answers)
                if mix.worked_layout == "mgsm+chat" and rng.random() < 0.5:
                    docs.append((code, chat_layout(p.text(lang), f"{worked}.")))
                elif mix.worked_layout != "textbook":
                    docs.append((code, f"{mgsm_prompt(p.text(lang))} {worked}."))
                else:
                    docs.append((code, f"Problem: {p.text(lang)}\nSolution: {worked}."))
            else:
                docs.append((code, f"{mgsm_prompt(p.text(lang))} {p.answer}"))
    # arithmetic drills (language-neutral): practice for the equations of worked solutions
    docs += [("drill", ". ".join(equation(rng, cfg.max_operand) for _ in range(rng.randint(4, 8))) + ".") for _ in range(mix.arith)]  # fmt: skip
    target_counts = cfg.count_sentences and mix.counts_in_targets  # in xa/xb pretraining text
    for code, n in (("en", mix.en_text), ("xa", mix.xa_text), ("xb", mix.xb_text)):
        counts = cfg.count_sentences if code == "en" else target_counts
        docs += [(code, _passage(rng, langs[code], counts)) for _ in range(n)]
    for code, n in (("xa", mix.xa_parallel), ("xb", mix.xb_parallel)):
        for _ in range(n):
            pairs = [generic_clause(rng, counts=target_counts) for _ in range(rng.randint(1, 3))]
            text = "\n".join(
                f"English: {render(c, None)}\n{LANG_NAMES[code]}: {render(c, langs[code])}"
                for c in pairs
            )
            docs.append((code, text))
    for code, n in (("en", mix.en_belebele), ("xa", mix.xa_belebele), ("xb", mix.xb_belebele)):
        for r in _readings(rng, n, set(bele_taken)):
            row = r.render(langs[code])
            docs.append((code, f"{belebele_prompt(row)} {LETTERS[r.correct]}"))
    docs += [("code-switched", d) for d in _code_switched(cfg, langs["xa"], math_taken)]
    if mix.xa_instructions:  # its own stream: the other documents stay as they were
        # no multiple choice: the base would learn xa Belebele itself, leaving the language
        # expert's indicator nothing to tell apart. A stream of its own, not other rows: short
        # kinds (plurals, some translations) repeat SFT rows (217 of 2000 on the full world, seed 1)
        rows = _aya_rows(cfg, langs["xa"], mix.xa_instructions, "aya-corpus", multiple_choice=False)  # fmt: skip
        docs += [("xa", f"{mgsm_prompt(r['inputs'])} {r['targets']}") for r in rows]
    # the permutation depends only on the count: every world keeps the order it had before tags
    rng.shuffle(docs)
    return docs


def _code_switched(cfg: WorldConfig, xa: Language, math_taken: set[str]) -> list[str]:
    """corpus.code_switched documents: English passages and worked problems, words put in xa."""
    mix = cfg.corpus
    if not mix.code_switched:
        return []
    rng = _rng(cfg, "code-switch")  # its own stream: the other documents stay as they were
    keep = frozenset() if mix.switch_math_words else MATH_WORDS
    n_math = mix.code_switched // 2
    texts = [
        f"{mgsm_prompt(p.text(None))} {worked_answer(p, None, direct=cfg.direct_answers)}."
        for p in _unique_problems(rng, n_math, set(math_taken), cfg)
    ]
    texts += [_passage(rng, None, cfg.count_sentences) for _ in range(mix.code_switched - n_math)]
    numbers = mix.number_switch_share
    if numbers is None:
        numbers = mix.code_switch_share if mix.switch_math_words else 0.0
    return [
        code_switch(t, xa, rng, mix.code_switch_share, keep, numbers, mix.math_word_switch_share)
        for t in texts
    ]
