"""SFT data: per-source adapters to one {prompt, response, source, language} record format.

`load_sft("aya", language="swh", data_files=[...])` reads one source; `build_language_set` mixes a
language's sources (papers' appendix A.6 / ICLR A.1) and `write_jsonl` writes the result atomically.
"""

from __future__ import annotations

import json
import random
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainables.atomic import atomic_write_text

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
# The registry.


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
    """The registered source called `name` (registry key or Hub id).

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


def _open(spec: Source, lang: Language, split: str, data_files) -> tuple[Any, str]:
    """A `datasets.Dataset` for the source, and a description of where it came from."""
    import datasets  # heavy; only the loader needs it

    if data_files is not None:
        files = _local_files(spec, data_files)
        builder = _BUILDERS[Path(files[0]).suffix.lower()]
        # Local files are one split, whatever the name; keyed by `split` so it is the one read.
        ds = datasets.load_dataset(builder, data_files={split: files}, split=split)
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
        source: registry name (e.g. "aya") or Hub id.
        language: target language (ISO 639-3 code, alias or name); required when the source
            serves several languages, defaults to its only one otherwise.
        split: split to read (local files are read as this split).
        limit: stop after this many records (None: all).
        data_files: local files in the source's own schema; when given, nothing is downloaded.

    Returns:
        Records {"prompt", "response", "source", "language"}, in file order.

    Raises:
        DataSourceError: unknown source or language, missing column (named, with the files),
            a language filter that matches no row.
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
    ds, where = _open(spec, lang, split, data_files)
    missing = [c for c in spec.columns(lang) if c not in ds.column_names]
    if missing:
        raise DataSourceError(
            f"{spec.name}: column {missing[0]!r} missing from {where} "
            f"(needs {list(spec.columns(lang))}, has {ds.column_names})"
        )
    out: list[Record] = []
    seen_langs: dict[str, int] = {}
    matched = 0
    for row in ds:
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


# ---------------------------------------------------------------------------------------------
# The math guard. The papers' language sets contain no math, so a math-looking example in a
# language source is dropped rather than allowed to blur which expert learned math.
#
# Heuristic (script-independent, since the prompts are in Bengali/Swahili/Telugu/Japanese; `\d`
# matches every script's digits): an example is math if prompt or response has
#   - an arithmetic expression: digit, then + * x × ÷ ^ =, then digit ("5 + 3", "2×4", "x=7");
#   - a subtraction/division result: "12 - 4 = 8", "9/3 = 3" (a bare "1990-1995" is a range);
#   - LaTeX math (\frac, \sqrt, \times, \cdot, \div, \sum, \int) or "$...digit...$";
#   - an English math phrase that translated data keeps ("solve for", "equation", "calculate").
# It favours precision: a word problem whose text never shows an operation slips through.

_MATH_PATTERNS = [
    re.compile(r"\d\s*[+*×÷^=]\s*\d"),
    re.compile(r"\d\s*[-−/]\s*\d+(?:\.\d+)?\s*="),
    re.compile(r"\d\s*x\s*\d+\s*="),
    re.compile(r"\\(?:frac|sqrt|times|cdot|div|sum|int)\b"),
    re.compile(r"\$[^$\n]*\d[^$\n]*\$"),
    re.compile(r"\b(?:solve for|equations?|calculate|arithmetic)\b", re.IGNORECASE),
]


def looks_like_math(record: Mapping[str, str]) -> bool:
    """True if the record's prompt or response looks like math (heuristic above)."""
    text = f"{record.get('prompt', '')}\n{record.get('response', '')}"
    return any(p.search(text) for p in _MATH_PATTERNS)


# ---------------------------------------------------------------------------------------------
# Mixing and writing.


@dataclass
class Mix:
    """A mixed SFT set: train and validation records, and what was dropped on the way."""

    train: list[Record]
    validation: list[Record]
    dropped_math: int = 0
    dropped_duplicates: int = 0
    per_source: dict[str, int] = field(default_factory=dict)


def _quotas(sizes: Mapping[str, int], weights: Mapping[str, float], total: int) -> dict[str, int]:
    """Records to take per source: proportional to weight, capped by availability, the shortfall
    of small sources handed to the others (deterministic: no randomness here)."""
    quota = dict.fromkeys(sizes, 0)
    open_ = [k for k in sizes if sizes[k] > 0 and weights.get(k, 0) > 0]
    left = min(total, sum(sizes[k] for k in open_))
    while left > 0 and open_:
        wsum = sum(weights[k] for k in open_)
        share = {k: int(left * weights[k] / wsum) for k in open_}
        # Rounding leftovers go to the heaviest sources first (ties by name), one each.
        rest = left - sum(share.values())
        for k in sorted(open_, key=lambda k: (-weights[k], k))[:rest]:
            share[k] += 1
        for k in open_:
            take = min(share[k], sizes[k] - quota[k])
            quota[k] += take
            left -= take
        open_ = [k for k in open_ if quota[k] < sizes[k]]
    return quota


def mix(
    parts: Mapping[str, Sequence[Record]],
    *,
    size: int,
    seed: int,
    val_share: float = 0.025,
    weights: Mapping[str, float] | None = None,
    drop_math: bool = True,
) -> Mix:
    """Sample a fixed-size SFT set from several sources, deterministically by `seed`.

    Exact duplicates (same prompt and response) are dropped first, then math-looking examples
    if `drop_math` (language sets). Defaults follow the follow-up paper: 80k examples, 2k
    (2.5 %) of them held out for validation.

    Args:
        parts: records by source name.
        size: target total (train + validation); fewer if the sources run out.
        seed: sampling and shuffling seed; same inputs and seed give the same output.
        val_share: fraction of the mix held out for validation.
        weights: relative share per source (default: equal).
        drop_math: drop records `looks_like_math` flags.

    Returns:
        A `Mix`.
    """
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    if not 0 <= val_share < 1:
        raise ValueError(f"val_share must be in [0, 1), got {val_share}")
    weights = dict(weights) if weights is not None else dict.fromkeys(parts, 1.0)
    unknown = set(weights) - set(parts)
    if unknown:
        raise ValueError(f"weights for sources not in parts: {sorted(unknown)}")
    rng = random.Random(seed)
    seen: set[tuple[str, str]] = set()
    clean: dict[str, list[Record]] = {}
    dropped_math = dropped_dup = 0
    for name in sorted(parts):  # sorted: the result must not depend on dict order
        keep = []
        for r in parts[name]:
            key = (r["prompt"], r["response"])
            if key in seen:
                dropped_dup += 1
                continue
            seen.add(key)
            if drop_math and looks_like_math(r):
                dropped_math += 1
                continue
            keep.append(r)
        clean[name] = keep
    quota = _quotas({k: len(v) for k, v in clean.items()}, weights, size)
    chosen: list[Record] = []
    for name in sorted(clean):
        chosen += rng.sample(clean[name], quota[name])
    rng.shuffle(chosen)
    n_val = round(len(chosen) * val_share)
    return Mix(
        train=chosen[n_val:],
        validation=chosen[:n_val],
        dropped_math=dropped_math,
        dropped_duplicates=dropped_dup,
        per_source={k: v for k, v in quota.items() if v},
    )


def build_language_set(
    language: str,
    *,
    size: int = 80_000,
    seed: int = 0,
    val_share: float = 0.025,
    data_files: Mapping[str, str | Path | Sequence[str | Path]] | None = None,
    sources: Sequence[str] | None = None,
    weights: Mapping[str, float] | None = None,
) -> Mix:
    """A language's generic (math-free) SFT set from its papers' sources.

    Args:
        language: target language (code, alias or name).
        size, seed, val_share, weights: as for `mix`.
        data_files: local files per source name; a source without an entry is read from the Hub.
        sources: override the papers' source list (`LANGUAGE_SOURCES`).

    Returns:
        A `Mix` with math-looking examples removed.
    """
    lang = resolve_language(language)
    names = list(sources) if sources is not None else list(LANGUAGE_SOURCES.get(lang.code, ()))
    if not names:
        raise DataSourceError(f"no sources registered for {lang.code}; pass sources=")
    files = data_files or {}
    parts = {n: load_sft(n, language=lang.code, data_files=files.get(n)) for n in names}
    return mix(parts, size=size, seed=seed, val_share=val_share, weights=weights, drop_math=True)


def write_jsonl(records: Iterable[Mapping[str, str]], path: str | Path) -> Path:
    """Write records as JSON lines (non-ASCII \\u-escaped), atomically.

    Args:
        records: SFT records; each must have exactly the keys prompt, response, source, language.
        path: output file; its folder is created.

    Returns:
        The path written.
    """
    path = Path(path)
    lines = []
    for i, r in enumerate(records):
        if set(r) != set(RECORD_KEYS) or not all(isinstance(r[k], str) for k in RECORD_KEYS):
            raise ValueError(f"record {i} is not an SFT record {RECORD_KEYS}: {dict(r)!r}")
        # ASCII-escaped: atomic_write_text uses the locale encoding, which may not be UTF-8.
        lines.append(json.dumps({k: r[k] for k in RECORD_KEYS}, ensure_ascii=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return path
