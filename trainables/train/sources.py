"""SFT data: per-source adapters to one {prompt, response, source, language} record format.

`load_sft("aya", language="swh", data_files=[...])` reads one source. Mixing a language's sources
into one SFT set (papers' appendix A.6 / ICLR A.1) is trainables/train/language_sets.py.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerswap.spaces.base import check_jsonl, decode_utf8, load_json

Record = dict[str, str]
Row = Mapping[str, Any]
RECORD_KEYS = ("prompt", "response", "source", "language")


class DataSourceError(ValueError):
    """A data source cannot be read as asked: unknown name, missing column, empty filter."""


# ---------------------------------------------------------------------------------------------
# Languages. Records carry ISO 639-3 codes. Swahili is `swh` (the individual language), the code
# NLLB, FLORES and Belebele use (`swh_Latn`); sources that say `sw`/`swa` are mapped to it.


@dataclass(frozen=True)
class Language:
    code: str  # ISO 639-3, what records carry
    name: str  # English name, as Aya's `language` column spells it
    nllb: str  # NLLB/FLORES code
    aliases: tuple[str, ...]  # other spellings sources use (ISO 639-1, macro-language, ...)


LANGUAGES: dict[str, Language] = {
    "eng": Language("eng", "English", "eng_Latn", ("en",)),
    "ben": Language("ben", "Bengali", "ben_Beng", ("bn",)),
    "tel": Language("tel", "Telugu", "tel_Telu", ("te",)),
    "swh": Language("swh", "Swahili", "swh_Latn", ("sw", "swa")),
    "jpn": Language("jpn", "Japanese", "jpn_Jpan", ("ja",)),
}


def resolve_language(code: str) -> Language:
    """The `Language` for a code, alias, NLLB code or English name (case-insensitive).

    Raises:
        DataSourceError: the language is not one the project knows.
    """
    key = code.strip().lower()
    for lang in LANGUAGES.values():
        spellings = {lang.code, lang.name.lower(), lang.nllb.lower(), *lang.aliases}
        if key in spellings:
            return lang
    raise DataSourceError(f"unknown language {code!r}; known: {', '.join(sorted(LANGUAGES))}")


# ---------------------------------------------------------------------------------------------
# Adapters: pure functions (row, language) -> zero or more records. They never touch files.


def _text(row: Row, col: str) -> str:
    value = row.get(col)
    # CSV/parquet readers give None (or NaN) for empty cells.
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value).strip()


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
    eng, other = str(pair.get("eng_Latn") or "").strip(), str(pair.get(lang.nllb) or "").strip()
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
    return _record(str(turns[0][0]).strip(), str(turns[0][1]).strip(), source, lang.code)


# ---------------------------------------------------------------------------------------------
# The source table.


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

_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def _local_files(spec: Source, data_files: str | Path | Sequence[str | Path]) -> list[str]:
    files = [data_files] if isinstance(data_files, (str, Path)) else list(data_files)
    if not files:
        raise DataSourceError(f"{spec.name}: data_files is empty")
    kept = [str(f) for f in files if not any(x in str(f).lower() for x in spec.exclude_files)]
    if not kept:
        raise DataSourceError(
            f"{spec.name}: every data file was excluded (names containing {spec.exclude_files})"
        )
    for f in kept:
        if not Path(f).is_file():
            raise DataSourceError(f"{spec.name}: data file {f} does not exist")
    exts = {Path(f).suffix.lower() for f in kept}
    if len(exts) != 1 or next(iter(exts)) not in _BUILDERS:
        raise DataSourceError(
            f"{spec.name}: data_files must all be one of {sorted(_BUILDERS)}, got {sorted(exts)}"
        )
    return kept


def _local_problem(files: list[str], e: Exception) -> str:
    """Why `datasets` could not read local `files`: the first bad file and line when a scan of
    the JSON/JSONL/CSV text finds one (run only after a failure: it reads every file again)."""
    for f in files:
        path, suffix = Path(f), Path(f).suffix.lower()
        try:
            if suffix == ".jsonl":
                check_jsonl(path)
            elif suffix == ".json":
                _check_json(path)
            elif suffix == ".csv":
                with open(path, "rb") as fh:
                    offset = 0
                    for n, raw in enumerate(fh, 1):
                        decode_utf8(raw, f"{path}:{n}", offset=offset)
                        offset += len(raw)
        except ValueError as found:
            return str(found)
    cause = e.__cause__ or e.__context__ or e
    return f"cannot read {', '.join(files)}: {type(cause).__name__}: {cause}"


def _check_json(path: Path) -> None:
    """A .json file is one document (an array of rows) or, as `datasets` also accepts, JSON
    lines; raises ValueError for the way it is meant (by its first character) naming the line."""
    try:
        load_json(path, "data file")
    except ValueError:
        with open(path, "rb") as fh:
            head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
        if head.startswith(b"["):
            raise
        check_jsonl(path)


def _rows(ds: Any, spec: Source, files: list[str] | None) -> Iterator[Row]:
    """The rows of `ds`. pyarrow takes invalid UTF-8 into its tables and fails only when a row
    is read, so a local file can fail here too; it is then named like a load failure."""
    it = iter(ds)
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except Exception as e:
            if files is None:
                raise
            raise DataSourceError(f"{_local_problem(files, e)} (source {spec.name})") from e
        yield row


def _open(spec: Source, lang: Language, split: str, files: list[str] | None) -> tuple[Any, str]:
    """A `datasets.Dataset` for the source (local `files` when given, checked by `_local_files`),
    and a description of where it came from."""
    import datasets  # heavy; only the loader needs it

    if files is not None:
        builder = _BUILDERS[Path(files[0]).suffix.lower()]
        # Local files are one split, whatever the name; keyed by `split` so it is the one read.
        try:
            ds = datasets.load_dataset(builder, data_files={split: files}, split=split)
        except Exception as e:  # datasets wraps parse errors in messages that name no file
            raise DataSourceError(f"{_local_problem(files, e)} (source {spec.name})") from e
        return ds, ", ".join(files)
    if not spec.hub_loadable:
        raise DataSourceError(f"{spec.name}: {spec.hub_note}")
    if spec.exclude_files:
        warnings.warn(
            f"{spec.name}: loading {spec.hub_id} by config cannot skip files named "
            f"{spec.exclude_files}; pass data_files to exclude them",
            stacklevel=3,
        )
    ds = datasets.load_dataset(
        spec.hub_id, spec.hub_config(lang), split=spec.hub_split(lang, split)
    )
    return ds, spec.hub_id


def _matches(values: Iterable[str], lang: Language) -> bool:
    spellings = {lang.code, lang.name.lower(), lang.nllb.lower(), *lang.aliases}
    return any(v.strip().lower() in spellings for v in values if v)


def load_sft(
    source: str,
    *,
    language: str | None = None,
    split: str = "train",
    limit: int | None = None,
    data_files: str | Path | Sequence[str | Path] | None = None,
) -> list[Record]:
    """Read one source as SFT records, from the Hub or from local json/jsonl/parquet/csv files.

    Args:
        source: source-table name (e.g. "aya") or Hub id.
        language: target language (ISO 639-3 code, alias or name); required when the source
            serves several languages, defaults to its only one otherwise.
        split: split to read (local files are read as this split).
        limit: stop after this many records (None: all).
        data_files: local files in the source's own schema; when given, nothing is downloaded.

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
    matched = 0
    for row in _rows(ds, spec, local):
        if spec.row_language is not None:
            values = spec.row_language(row)
            if not _matches(values, lang):
                key = values[0] or "?"
                seen_langs[key] = seen_langs.get(key, 0) + 1
                continue
        matched += 1
        out += spec.adapt(row, lang, spec.name)
        if limit is not None and len(out) >= limit:
            return out[:limit]
    if spec.row_language is not None and matched == 0:
        seen = ", ".join(f"{k} ({n})" for k, n in sorted(seen_langs.items())) or "none"
        raise DataSourceError(
            f"{spec.name}: language filter {lang.code} ({lang.name}) matched no row in "
            f"{where}; languages present: {seen}"
        )
    return out
