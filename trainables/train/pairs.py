"""Reading one training dataset as (prompt, response) pairs: a `path:` file (.jsonl, .json of an
array or of JSON lines, .parquet) or a registered `source:`, with the one rule for empty sides
(null, NaN or blank: dropped, and counted for the trainer's dropped-rows line).

trainables/train/data.py encodes and batches what this reads. Tests:
.venv/bin/python -m pytest -q tests/trainables/train/test_data.py tests/trainables/train/test_data_cells.py
"""

from __future__ import annotations

from pathlib import Path

from layerswap.spaces.base import iter_jsonl, load_json
from layerswap.spaces.train_experiment import DatasetSpec
from layerswap.trainables.atomic import read_parquet
from layerswap.trainables.storage import local_copy
from layerswap.trainables.train.sft_records import cell_text
from layerswap.trainables.train.sources import load_sft

Pair = tuple[str, str]

# What a `path:` dataset may be, by extension (one place: `_read_rows` reads these, and
# `path_problem` refuses anything else before training).
SUFFIXES = (".jsonl", ".json", ".parquet")


def _row_pair(row: dict, where: str) -> Pair:
    for p, r in (("prompt", "response"), ("question", "answer"), ("inputs", "targets")):
        if p in row and r in row:
            return cell_text(row[p]), cell_text(row[r])  # null/NaN -> "": dropped as empty
    raise ValueError(
        f"{where}: row has none of prompt/response, question/answer (Orca), inputs/targets "
        f"(Aya); keys: {sorted(row)}"
    )


def path_problem(path: str | Path) -> str | None:
    """Why a local file cannot be a `path:` dataset, or None.

    Args:
        path: the dataset's local path.
    Returns:
        "PATH does not exist", "PATH is a folder ...", or "PATH: extension ... not supported",
        each saying what is accepted; None for an existing file with a known extension.
    """
    path = Path(path)
    accepted = f"a `path:` dataset is one {'/'.join(SUFFIXES)} file"
    if path.is_dir():
        saved = (path / "dataset_info.json").is_file() or (path / "state.json").is_file()
        how = " (a `datasets` save_to_disk folder: write it with Dataset.to_json or to_parquet)"
        return f"{path} is a folder, not a data file{how if saved else ''}; {accepted}"
    if not path.is_file():
        return f"{path} does not exist"
    if path.suffix.lower() not in SUFFIXES:
        # Read by extension: a .csv used to be parsed as JSON lines and failed on its first line.
        ext = path.suffix or "(none)"
        return f"{path}: extension {ext} is not supported; {accepted}"
    return None


def _read_rows(path: Path) -> list[tuple[str, dict]]:
    """(where, row) for every row of a local .jsonl/.json/.parquet file; `where` names the file
    and the JSONL line (or the row of a .json array / Parquet table)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            rows = read_parquet(path).to_pylist()
        except (OSError, ValueError) as e:  # pyarrow's ArrowIOError / ArrowInvalid
            raise ValueError(f"{path}: not a readable Parquet file ({e})") from None
    elif suffix == ".json" and _json_array(path):
        rows = load_json(path, "dataset")
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON array of rows, got {type(rows).__name__}")
    else:  # .jsonl, or a .json file of JSON lines (what datasets' Dataset.to_json writes)
        return [(f"{path}:{n}", row) for n, row in iter_jsonl(path, objects=True)]
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {i + 1} is not an object: {row!r:.80}")
    return [(f"{path}: row {i + 1}", row) for i, row in enumerate(rows)]


def _json_array(path: Path) -> bool:
    """A .json file is one JSON array when its first character is `[`, else JSON lines: the
    rule `datasets` follows, so `path:` and `source: ..., data_files:` read a file alike."""
    with open(path, "rb") as fh:
        return fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[")


def load_pairs(spec: DatasetSpec) -> list[Pair]:
    """(prompt, response) pairs of one dataset, in file order, empty sides dropped.

    Args:
        spec: a local file (`path`: .jsonl/.json/.parquet) or a registered `source`.
    Returns:
        The pairs (at most `spec.limit`).
    Raises:
        ValueError: as `read_pairs`.
    """
    return read_pairs(spec)[0]


def read_pairs(spec: DatasetSpec) -> tuple[list[Pair], int]:
    """(prompt, response) pairs of one dataset, in file order, and how many rows were dropped
    for an empty side (null, NaN or blank: `sft_records.cell_text`, one rule for `path:` and
    `source:`), counted up to the row that completes `spec.limit`.

    Args:
        spec: a local file (`path`: .jsonl/.json/.parquet) or a registered `source`.
    Returns:
        The pairs (at most `spec.limit`) and the dropped rows' count.
    Raises:
        ValueError: a missing, empty, non-UTF-8 or malformed file (naming the file and line), a
            row without a known prompt/response pair of columns, or no usable pair at all.
    """
    if spec.source is not None:
        counts: dict[str, int] = {}
        recs = load_sft(spec.source, language=spec.language, data_files=spec.data_files, limit=spec.limit, counts=counts)  # fmt: skip
        pairs = [(r["prompt"], r["response"]) for r in recs]
        if not pairs:
            raise ValueError(f"datasets: {spec.label} has no usable examples")
        return pairs, counts.get("empty", 0)
    path = local_copy(spec.path)  # type: ignore[arg-type]  # a URI: its cached local copy
    if (problem := path_problem(path)) is not None:
        raise ValueError(f"datasets: {problem}")
    rows = _read_rows(path)
    if not rows:
        raise ValueError(f"{path}: no rows (an empty dataset)")
    pairs, empty = [], 0
    for where, row in rows:
        pair = _row_pair(row, where)
        if pair[0] and pair[1]:
            pairs.append(pair)
            if len(pairs) == spec.limit:
                break
        else:
            empty += 1
    if not pairs:
        raise ValueError(f"{path}: no usable rows ({len(rows)} rows, each with an empty, null or NaN prompt or response)")  # fmt: skip
    return pairs, empty
