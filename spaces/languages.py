"""The languages layerswap knows: one table for every spelling of a language.

An experiment, a data source and an expert registry may each write one language differently
(`sw`, `swh`, `swa`, `swh_Latn`, `Swahili`). Training data (trainables/train/sft_records.py), the
indicator tasks (spaces/sweep.py), the check that an experiment's `language` agrees with its
data (spaces/train_experiment.py) and the search's choice of language experts (search/pool.py)
all read this table, so a spelling one accepts the others accept too. The embedded world's
languages (`en`, `xa`, `xb`) are known by their codes. Run its tests:
.venv/bin/python -m pytest -q tests/spaces/test_languages.py
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Language:
    code: str  # ISO 639-3, what SFT records carry (Swahili: `swh`, NLLB's individual language)
    name: str  # English name, as Aya's `language` column spells it
    nllb: str  # NLLB/FLORES code, Belebele's too (`swh_Latn`)
    gmmlu: str  # Global-MMLU's code
    aliases: tuple[str, ...] = ()  # other spellings (ISO 639-1, the macro-language, ...)

    @property
    def spellings(self) -> frozenset[str]:
        """Every lower-case spelling that names this language."""
        return frozenset({self.code, self.name.lower(), self.nllb.lower(), *self.aliases})


LANGUAGES: dict[str, Language] = {
    lang.code: lang
    for lang in (
        Language("eng", "English", "eng_Latn", "en", ("en",)),
        Language("swh", "Swahili", "swh_Latn", "sw", ("sw", "swa")),
        Language("ben", "Bengali", "ben_Beng", "bn", ("bn",)),
        Language("tel", "Telugu", "tel_Telu", "te", ("te",)),
        Language("jpn", "Japanese", "jpn_Jpan", "ja", ("ja",)),
        Language("deu", "German", "deu_Latn", "de", ("de",)),
        Language("fra", "French", "fra_Latn", "fr", ("fr",)),
        Language("spa", "Spanish", "spa_Latn", "es", ("es",)),
        Language("rus", "Russian", "rus_Cyrl", "ru", ("ru",)),
        Language("zho", "Chinese", "zho_Hans", "zh", ("zh",)),
    )
}
WORLD_LANGUAGES = frozenset({"en", "xa", "xb"})  # the embedded world's (English is also real)


def find_language(code: str) -> Language | None:
    """The known language `code` spells (any spelling, any case), or None."""
    key = code.strip().lower()
    return next((lang for lang in LANGUAGES.values() if key in lang.spellings), None)


def language_key(code: str) -> str | None:
    """One value per language, whatever the spelling (the ISO 639-3 code; a world language's
    own code), or None for a code this table does not know."""
    key = code.strip().lower()
    if (lang := find_language(key)) is not None:
        return lang.code
    return key if key in WORLD_LANGUAGES else None


def same_language(a: str, b: str) -> bool:
    """Whether two codes name one language: two spellings of a known language, or the same
    unknown code (case aside).

    Args:
        a, b: language codes as experiments, sources and registries write them.
    """
    ka, kb = language_key(a), language_key(b)
    if ka is not None or kb is not None:
        return ka == kb
    return a.strip().lower() == b.strip().lower()
