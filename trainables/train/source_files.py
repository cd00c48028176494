"""Opening an SFT source's rows: local json/jsonl/parquet/csv files or the Hub (`datasets`), and
naming the first bad file and line when a local file cannot be read.

`_open(spec, lang, split, files)` is what trainables/train/sources.py `load_sft` reads through.
Tests: .venv/bin/python -m pytest -q tests/trainables/train/test_sources.py
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from layerswap.spaces.base import check_jsonl, decode_utf8, load_json
from layerswap.trainables.train.sft_records import DataSourceError, Language, Row, Source

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
