"""The world's languages: an English concept lexicon, two invented languages, and a renderer.

Sentences are built as `Clause`s of concepts and rendered into English ("en", SVO), "xa"
(SOV, plural suffix, adjectives after nouns) or "xb" (VSO, plural prefix, articles).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

LANGS = ("en", "xa", "xb")
LANG_NAMES = {"en": "English", "xa": "Xa", "xb": "Xb"}

# noun -> English plural
NOUNS = {
    "apple": "apples", "book": "books", "pen": "pens", "cup": "cups", "egg": "eggs",
    "box": "boxes", "bag": "bags", "dog": "dogs", "cat": "cats", "bird": "birds",
    "tree": "trees", "ball": "balls", "shell": "shells", "coin": "coins", "card": "cards",
    "flower": "flowers", "cake": "cakes", "hat": "hats", "fish": "fish", "stone": "stones",
    "boat": "boats", "shoe": "shoes", "star": "stars", "key": "keys", "lamp": "lamps",
    "chair": "chairs", "bottle": "bottles", "orange": "oranges", "candle": "candles",
    "plate": "plates", "sticker": "stickers", "marble": "marbles", "cookie": "cookies",
    "kite": "kites", "toy": "toys", "shirt": "shirts", "seed": "seeds", "ribbon": "ribbons",
}  # fmt: skip
CONTAINERS = {"basket": "baskets", "crate": "crates", "jar": "jars", "pack": "packs", "shelf": "shelves"}  # fmt: skip
NAMES = ["Tom", "Ann", "Lina", "Omar", "Sara", "Ben", "Mia", "Ravi", "Yuki", "Nora", "Ivan", "Zoe", "Kofi", "Ada", "Leo", "Tara"]  # fmt: skip
ADJS = ["red", "big", "small", "old", "new", "green", "blue", "happy", "tall", "quiet", "white", "black"]  # fmt: skip
COLORS = ["red", "green", "blue", "white", "black"]
PLACES = ["market", "school", "garden", "river", "park", "village", "library", "farm", "beach", "hill"]  # fmt: skip
# transitive verb -> English 3rd person singular
TVERBS = {"see": "sees", "like": "likes", "find": "finds", "carry": "carries", "want": "wants", "clean": "cleans", "paint": "paints", "draw": "draws", "hold": "holds", "wash": "washes"}  # fmt: skip
# function concepts rendered by every language
FUNC = [
    "have", "buy", "lose", "give", "each", "share", "friend", "how_many", "now", "more",
    "together", "left", "answer", "step", "is", "the", "a", "and", "to", "live", "go", "where",
    "what", "who", "color", "near", "translate", "english", "reverse", "plural", "question",
    "passage", "continue", "so", "word", "sentence", "q", "get",
]  # fmt: skip

# digit words for `numerals: words` worlds: one word per digit (37 is "<3> <7>"), the way Bengali
# or Arabic-Indic digits stand for 0-9, so reading a number in xa is a lexical skill
NUMERALS = [f"n{i}" for i in range(10)]

ONSETS = ["k", "t", "m", "n", "r", "s", "l", "v", "z", "p", "d", "g", "b", "h", "sh", "ch"]
VOWELS = {"xa": ["a", "e", "i", "o", "u"], "xb": ["a", "o", "u", "y", "ei", "au"]}
CODAS = {"xa": ["", "", "", "n", "r"], "xb": ["", "k", "t", "m", "", ""]}


@dataclass
class Language:
    """An invented language: a word for every concept plus its grammar settings."""

    code: str
    words: dict[str, str]
    order: str  # "SOV", "VSO", or "SVO" (English word order, word for word: a relexification)
    plural_affix: str  # suffix for SOV/SVO languages, prefix for VSO ones
    digit_words: bool = False  # numbers as the language's own digit words (else 0-9)
    relex: dict[str, str] = field(default_factory=dict)  # SVO: English word -> this language's

    def w(self, concept: str) -> str:
        return self.words[concept]

    def numeral(self, n: int) -> str:
        """`n` as written in running text: 0-9 digits, or one digit word per digit."""
        if not self.digit_words:
            return str(n)
        if n < 0:
            raise ValueError(f"numeral: {n} is negative")
        return " ".join(self.w(f"n{d}") for d in str(n))

    def plural(self, concept: str) -> str:
        word = self.words[concept]
        return self.plural_affix + word if self.order == "VSO" else word + self.plural_affix


def _word(rng: random.Random, code: str, n_syll: int) -> str:
    return "".join(
        rng.choice(ONSETS) + rng.choice(VOWELS[code]) + rng.choice(CODAS[code])
        for _ in range(n_syll)
    )


def make_language(code: str, seed: int, digit_words: bool = False, order: str | None = None) -> Language:  # fmt: skip
    """Invent a language: a seeded syllable generator gives every concept a distinct word.

    Args:
        code: "xa" or "xb".
        seed: world seed (the language's own seed derives from it and the code).
        digit_words: write numbers with digit words of its own (drawn from a separate seed,
            so every other word is the same either way).
    Returns:
        the Language.
    """
    rng = random.Random(f"{seed}-lang-{code}")
    concepts = [*NOUNS, *CONTAINERS, *ADJS, *PLACES, *TVERBS, *FUNC]
    used: set[str] = set()
    words = {}
    for c in concepts:
        # function words short, content words longer: like natural languages
        n = 1 if c in FUNC else rng.choice((2, 2, 3))
        while True:
            word = _word(rng, code, n)
            if word not in used and len(word) > 1:
                break
            n += rng.random() < 0.2
        used.add(word)
        words[c] = word
    order = order or ("SOV" if code == "xa" else "VSO")
    lang = Language(code, words, order, _word(rng, code, 1), digit_words)
    extra = [*NUMERALS] if digit_words else []
    extra += ["many"] if order == "SVO" else []
    if extra:  # drawn after everything else, so the other words do not change
        drng = random.Random(f"{seed}-digits-{code}")
        for c in extra:
            word = _word(drng, code, drng.choice((1, 2)))
            while word in used or len(word) < 2:
                word = _word(drng, code, 2)
            used.add(word)
            words[c] = word
    if order == "SVO":
        lang.relex.update(_relex_table(lang))
    return lang


# English function words -> the concept rendering them (SVO languages, word for word)
EN_FUNC = {
    "how": "how_many", "many": "many", "does": "q", "do": "q", "the": "the", "a": "a", "an": "a",
    "and": "and", "to": "to", "among": "to", "near": "near", "more": "more", "now": "now",
    "together": "together", "left": "left", "each": "each", "who": "who", "where": "where",
    "what": "what", "is": "is", "are": "is", "be": "is",
}  # fmt: skip


def _relex_table(lang: Language) -> dict[str, str]:
    table = {k: lang.w(v) for k, v in EN_FUNC.items()}
    for noun, plural in {**NOUNS, **CONTAINERS, "friend": "friends"}.items():
        table[noun], table[plural] = lang.w(noun), lang.plural(noun)
    for word in (*ADJS, *PLACES):
        table[word] = lang.w(word)
    for concept, forms in EN_VERBS.items():
        for form in forms:
            table[form] = lang.w(concept)
    return table


def _relexify(text: str, lang: Language) -> str:
    """English text in `lang` word for word: names kept, numbers in the language's numerals."""

    def one(m: re.Match) -> str:
        word = m.group(0)
        if word.isdigit():
            return lang.numeral(int(word))
        if word in NAMES:
            return word
        out = lang.relex[word.lower()]
        return out.capitalize() if word[0].isupper() else out

    return re.sub(r"[A-Za-z]+|[0-9]+", one, text)


# English word forms of the concepts that carry a word problem's arithmetic (its operations and
# its question): what reading a problem needs beyond reading everyday text
MATH_WORDS = frozenset(
    "buy buys lose loses give gives share shares get gets each more together left how many".split()
)


def code_switch(text: str, lang: Language, rng: random.Random, share: float, keep: frozenset[str] = frozenset(), number_share: float | None = None, keep_share: float = 0.0) -> str:  # fmt: skip
    """English text with each word put in `lang` (an SVO language) with probability `share`.

    Args:
        text: English text.
        lang: an SVO Language (word-for-word relexification).
        rng: the random source.
        share: probability that a word is switched.
        keep: English word forms (lower case) switched at `keep_share` instead (0: they stay).
        number_share: probability that a number is put in the language's numerals (None:
            `share`, like any word).
        keep_share: probability that a word in `keep` is switched.
    Returns:
        the mixed text; names stay, numbers switch as words do.
    """
    if lang.order != "SVO":
        raise ValueError(f"code_switch: {lang.code} is {lang.order}; word-for-word needs SVO")

    def one(m: re.Match) -> str:
        word = m.group(0)
        # words outside the relexified vocabulary (the prompt's "Question", "Answer") stay
        if word.isdigit():
            p = share if number_share is None else number_share
            # no draw when numbers never switch: the other words' draws stay as they were
            if p == 0 or rng.random() >= p:
                return word
            return _relexify(word, lang)
        if word in NAMES or word.lower() not in lang.relex:
            return word
        if word.lower() in keep:
            # no draw for a kept word that never switches: the other words' draws stay as they were
            if keep_share == 0 or rng.random() >= keep_share:
                return word
        elif rng.random() >= share:
            return word
        return _relexify(word, lang)

    return re.sub(r"[A-Za-z]+|[0-9]+", one, text)


@dataclass(frozen=True)
class NP:
    """A noun phrase: a name, or a (number, adjective, noun) with plural and article flags."""

    name: str | None = None
    name2: str | None = None  # "name and name2"
    noun: str | None = None
    num: int | str | None = None  # an int, or "how_many" in questions
    adj: str | None = None
    plural: bool = False
    det: str | None = None  # "the" | "a" | None


@dataclass(frozen=True)
class Clause:
    """A clause: subject, verb concept, objects, an optional recipient/place and adverbs."""

    subj: NP
    verb: str
    objs: tuple[NP, ...] = ()
    to: NP | None = None  # recipient or destination, marked with "to"
    near: NP | None = None  # location, marked with "near"
    adv: tuple[str, ...] = ()  # "more", "now", "together", "left"
    qword: str | None = None  # "where" | "what" | "who" | None; "how_many" lives in an NP
    comp: str | None = None  # adjective complement of "is"


def np_text(np: NP, lang: Language | None) -> str:
    """Render a noun phrase; `lang=None` is English."""
    if np.name is not None:
        if np.name2 is not None:
            return f"{np.name} {lang.w('and') if lang else 'and'} {np.name2}"
        return np.name
    if lang is not None and lang.order == "SVO":
        return _relexify(np_text(np, None), lang)
    if lang is None:
        table = CONTAINERS if np.noun in CONTAINERS else NOUNS
        noun = table.get(np.noun, np.noun + "s") if np.plural else np.noun
        parts = []
        if np.num == "how_many":
            parts.append("how many")
        elif np.num is not None:
            parts.append(str(np.num))
        elif np.det == "a":
            parts.append("an" if (np.adj or noun)[0] in "aeiou" else "a")
        elif np.det in ("the", "each"):
            parts.append(np.det)
        if np.adj:
            parts.append(np.adj)
        parts.append(noun)
        return " ".join(parts)
    noun = lang.plural(np.noun) if np.plural else lang.w(np.noun)
    num = lang.w("how_many") if np.num == "how_many" else (lang.numeral(np.num) if np.num else None)
    if lang.order == "SOV":  # number first, adjective after the noun, no articles
        parts = [num, noun, lang.w(np.adj) if np.adj else None]
    else:  # article first, adjective before the noun
        art = lang.w(np.det) if np.det and num is None else None
        parts = [art, num, lang.w(np.adj) if np.adj else None, noun]
    if np.det == "each" and lang.order == "SOV":
        parts.append(lang.w("each"))
    return " ".join(p for p in parts if p)


def _cap(s: str) -> str:
    return s[0].upper() + s[1:] if s else s


# English verb forms: concept -> (3rd person singular, base)
EN_VERBS = {
    "have": ("has", "have"), "buy": ("buys", "buy"), "lose": ("loses", "lose"),
    "give": ("gives", "give"), "share": ("shares", "share"), "live": ("lives", "live"),
    "go": ("goes", "go"), "is": ("is", "be"), "get": ("gets", "get"),
    **{v: (s, v) for v, s in TVERBS.items()},
}  # fmt: skip


def _en_rest(c: Clause) -> list[str]:
    parts = []
    if c.comp:
        parts.append(c.comp)
    for i, o in enumerate(c.objs):
        if i:
            parts.append("and")
        text = np_text(o, None)
        if "more" in c.adv and o.num not in (None, "how_many"):
            text = text.replace(str(o.num), f"{o.num} more", 1)
        parts.append(text)
    if c.to is not None:
        parts += ["among" if c.verb == "share" else "to", np_text(c.to, None)]
    if c.near is not None:
        parts += ["near", np_text(c.near, None)]
    parts += [a for a in c.adv if a != "more"]
    return parts


def _en(c: Clause) -> str:
    third, base = EN_VERBS[c.verb]
    subj = np_text(c.subj, None)
    plural_subj = c.subj.name2 is not None or c.subj.plural
    how_many = next((o for o in c.objs if o.num == "how_many"), None)
    if how_many is not None or c.qword in ("where", "what"):
        rest = _en_rest(
            Clause(
                c.subj,
                c.verb,
                tuple(o for o in c.objs if o is not how_many),
                c.to,
                c.near,
                c.adv,
                None,
                c.comp,
            )
        )
        head = np_text(how_many, None) if how_many is not None else c.qword
        aux = "do" if plural_subj else "does"
        words = [head, aux, subj, base, *rest]
        return _cap(" ".join(words)) + "?"
    if c.qword == "who":
        return _cap(" ".join(["who", third, *_en_rest(c)])) + "?"
    verb = base if plural_subj and c.verb != "is" else ("are" if plural_subj else third)
    return _cap(" ".join([subj, verb, *_en_rest(c)])) + "."


def render(c: Clause, lang: Language | None) -> str:
    """Render a clause as a sentence in `lang` (None: English).

    Args:
        c: the clause.
        lang: an invented Language, or None for English.
    Returns:
        the sentence, with final "." or "?".
    """
    if lang is None:
        return _en(c)
    if lang.order == "SVO":
        return _relexify(_en(c), lang)
    w = lang.w
    question = c.qword is not None or any(o.num == "how_many" for o in c.objs)
    subj = w("who") if c.qword == "who" else np_text(c.subj, lang)
    objs: list[str] = []
    for i, o in enumerate(c.objs):
        if i:
            objs.append(w("and"))
        objs.append(np_text(o, lang))
    if c.qword == "what":
        objs = [w("what")]
    comp = [w(c.comp)] if c.comp else []
    advs = [w(a) for a in c.adv]
    if lang.order == "SOV":  # postpositions, verb last, question particle at the end
        to = [np_text(c.to, lang), w("to")] if c.to else []
        near = (
            [w("where")]
            if c.qword == "where"
            else ([np_text(c.near, lang), w("near")] if c.near else [])
        )
        words = [subj, *to, *near, *objs, *comp, *advs, w(c.verb)]
        if question:
            words.append(w("q"))
    else:  # question word first, verb, subject, objects, prepositions
        to = [w("to"), np_text(c.to, lang)] if c.to else []
        near = [w("near"), np_text(c.near, lang)] if c.near and c.qword != "where" else []
        lead = [w(c.qword)] if c.qword in ("where", "what") else []
        if c.qword == "what":
            objs = []
        words = [*lead, w(c.verb), subj, *objs, *comp, *to, *near, *advs]
    return _cap(" ".join(words)) + ("?" if question else ".")
