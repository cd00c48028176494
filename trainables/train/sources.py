"""SFT sources: the table of sources the papers train on, and `load_sft`, which reads one of them
into {prompt, response, source, language} records.

`load_sft("aya", language="swh", data_files=[...])` reads one source. Mixing a language's sources
into one SFT set (papers' appendix A.6 / ICLR A.1) is trainables/train/language_sets.py; the
record format, languages and row adapters are trainables/train/sft_records.py, opening files
trainables/train/source_files.py. Tests:
.venv/bin/python -m pytest -q tests/trainables/train/test_sources.py
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from layerswap.trainables.train.sft_records import (
    DataSourceError,
    Language,
    Record,
    Source,
    _alpaca,
    _qa,
    _text,
    adapt_indic_align,
    adapt_nllb,
    resolve_language,
)
from layerswap.trainables.train.source_files import _local_files, _open, _rows

# ---------------------------------------------------------------------------------------------
# The source table.


def _cols(*names: str) -> Callable[[Language], tuple[str, ...]]:
    return lambda lang: names


_ALPACA = ("instruction", "input", "output")

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            name="orca_math",
            hub_id="microsoft/orca-math-word-problems-200k",
            kind="math",
            languages=("eng",),
            adapt=_qa("question", "answer"),
            columns=_cols("question", "answer"),
            schema="confirmed: dataset card (question, answer)",
        ),
        Source(
            name="aya",
            hub_id="CohereForAI/aya_dataset",
            kind="language",
            languages=("ben", "tel", "swh", "jpn"),
            adapt=_qa("inputs", "targets"),
            columns=_cols("inputs", "targets", "language", "language_code"),
            schema="confirmed: dataset card (inputs, targets, language, language_code, ...)",
            row_language=lambda row: (_text(row, "language"), _text(row, "language_code")),
        ),
        Source(
            name="nllb",
            hub_id="allenai/nllb",
            kind="language",
            languages=("ben", "tel", "swh", "jpn"),
            adapt=adapt_nllb,
            columns=_cols("translation"),
            schema=(
                "confirmed: dataset card ('translation' dict keyed by NLLB codes, plus "
                "laser_score and sentence-source fields); configs are '<src>-<tgt>' pairs"
            ),
            hub_config=lambda lang: "-".join(sorted(("eng_Latn", lang.nllb))),
            hub_loadable=False,
            hub_note=(
                "allenai/nllb is a loading script, which datasets>=4 no longer runs: download "
                "the pair's file and pass it as data_files (json/jsonl/parquet rows with a "
                "'translation' dict)"
            ),
        ),
        Source(
            name="telugu_alpaca",
            hub_id="Telugu-LLM-Labs/telugu_alpaca_yahma_cleaned_filtered_romanized",
            kind="language",
            languages=("tel",),
            adapt=_alpaca("telugu_instruction", "telugu_input", "telugu_output"),
            columns=_cols("telugu_instruction", "telugu_input", "telugu_output"),
            schema=(
                "corroborated, not from a card (the repo has no card): public code reading its "
                "CSV uses telugu_instruction/telugu_input/telugu_output"
            ),
        ),
        Source(
            name="telugu_gpteacher",
            hub_id="Telugu-LLM-Labs/telugu_teknium_GPTeacher_general_instruct_filtered_romanized",
            kind="language",
            languages=("tel",),
            adapt=_alpaca("telugu_instruction", "telugu_input", "telugu_output"),
            columns=_cols("telugu_instruction", "telugu_input", "telugu_output"),
            schema="unconfirmed: assumed identical to telugu_alpaca (same collection and pipeline)",
        ),
        Source(
            name="indic_sharellama",
            hub_id="ai4bharat/indic-align",
            kind="language",
            languages=("ben", "tel"),
            adapt=adapt_indic_align,
            columns=lambda lang: (lang.nllb,),
            schema=(
                "corroborated, not from the card: public code reports doc_id, num_turns and one "
                "column per language named by NLLB code holding [[user, assistant], ...] turns"
            ),
            hub_config=lambda lang: "Indic_ShareLlama",
        ),
        Source(
            name="bongchat",
            hub_id="lumatic-ai/BongChat-v1-253k",
            kind="language",
            languages=("ben",),
            adapt=_alpaca(*_ALPACA),
            columns=_cols(*_ALPACA),
            schema="confirmed: dataset card features (instruction, input, output)",
        ),
        Source(
            name="inkuba_instruct",
            hub_id="lelapa/Inkuba-instruct",
            kind="language",
            languages=("swh",),
            adapt=_alpaca("instruction", "inputs", "targets"),
            columns=_cols("instruction", "inputs", "targets"),
            schema=(
                "corroborated, not from the card: public code reads instruction/inputs/targets "
                "(and a task column) from per-language splits such as 'swahili_train'"
            ),
            hub_split=lambda lang, split: f"{lang.name.lower()}_{split}",
        ),
        Source(
            name="xp3mt",
            hub_id="bigscience/xP3mt",
            kind="language",
            languages=("swh", "ben", "tel"),
            adapt=_qa("inputs", "targets"),
            columns=_cols("inputs", "targets"),
            schema="confirmed: xP3 family card (inputs, targets); configs are ISO 639-1 codes",
            hub_config=lambda lang: lang.aliases[0],
            # The papers remove FLORES samples (FLORES is an evaluation set). Rows do not name
            # their task, only xP3's file names do, so exclusion works on data_files only.
            exclude_files=("flores",),
        ),
        Source(
            name="llm_japanese",
            hub_id="izumi-lab/llm-japanese-dataset",
            kind="language",
            languages=("jpn",),
            adapt=_alpaca(*_ALPACA),
            columns=_cols(*_ALPACA),
            schema="unconfirmed: instruction/input/output from memory of the project's README",
        ),
        Source(
            name="ichikara",
            # The ICLR paper prints "platdev"; the Hub repository is p1atdev (digit one).
            hub_id="p1atdev/ichikara-instruction",
            kind="language",
            languages=("jpn",),
            adapt=_qa("text", "output"),
            columns=_cols("text", "output"),
            schema="inferred: ID/text/output, from a derivative dataset's card; configs are dates",
            hub_config=lambda lang: "20231115-1",
        ),
        Source(
            name="dolly_ja",
            hub_id="kunishou/databricks-dolly-15k-ja",
            kind="language",
            languages=("jpn",),
            adapt=_alpaca(*_ALPACA),
            columns=_cols(*_ALPACA),
            schema="inferred: instruction/input/output/category/index, from a derivative's card",
        ),
    )
}

# Which sources build each language's generic SFT set (follow-up appendix A.6; Japanese from the
# ICLR paper's appendix A.1).
LANGUAGE_SOURCES: dict[str, tuple[str, ...]] = {
    "tel": ("aya", "nllb", "telugu_alpaca", "telugu_gpteacher"),
    "ben": ("aya", "nllb", "indic_sharellama", "bongchat"),
    "swh": ("aya", "nllb", "inkuba_instruct", "xp3mt"),
    "jpn": ("aya", "nllb", "llm_japanese", "ichikara", "dolly_ja"),
}
MATH_SOURCES: tuple[str, ...] = ("orca_math",)


def get_source(name: str) -> Source:
    """The registered source called `name` (source-table key or Hub id).

    Raises:
        DataSourceError: unknown source; the message lists the known ones.
    """
    if name in SOURCES:
        return SOURCES[name]
    for s in SOURCES.values():
        if s.hub_id.lower() == name.lower():
            return s
    known = ", ".join(f"{k} ({s.hub_id})" for k, s in SOURCES.items())
    raise DataSourceError(f"unknown source {name!r}; known: {known}")


# ---------------------------------------------------------------------------------------------
# Loading.


def _matches(values: Iterable[str], lang: Language) -> bool:
    return any(v.strip().lower() in lang.spellings for v in values if v)


def load_sft(
    source: str,
    *,
    language: str | None = None,
    split: str = "train",
    limit: int | None = None,
    data_files: str | Path | Sequence[str | Path] | None = None,
    counts: dict[str, int] | None = None,
) -> list[Record]:
    """Read one source as SFT records, from the Hub or from local json/jsonl/parquet/csv files.

    Args:
        source: source-table name (e.g. "aya") or Hub id.
        language: target language (ISO 639-3 code, alias or name); required when the source
            serves several languages, defaults to its only one otherwise.
        split: split to read (local files are read as this split).
        limit: stop after this many records (None: all).
        data_files: local files in the source's own schema; when given, nothing is downloaded.
        counts: when given, `counts["empty"]` is set to the rows read that gave no record (a
            null, NaN or blank side: `sft_records.cell_text`), for the trainer's dropped-rows line.

    Returns:
        Records {"prompt", "response", "source", "language"}, in file order.

    Raises:
        DataSourceError: unknown source or language, missing column (named, with the files),
            a language filter that matches no row, a local file `datasets` cannot read (named,
            with the line when it is not UTF-8 or not JSON).
    """
    spec = get_source(source)
    if language is None:
        if len(spec.languages) != 1:
            raise DataSourceError(
                f"{spec.name}: serves {', '.join(spec.languages)}; pass language="
            )
        language = spec.languages[0]
    lang = resolve_language(language)
    if lang.code not in spec.languages and spec.row_language is None:
        raise DataSourceError(
            f"{spec.name}: no {lang.name} ({lang.code}) data; it serves {', '.join(spec.languages)}"
        )
    local = _local_files(spec, data_files) if data_files is not None else None
    ds, where = _open(spec, lang, split, local)
    missing = [c for c in spec.columns(lang) if c not in ds.column_names]
    if missing:
        raise DataSourceError(
            f"{spec.name}: column {missing[0]!r} missing from {where} "
            f"(needs {list(spec.columns(lang))}, has {ds.column_names})"
        )
    out: list[Record] = []
    seen_langs: dict[str, int] = {}
    matched = empty = 0
    for row in _rows(ds, spec, local):
        if spec.row_language is not None:
            values = spec.row_language(row)
            if not _matches(values, lang):
                key = values[0] or "?"
                seen_langs[key] = seen_langs.get(key, 0) + 1
                continue
        matched += 1
        recs = spec.adapt(row, lang, spec.name)
        empty += not recs
        out += recs
        if limit is not None and len(out) >= limit:
            break
    if counts is not None:
        counts["empty"] = empty
    if limit is not None and len(out) >= limit:
        return out[:limit]
    if spec.row_language is not None and matched == 0:
        seen = ", ".join(f"{k} ({n})" for k, n in sorted(seen_langs.items())) or "none"
        raise DataSourceError(
            f"{spec.name}: language filter {lang.code} ({lang.name}) matched no row in "
            f"{where}; languages present: {seen}"
        )
    return out
