"""SFT records and what reads rows into them: the record format, the languages records carry,
the per-source row adapters, and `Source`, the description of one SFT source.

Pure functions and data, no file access: trainables/train/sources.py holds the table of sources
and `load_sft`, trainables/train/source_files.py opens their files. Tests:
.venv/bin/python -m pytest -q tests/trainables/train/test_sources.py
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from layerswap.spaces.languages import LANGUAGES, Language, find_language

Record = dict[str, str]
Row = Mapping[str, Any]
RECORD_KEYS = ("prompt", "response", "source", "language")


class DataSourceError(ValueError):
    """A data source cannot be read as asked: unknown name, missing column, empty filter."""


# ---------------------------------------------------------------------------------------------
# Languages. Records carry ISO 639-3 codes. Swahili is `swh` (the individual language), the code
# NLLB, FLORES and Belebele use (`swh_Latn`); sources that say `sw`/`swa` are mapped to it. The
# table is the project's one (spaces/languages.py): what an experiment may write, data reads.


def resolve_language(code: str) -> Language:
    """The `Language` for a code, alias, NLLB code or English name (case-insensitive).

    Raises:
        DataSourceError: the language is not one the project knows.
    """
    if (lang := find_language(code)) is None:
        raise DataSourceError(f"unknown language {code!r}; known: {', '.join(sorted(LANGUAGES))}")  # fmt: skip
    return lang


# ---------------------------------------------------------------------------------------------
# Adapters: pure functions (row, language) -> zero or more records. They never touch files.


def cell_text(value: Any) -> str:
    """A cell as training text: the one rule for null cells, for `source:` rows and `path:` rows
    (trainables/train/data.py) alike.

    Args:
        value: a row's cell as its reader gives it.
    Returns:
        the stripped text; "" for None or NaN (JSON null, an empty CSV/Parquet cell, pandas'
        float NaN), which `str` would make the strings "None" / "nan" and train on.
    """
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value).strip()


def _text(row: Row, col: str) -> str:
    return cell_text(row.get(col))


def _record(prompt: str, response: str, source: str, language: str) -> list[Record]:
    if not prompt or not response:
        return []  # an empty side teaches nothing
    return [{"prompt": prompt, "response": response, "source": source, "language": language}]


def _join(instruction: str, extra: str) -> str:
    return f"{instruction}\n\n{extra}" if extra else instruction


def _qa(prompt_col: str, response_col: str) -> Callable[[Row, Language, str], list[Record]]:
    def adapt(row: Row, lang: Language, source: str) -> list[Record]:
        return _record(_text(row, prompt_col), _text(row, response_col), source, lang.code)

    return adapt


def _alpaca(
    instruction_col: str, input_col: str, output_col: str
) -> Callable[[Row, Language, str], list[Record]]:
    def adapt(row: Row, lang: Language, source: str) -> list[Record]:
        prompt = _join(_text(row, instruction_col), _text(row, input_col))
        return _record(prompt, _text(row, output_col), source, lang.code)

    return adapt


def adapt_nllb(row: Row, lang: Language, source: str) -> list[Record]:
    """One NLLB sentence pair -> two translation records (English->target, target->English)."""
    pair = row.get("translation") or {}
    eng, other = cell_text(pair.get("eng_Latn")), cell_text(pair.get(lang.nllb))
    out: list[Record] = []
    for src_text, src_name, tgt_text, tgt_name in (
        (eng, "English", other, lang.name),
        (other, lang.name, eng, "English"),
    ):
        prompt = f"Translate the following {src_name} text into {tgt_name}.\n\n{src_text}"
        if src_text:
            out += _record(prompt, tgt_text, source, lang.code)
    return out


def adapt_indic_align(row: Row, lang: Language, source: str) -> list[Record]:
    """IndicAlign row: column `<nllb code>` holds [[user, assistant], ...] turns; first turn only.

    Later turns depend on the conversation before them, which a single prompt/response record
    cannot carry, so they are not emitted.
    """
    turns = row.get(lang.nllb) or []
    if not turns or len(turns[0]) < 2:
        return []
    return _record(cell_text(turns[0][0]), cell_text(turns[0][1]), source, lang.code)


@dataclass(frozen=True)
class Source:
    """One SFT source: where it lives, which columns it needs, and its adapter.

    `schema` says how the column names were established; "unconfirmed" ones are best knowledge
    and fail loudly (missing-column error) if the real files differ.
    """

    name: str
    hub_id: str
    kind: str  # "math" or "language"
    languages: tuple[str, ...]  # ISO 639-3 codes the papers use this source for
    adapt: Callable[[Row, Language, str], list[Record]]
    columns: Callable[[Language], tuple[str, ...]]
    schema: str
    hub_config: Callable[[Language], str | None] = lambda lang: None
    hub_split: Callable[[Language, str], str] = lambda lang, split: split
    # Rows carry their own language (multilingual sources): which column, and its spellings.
    row_language: Callable[[Row], tuple[str, ...]] | None = None
    hub_loadable: bool = True
    hub_note: str = ""
    # data_files whose path contains one of these (case-insensitive) are skipped.
    exclude_files: tuple[str, ...] = ()
