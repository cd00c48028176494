"""The expert registry: Parquet round trip, atomic append/replace, validation, top_k.

Run: .venv/bin/python -m pytest -q tests/search/test_registry.py
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from layerswap.experts.registry import (
    COLUMNS,
    append_rows,
    expert_id,
    read_registry,
    read_rows,
    registry_path,
    top_k,
    write_registry,
)

T = "world_mgsm_direct_en_dev"
B = "world_belebele_xa_dev"


def row(trial: str, step: int, score: float | None, *, kind="math", lang="en", task=T, **kw):
    r = {
        "expert_id": expert_id("exp", trial, step),
        "kind": kind,
        "language": lang,
        "mode": "full",
        "path": f"/runs/train/exp/{trial}/checkpoints/samples_{step:09d}",
        "base": "/world/base",
        "trial_id": trial,
        "step": step,
        "samples": step * 4,
        "seed": 7,
        "hparams": '{"lr": 0.001}',
        f"ind__{task}": score,
        f"n_items__{task}": 20,
    }
    r.update(kw)
    return r


def test_round_trip_and_schema(tmp_path):
    path = registry_path(tmp_path)
    assert path == tmp_path / "experts" / "registry.parquet"
    rows = [row("t1", 4, 0.25), row("t1", 8, 0.5), row("t2", 4, None)]
    append_rows(path, rows)
    table = read_registry(path)
    assert table.column_names == [*COLUMNS, f"ind__{T}", f"n_items__{T}"]
    assert table.schema.field("step").type == pa.int64()
    assert table.schema.field(f"ind__{T}").type == pa.float64()
    assert table.schema.field(f"n_items__{T}").type == pa.int64()
    assert read_rows(path) == rows
    assert not list(path.parent.glob(".registry.parquet.tmp-*"))


def test_append_adds_columns_and_replaces_same_id(tmp_path):
    path = registry_path(tmp_path)
    append_rows(path, [row("t1", 4, 0.25)])
    append_rows(path, [row("t9", 4, 0.3, kind="language", lang="xa", task=B)])
    append_rows(path, [row("t1", 4, 0.75)])  # re-scored: replaces, never duplicates
    rows = {r["expert_id"]: r for r in read_rows(path)}
    assert len(rows) == 2
    assert rows[expert_id("exp", "t1", 4)][f"ind__{T}"] == 0.75
    lang = rows[expert_id("exp", "t9", 4)]
    assert lang[f"ind__{B}"] == 0.3 and lang[f"ind__{T}"] is None


def test_concurrent_appends_keep_every_row(tmp_path):
    path = registry_path(tmp_path)
    threads = [
        threading.Thread(target=append_rows, args=(path, [row(f"t{i}", 4, i / 10)]))
        for i in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r["trial_id"] for r in read_rows(path)) == [f"t{i}" for i in range(6)]


def test_expert_id_is_stable():
    assert expert_id("exp", "t1", 4) == expert_id("exp", "t1", 4)
    assert len(expert_id("exp", "t1", 4)) == 12
    assert expert_id("exp", "t1", 4) != expert_id("exp", "t1", 8)


def _bad_file(tmp_path, table: pa.Table):
    path = tmp_path / "registry.parquet"
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda t: t.drop_columns(["seed"]), "missing column 'seed'"),
        (lambda t: t.set_column(t.column_names.index("step"), "step", pa.array(["4"])), "'step'"),
        (lambda t: t.append_column("notes", pa.array(["x"])), "unexpected column 'notes'"),
        (lambda t: t.drop_columns([f"n_items__{T}"]), f"n_items__{T}"),
        (lambda t: t.set_column(1, "kind", pa.array(["maths"])), "'kind'"),
        (lambda t: t.set_column(3, "mode", pa.array(["qlora"])), "'mode'"),
    ],
)
def test_validation_names_file_and_column(tmp_path, mutate, match):
    good = write_registry(tmp_path / "good.parquet", [row("t1", 4, 0.5)])
    path = _bad_file(tmp_path, mutate(good))
    with pytest.raises(ValueError, match=match) as err:
        read_registry(path)
    assert str(path) in str(err.value)


def test_bad_rows_are_refused_before_writing(tmp_path):
    path = registry_path(tmp_path)
    with pytest.raises(ValueError, match="'step'"):
        append_rows(path, [{**row("t1", 4, 0.5), "step": "four"}])
    with pytest.raises(ValueError, match="duplicates"):
        append_rows(path, [row("t1", 4, 0.5), row("t1", 4, 0.6)])
    assert not path.exists()
    with pytest.raises(ValueError, match="no expert registry"):
        read_registry(path)


def test_top_k(tmp_path):
    path = registry_path(tmp_path)
    append_rows(
        path,
        [
            row("t1", 4, 0.25),
            row("t1", 8, 0.5),
            row("t2", 4, 0.5),
            row("t3", 4, None),
            row("t4", 4, 0.9, lang="xa"),
            row("l1", 4, 0.4, kind="language", lang="xa", task=B),
        ],
    )
    best = top_k(path, "math", "en", T, k=2)
    assert [(r["trial_id"], r["step"]) for r in best] == [("t2", 4), ("t1", 8)]  # tie: lower step
    assert [r["trial_id"] for r in top_k(path, "math", "en", f"ind__{T}", k=5)] == ["t2", "t1", "t1"]  # fmt: skip
    assert [r["trial_id"] for r in top_k(path, "language", "xa")] == ["l1"]
    assert top_k(path, "math", "en", T, k=1, mode="lora") == []
    with pytest.raises(ValueError, match="kind"):
        top_k(path, "maths", "en", T)
