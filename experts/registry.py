"""The expert registry: one Parquet row per scored expert checkpoint (RUN/experts/registry.parquet).

`append_rows(path, rows)`, `read_rows(path)`, `top_k(path, "math", "en")`; schema: COLUMNS below.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from layerswap.spaces.sweep import EXPERT_KINDS
from layerswap.spaces.task_families import INDICATOR_PREFIX as IND
from layerswap.spaces.task_families import N_ITEMS_PREFIX as N_ITEMS
from layerswap.spaces.train_modes import MODE_NAMES
from layerswap.trainables.atomic import atomic_write, read_parquet
from layerswap.trainables.storage import absolute, is_under

REGISTRY_REL = Path("experts") / "registry.parquet"
# Fixed columns, in file order.
COLUMNS: dict[str, pa.DataType] = {
    "expert_id": pa.string(),
    "kind": pa.string(),
    "language": pa.string(),
    "mode": pa.string(),
    "path": pa.string(),
    "base": pa.string(),
    "trial_id": pa.string(),
    "step": pa.int64(),
    "samples": pa.int64(),
    "seed": pa.int64(),
    "hparams": pa.string(),
}


def registry_path(run_dir: str | Path) -> Path:
    """RUN/experts/registry.parquet."""
    return Path(run_dir) / REGISTRY_REL


def expert_id(experiment: str, trial_id: str, step: int) -> str:
    """Stable id of a checkpoint: 12 hex digits of SHA-256 over experiment, trial and step."""
    return hashlib.sha256(f"{experiment}\x00{trial_id}\x00{int(step)}".encode()).hexdigest()[:12]


def expert_row(
    experiment: dict,
    checkpoint: str | Path,
    manifest: dict,
    trial_id: str,
    columns: dict,
    extra_hparams: dict | None = None,
) -> dict[str, Any]:
    """One registry row for a scored checkpoint.

    Args:
        experiment: the training experiment as JSON data (name, kind, language, mode, base).
        checkpoint: the checkpoint folder (a URI in cloud storage is recorded as written).
        manifest: its training manifest (trainables.train.read_manifest).
        trial_id: the sweep trial (or run) that wrote it.
        columns: indicator columns (`IndicatorScores.columns()`).
        extra_hparams: sampled values outside `hyper` (e.g. mode.rank), merged into hparams.
    Returns:
        the row (schema: COLUMNS).
    """
    import json

    hparams = dict(manifest.get("hparams") or {}) | dict(extra_hparams or {})
    return {
        "expert_id": expert_id(experiment["name"], trial_id, manifest["step"]),
        "kind": experiment["kind"],
        "language": experiment["language"],
        "mode": experiment["mode"]["type"],
        "path": absolute(checkpoint),
        "base": experiment["base"],
        "trial_id": trial_id,
        "step": int(manifest["step"]),
        "samples": int(manifest["samples"]),
        "seed": int(manifest["seed"]),
        "hparams": json.dumps(hparams, sort_keys=True),
        **columns,
    }


def indicator_names(columns: list[str]) -> list[str]:
    """Task names that have an indicator column (`ind__<task>`)."""
    return [c[len(IND) :] for c in columns if c.startswith(IND)]


def _column_type(name: str) -> pa.DataType | None:
    if name in COLUMNS:
        return COLUMNS[name]
    if name.startswith(IND):
        return pa.float64()
    if name.startswith(N_ITEMS):
        return pa.int64()
    return None


def validate(table: pa.Table, where: str | Path) -> None:
    """Check a registry table's columns, types and values.

    Raises:
        ValueError: naming `where` (the file) and the offending column.
    """
    names = table.column_names
    for col, typ in COLUMNS.items():
        if col not in names:
            raise ValueError(f"{where}: expert registry is missing column {col!r}")
        if not table.schema.field(col).type.equals(typ):
            raise ValueError(
                f"{where}: column {col!r} has type {table.schema.field(col).type}, expected {typ}"
            )
    for col in names:
        typ = _column_type(col)
        if typ is None:
            raise ValueError(f"{where}: unexpected column {col!r} in the expert registry")
        if not table.schema.field(col).type.equals(typ):
            raise ValueError(
                f"{where}: column {col!r} has type {table.schema.field(col).type}, expected {typ}"
            )
    for task in indicator_names(names):
        if f"{N_ITEMS}{task}" not in names:
            raise ValueError(f"{where}: column {IND}{task!r} has no matching {N_ITEMS}{task}")
    for col in ("expert_id", "kind", "language", "mode", "path", "trial_id", "step"):
        if table[col].null_count:
            raise ValueError(f"{where}: column {col!r} has null values")
    ids = table["expert_id"].to_pylist()
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"{where}: column 'expert_id' has duplicates {dup[:5]}")
    for col, allowed in (("kind", EXPERT_KINDS), ("mode", MODE_NAMES)):
        bad = sorted(set(table[col].to_pylist()) - set(allowed))
        if bad:
            raise ValueError(f"{where}: column {col!r} has values {bad}, expected one of {allowed}")


def _table(rows: list[dict[str, Any]], where: str | Path) -> pa.Table:
    """Rows -> a typed table (fixed columns first, then indicator columns sorted)."""
    extra = sorted({k for r in rows for k in r if k not in COLUMNS})
    arrays, fields = [], []
    for col in [*COLUMNS, *extra]:
        typ = _column_type(col)
        if typ is None:
            raise ValueError(f"{where}: unexpected column {col!r} in an expert registry row")
        values = [r.get(col) for r in rows]
        if typ == pa.float64():
            values = [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in values]  # fmt: skip
        try:
            arrays.append(pa.array(values, type=typ))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: column {col!r}: {e}") from None
        fields.append(pa.field(col, typ))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    validate(table, where)
    return table


def read_registry(path: str | Path) -> pa.Table:
    """The registry as a validated pyarrow Table (ValueError naming the file if it is not one)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no expert registry (run `layerswap train` with a sweep: block)")
    try:
        table = read_parquet(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{path}: not a readable Parquet file ({e})") from None
    validate(table, path)
    return table


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The registry's rows as dicts (empty list when the file does not exist yet)."""
    path = Path(path)
    return read_registry(path).to_pylist() if path.is_file() else []


def write_registry(path: str | Path, rows: list[dict[str, Any]]) -> pa.Table:
    """Replace the registry with `rows`, atomically (temporary sibling, then rename).

    Returns:
        the table written.
    """
    path = Path(path)
    table = _table(rows, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    return table


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Trials on other processes append too: serialise read-modify-write with a lock file.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def append_rows(path: str | Path, rows: list[dict[str, Any]]) -> pa.Table:
    """Add rows to the registry; a row whose expert_id exists replaces it (re-scoring is idempotent).

    Args:
        path: the registry file (created if missing).
        rows: dicts with the fixed columns plus `ind__<task>` / `n_items__<task>` columns.
    Returns:
        the whole table after the append.
    """
    path = Path(path)
    _table(rows, path)  # validate the new rows on their own first: errors name them early
    with _locked(path):
        new_ids = {r["expert_id"] for r in rows}
        old = [r for r in read_rows(path) if r["expert_id"] not in new_ids]
        return write_registry(path, old + list(rows))


def drop_rows_under(path: str | Path, folder: str | Path) -> list[dict[str, Any]]:
    """Remove the rows whose checkpoint lies under `folder` (a sweep started over).

    Args:
        path: the registry file (nothing happens when it does not exist).
        folder: the replaced run folder (a local path or URI).
    Returns:
        the rows removed (`append_rows` puts them back).
    """
    path = Path(path)
    if not path.is_file():
        return []
    with _locked(path):
        rows = read_rows(path)
        keep = [r for r in rows if not is_under(r["path"], folder)]
        if len(keep) != len(rows):
            write_registry(path, keep)
        return [r for r in rows if r not in keep]


def top_k(
    source: str | Path | list[dict[str, Any]],
    kind: str,
    language: str,
    indicator: str | None = None,
    k: int = 3,
    *,
    mode: str | None = None,
) -> list[dict[str, Any]]:
    """The k best experts of a kind and language by an indicator, best first.

    Args:
        source: registry file or its rows.
        kind: "math" or "language".
        language: the expert's language code.
        indicator: task name (column `ind__<task>`; the column name works too); default the
            only indicator those rows have.
        k: how many.
        mode: keep only this training mode.
    Returns:
        rows (dicts), highest indicator first; ties by lower step, then expert_id. Rows without
        a score on the indicator are skipped.
    """
    if kind not in EXPERT_KINDS:
        raise ValueError(f"kind {kind!r} (expected one of {EXPERT_KINDS})")
    rows = read_rows(source) if isinstance(source, (str, Path)) else list(source)
    rows = [
        r
        for r in rows
        if r["kind"] == kind and r["language"] == language and (mode is None or r["mode"] == mode)
    ]
    if indicator is None:
        have = sorted(
            {c for r in rows for c, v in r.items() if c.startswith(IND) and v is not None}
        )
        if len(have) != 1:
            raise ValueError(
                f"top_k({kind}, {language}): name the indicator, these experts have "
                f"{[c[len(IND) :] for c in have] or 'none'}"
            )
        indicator = have[0][len(IND) :]
    col = indicator if indicator.startswith(IND) else f"{IND}{indicator}"
    scored = [r for r in rows if r.get(col) is not None and not math.isnan(r[col])]
    scored.sort(key=lambda r: (-r[col], r["step"], r["expert_id"]))
    return scored[:k]
