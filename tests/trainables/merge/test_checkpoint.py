"""Safetensors reading/writing in byte ranges, header validation, shards, atomic folders."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from layerswap.trainables.atomic import atomic_dir, atomic_write_text
from layerswap.trainables.merge.checkpoint import TAGS, Checkpoint, CheckpointError, read_header
from layerswap.trainables.merge.ops import row_chunks
from layerswap.trainables.merge.shard_writer import OutSpec, ShardWriter


def write_raw(path: Path, header: dict, data: bytes) -> Path:
    """A safetensors file from a header dict and raw data bytes, written by hand."""
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def _bare(msg: str, tmp_path: Path) -> str:
    """The message with the temporary folder (named after the test) blanked out."""
    return msg.replace(str(tmp_path), "<tmp>")


# --- reading ---------------------------------------------------------------------------------


def test_open_single_file_reads_every_tensor_exactly(family):
    path = family.paths["task"]
    want = load_file(path / "model.safetensors")
    with Checkpoint.open(path) as ck:
        assert set(ck.tensors) == set(want)
        assert ck.config["num_hidden_layers"] == 12
        for name, t in want.items():
            info = ck.tensors[name]
            assert info.shape == tuple(t.shape) and info.torch_dtype == t.dtype
            assert info.nbytes == t.numel() * t.element_size()
            got = ck.read(name)
            assert got.shape == t.shape and torch.equal(got, t), name
        sd = {name: ck.read(name) for name in ck.tensors}
    assert set(sd) == set(want)


def test_open_sharded_checkpoint(sharded_family):
    path = sharded_family.paths["language"]
    want = {}
    for f in path.glob("*.safetensors"):
        want.update(load_file(f))
    with Checkpoint.open(path) as ck:
        assert len({i.path for i in ck.tensors.values()}) > 2
        assert set(ck.tensors) == set(want)
        for name, t in want.items():
            assert torch.equal(ck.read(name), t), name


def test_read_element_ranges(family):
    name = "model.layers.2.mlp.down_proj.weight"  # [32, 64]
    want = load_file(family.paths["task"] / "model.safetensors")[name]
    with Checkpoint.open(family.paths["task"]) as ck:
        part = ck.read(name, 64 * 3, 64 * 5)
        assert part.shape == (320,)
        assert torch.equal(part, want[3:8].flatten())
        assert torch.equal(ck.read(name, 64 * 31), want[31])
        assert ck.read(name, 0, 0).numel() == 0


def test_bf16_read(bf16_family):
    want = load_file(bf16_family.paths["base"] / "model.safetensors")
    with Checkpoint.open(bf16_family.paths["base"]) as ck:
        for name, t in want.items():
            got = ck.read(name)
            assert got.dtype == torch.bfloat16 and torch.equal(got, t)


@pytest.mark.parametrize(
    ("shape", "max_elems", "pieces"),
    [
        ((10, 4), 100, [(0, 40)]),
        ((10, 4), 8, [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8)]),
        ((10, 4), 12, [(0, 12), (12, 12), (24, 12), (36, 4)]),
        ((10, 4), 3, [(i * 4, 4) for i in range(10)]),  # never less than a row
        ((1000,), 10, [(0, 1000)]),  # 1-D: one piece (one row for MAV)
        ((), 10, [(0, 1)]),
        ((3, 2, 2), 4, [(0, 4), (4, 4), (8, 4)]),
    ],
)
def test_row_chunks(shape, max_elems, pieces):
    assert list(row_chunks(shape, max_elems)) == pieces


# --- refusing bad files ----------------------------------------------------------------------


def _good(tmp_path: Path) -> Path:
    data = torch.arange(6, dtype=torch.float32).numpy().tobytes()
    header = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
    return write_raw(tmp_path / "m.safetensors", header, data)


def test_read_header_of_a_hand_written_file(tmp_path):
    infos = read_header(_good(tmp_path))
    (info,) = infos.values()
    assert info.name == "w" and info.shape == (2, 3) and info.dtype == "F32"
    assert info.end - info.start == 24


@pytest.mark.parametrize(
    ("header", "data", "needle"),
    [
        (
            {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}},
            b"\0" * 20,
            "truncated",
        ),
        ({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}, b"\0" * 24, "offsets"),
        ({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [8, 4]}}, b"\0" * 24, "offsets"),
        (
            {"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}},
            b"\0",
            "unsupported dtype Q4",
        ),
        ({"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, "malformed header entry"),
        ({"w": [1, 2]}, b"", "malformed header entry"),
        # wrong JSON types are corrupt too, not a TypeError deep inside the reader
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}}, b"\0" * 8, "malformed"),
        ({"w": {"dtype": "F32", "shape": "ab", "data_offsets": [0, 8]}}, b"\0" * 8, "malformed"),
        ({"w": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "malformed"),
        (
            {"w": {"dtype": "F32", "shape": [-1, -2], "data_offsets": [0, 8]}},
            b"\0" * 8,
            "malformed",
        ),
        ({"w": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, b"\0" * 8, "malformed"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8.0]}}, b"\0" * 8, "malformed"),
    ],
)
def test_bad_header_entries_name_file_and_tensor(tmp_path, header, data, needle):
    path = write_raw(tmp_path / "m.safetensors", header, data)
    with pytest.raises(CheckpointError) as e:
        read_header(path)
    assert isinstance(e.value, ValueError)
    assert str(path) in str(e.value)
    assert needle in _bare(str(e.value), tmp_path)
    assert "'w'" in str(e.value)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"", "no header"),
        (b"\x01\x02", "no header"),
        (struct.pack("<Q", 10**6) + b"{}", "claims 1000000 bytes"),
        (struct.pack("<Q", 2**62) + b"{}", "corrupt or truncated"),
        (struct.pack("<Q", 6) + b"\xff\xfe{{{{", "corrupt safetensors header"),
        (struct.pack("<Q", 6) + b'"text"', "not a JSON object"),
    ],
)
def test_corrupt_files_name_the_file(tmp_path, raw, needle):
    path = tmp_path / "m.safetensors"
    path.write_bytes(raw)
    with pytest.raises(CheckpointError) as e:
        read_header(path)
    assert str(path) in str(e.value)
    assert needle in _bare(str(e.value), tmp_path)


def test_truncated_shard_of_a_real_checkpoint(family, tmp_path):
    ck_dir = tmp_path / "ck"
    shutil.copytree(family.paths["task"], ck_dir)
    f = ck_dir / "model.safetensors"
    os.truncate(f, f.stat().st_size - 1)
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(ck_dir)
    assert str(f) in str(e.value)
    assert "is truncated" in _bare(str(e.value), tmp_path)


class _Booby:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.ckpt"])
def test_pickle_only_folder_is_refused_without_loading(tmp_path, monkeypatch, name):
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    marker = tmp_path / "UNPICKLED"
    (folder / name).write_bytes(pickle.dumps(_Booby(marker)))

    def boom(*a, **k):
        raise AssertionError("a pickle was loaded")

    monkeypatch.setattr(torch, "load", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(folder)
    msg = str(e.value)
    assert str(folder) in msg and name in msg
    assert "never loads pickles" in msg
    assert not marker.exists()


def test_safetensors_preferred_over_a_pickle_beside_it(family, tmp_path):
    folder = tmp_path / "ck"
    shutil.copytree(family.paths["task"], folder)
    marker = tmp_path / "UNPICKLED"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Booby(marker)))
    with Checkpoint.open(folder) as ck:
        assert "model.embed_tokens.weight" in ck.tensors
    assert not marker.exists()


def test_folder_problems(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        Checkpoint.open(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):
        Checkpoint.open(empty)
    badcfg = tmp_path / "badcfg"
    shutil.copytree(empty, badcfg)
    _good(badcfg).rename(badcfg / "model.safetensors")
    (badcfg / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(badcfg)
    assert str(badcfg / "config.json") in str(e.value) and "invalid JSON" in str(e.value)


def test_index_problems(sharded_family, tmp_path):
    folder = tmp_path / "ck"
    shutil.copytree(sharded_family.paths["task"], folder)
    index = folder / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    victim = sorted(set(weight_map.values()))[3]
    (folder / victim).unlink()
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(folder)
    assert str(index) in str(e.value) and victim in str(e.value)

    index.write_text("{broken")
    with pytest.raises(CheckpointError, match="not a valid safetensors index"):
        Checkpoint.open(folder)


def test_tensor_in_two_shards_is_refused(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    t = {"w": torch.ones(2)}
    save_file(t, folder / "a.safetensors")
    save_file(t, folder / "b.safetensors")
    index = {"metadata": {}, "weight_map": {"w": "a.safetensors", "x": "b.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"tensor 'w' also in"):
        Checkpoint.open(folder)


# --- writing ---------------------------------------------------------------------------------


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(10, 8, generator=g),  # 320 B
        "b": torch.randn(7, generator=g).to(torch.bfloat16),  # 14 B
        "c": torch.randn(30, 4, generator=g),  # 480 B
        "d": torch.arange(5, dtype=torch.int64),  # 40 B
        "e": torch.randn(3, 3, generator=g).to(torch.float16),  # 18 B
    }


def _write(out: Path, tensors: dict, max_bytes: int) -> ShardWriter:

    specs = [OutSpec(n, TAGS[t.dtype], tuple(t.shape)) for n, t in tensors.items()]
    w = ShardWriter(out, specs, max_bytes).open()
    for n, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes()
        # in two pieces, as the engine streams rows
        w.write(n, raw[: len(raw) // 2])
        w.write(n, raw[len(raw) // 2 :])
    w.close()
    return w


def test_shard_writer_single_file(tmp_path):
    tensors = _tensors()
    _write(tmp_path, tensors, 10**6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    got = load_file(tmp_path / "model.safetensors")
    assert set(got) == set(tensors)
    for n, t in tensors.items():
        assert got[n].dtype == t.dtype and torch.equal(got[n], t)
    # data section starts 8-byte aligned
    (n,) = struct.unpack("<Q", (tmp_path / "model.safetensors").read_bytes()[:8])
    assert (8 + n) % 8 == 0
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_shard_writer_several_shards_and_index(tmp_path):
    tensors = _tensors()
    w = _write(tmp_path, tensors, 400)
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in range(1, 4)]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in tensors.values()
    )
    assert w.total_bytes == index["metadata"]["total_size"]
    # greedy in order: [a b] 334 B | [c] 480 B, alone since above the limit | [d e] 58 B
    assert index["weight_map"] == {
        "a": files[0],
        "b": files[0],
        "c": files[1],
        "d": files[2],
        "e": files[2],
    }
    got = {}
    for f in files:
        part = load_file(tmp_path / f)
        assert all(index["weight_map"][k] == f for k in part)
        got.update(part)
    for n, t in tensors.items():
        assert torch.equal(got[n], t)


def test_shard_writer_misuse(tmp_path):
    spec = [OutSpec("a", "F32", (2,)), OutSpec("b", "F32", (2,))]
    with pytest.raises(RuntimeError, match=r"not open \(call open\(\)\) for tensor 'a'"):
        ShardWriter(tmp_path, spec, 100).write("a", b"\0" * 8)
    assert not list(tmp_path.iterdir())  # nothing is created before open()
    w = ShardWriter(tmp_path, spec, 100).open()
    with pytest.raises(RuntimeError, match="unknown tensor 'z'"):
        w.write("z", b"\0" * 8)
    w = ShardWriter(tmp_path, spec, 100).open()
    with pytest.raises(RuntimeError, match="too many bytes"):
        w.write("a", b"\0" * 12)
    w = ShardWriter(tmp_path, spec, 100).open()
    w.write("a", b"\0" * 8)
    with pytest.raises(RuntimeError, match="1 tensors not written"):
        w.close()


def test_shard_writer_any_order(tmp_path):
    """Tensors may be written in any order (the engine copies and computes on two threads)."""
    tensors = _tensors()
    specs = [OutSpec(n, TAGS[t.dtype], tuple(t.shape)) for n, t in tensors.items()]
    w = ShardWriter(tmp_path, specs, 400).open()
    for n in reversed(list(tensors)):
        w.write(n, tensors[n].contiguous().view(torch.uint8).numpy().tobytes())
    w.close()
    got = {}
    for f in tmp_path.glob("*.safetensors"):
        got.update(load_file(f))
    assert all(torch.equal(got[n], t) for n, t in tensors.items())


# --- atomic folders --------------------------------------------------------------------------


def test_atomic_dir_success_and_failure(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.tmp-")
        (tmp / "f").write_text("1")
        assert not out.exists()
    assert (out / "f").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]

    with pytest.raises(FileExistsError, match="already exists"):
        with atomic_dir(out):
            pass
    with pytest.raises(KeyError):
        with atomic_dir(out, overwrite=True) as tmp:
            (tmp / "g").write_text("2")
            raise KeyError("boom")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (out / "f").read_text() == "1"  # the old output survives a failed overwrite

    with atomic_dir(out, overwrite=True) as tmp:
        (tmp / "g").write_text("2")
    assert [p.name for p in out.iterdir()] == ["g"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_write_text(tmp_path):
    p = tmp_path / "x.txt"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert [q.name for q in tmp_path.iterdir()] == ["x.txt"]
