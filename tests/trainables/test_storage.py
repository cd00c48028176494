"""layerswap.trainables.storage: URI rules, the download cache (hits and misses by size and ETag), atomic
downloads and uploads, and errors that name the URI. Remote cases run against a real moto S3.

Run: .venv/bin/python -m pytest -q tests/trainables/test_storage.py
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from layerswap.trainables import storage


def _folder(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture
def fetches(monkeypatch) -> list[str]:
    """Every object `local_copy` downloads (a spy on the download step; the store is real)."""
    seen: list[str] = []
    real = storage._fetch

    def spy(fs, info, dest):
        seen.append(info.path)
        return real(fs, info, dest)

    monkeypatch.setattr(storage, "_fetch", spy)
    return seen


def test_uri_rules(tmp_path):
    assert storage.is_uri("s3://b/k") and storage.is_uri("gs://b/k") and storage.is_uri("file:///x")
    assert not storage.is_uri("/tmp/x") and not storage.is_uri("org/model") and not storage.is_uri(None)  # fmt: skip
    assert storage.join("s3://b/run/", "ck", "config.json") == "s3://b/run/ck/config.json"
    assert storage.join(tmp_path, "a", "b") == str(tmp_path / "a" / "b")
    assert storage.absolute("s3://b/run/") == "s3://b/run"
    assert storage.is_under("s3://b/run/t1/ck", "s3://b/run") and not storage.is_under("s3://b/run2", "s3://b/run")  # fmt: skip
    assert storage.is_under(tmp_path / "a", tmp_path) and not storage.is_under("s3://b/x", tmp_path)
    assert storage.uri_of("s3://b/run", "b/run/ck") == "s3://b/run/ck"


def test_local_paths_pass_through_unchanged(tmp_path):
    src = _folder(tmp_path / "ck", {"config.json": b"{}"})
    assert storage.local_copy(str(src)) == src  # no copy
    assert storage.local_copy(f"file://{src}") == src
    assert storage.read_text(src / "config.json") == "{}"
    assert storage.exists(src) and not storage.exists(tmp_path / "nope")
    assert storage.list_files(src) == [str(src / "config.json")]


def test_unknown_scheme_is_a_value_error_naming_the_uri():
    with pytest.raises(ValueError, match=r"hf://org/m: unknown storage scheme 'hf'"):
        storage.local_copy("hf://org/m")


def test_cache_hits_and_misses_by_size_and_etag(s3, tmp_path, fetches):
    src = _folder(tmp_path / "ck", {"a.bin": b"x" * 10, "sub/b.json": b"{}", "c.txt": b"old"})
    uri = storage.upload_dir(src, storage.join(s3.bucket(), "run", "ck"))
    first = storage.local_copy(uri)
    assert sorted(Path(p).name for p in fetches) == ["a.bin", "b.json", "c.txt"]
    assert (first / "sub" / "b.json").read_bytes() == b"{}" and first.is_relative_to(storage.cache_dir())  # fmt: skip

    fetches.clear()
    assert storage.local_copy(uri) == first and fetches == []  # unchanged: nothing downloaded

    (src / "a.bin").write_bytes(b"y" * 12)  # a new size
    (src / "c.txt").write_bytes(b"new")  # same size, new content: only the ETag tells
    (src / "sub" / "b.json").unlink()
    storage.upload_dir(src, uri)
    assert storage.local_copy(uri) == first
    assert sorted(Path(p).name for p in fetches) == ["a.bin", "c.txt"]
    assert (first / "a.bin").read_bytes() == b"y" * 12 and (first / "c.txt").read_text() == "new"
    assert not (first / "sub" / "b.json").exists()  # gone from the store, gone from the copy

    one = storage.local_copy(storage.join(uri, "c.txt"))  # a single object
    assert one.name == "c.txt" and one.read_text() == "new"


def test_readers_skip_a_checkpoints_trainer_state(s3, tmp_path, fetches):
    src = _folder(tmp_path / "ck", {"model.safetensors": b"w", "trainer_state/master.safetensors": b"m" * 6})  # fmt: skip
    uri = storage.upload_dir(src, storage.join(s3.bucket(), "run", "skip"))
    got = storage.local_copy(uri)
    assert [Path(p).name for p in fetches] == ["model.safetensors"]
    assert not (got / "trainer_state").exists()
    fetches.clear()
    storage.local_copy(uri, skip=())  # everything, when asked
    assert [Path(p).name for p in fetches] == ["master.safetensors"]


def test_cache_location_follows_layerswap_cache(s3, tmp_path, monkeypatch):
    uri = storage.upload_dir(_folder(tmp_path / "ck", {"x": b"1"}), storage.join(s3.bucket(), "ck"))
    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "elsewhere"))
    assert storage.local_copy(uri).is_relative_to(tmp_path / "elsewhere")
    monkeypatch.delenv("LAYERSWAP_CACHE")
    assert storage.cache_dir() == Path.home() / ".cache" / "layerswap" / "storage"


def test_mtime_and_size_decide_where_the_store_has_no_etag(tmp_path):
    import pyarrow.fs as pafs

    f = _folder(tmp_path, {"w": b"abc"}) / "w"
    fs = pafs.LocalFileSystem()
    before = storage._signature(fs, fs.get_file_info(str(f)))
    assert set(before) == {"size", "mtime_ns"}
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert storage._signature(fs, fs.get_file_info(str(f))) != before


def test_download_is_atomic(s3, tmp_path, monkeypatch):
    """A download that fails half-way leaves no partial file where readers look, and the
    next call fetches it whole."""
    src = _folder(tmp_path / "ck", {"model.safetensors": b"w" * 1000, "config.json": b"{}"})
    uri = storage.upload_dir(src, storage.join(s3.bucket(), "ck"))
    real = storage.shutil.copyfileobj

    def broken(fsrc, fdst, length=0):
        fdst.write(fsrc.read(100))
        raise ConnectionError("network gone")

    monkeypatch.setattr(storage.shutil, "copyfileobj", broken)
    with pytest.raises(storage.StorageError, match=f"{uri}: network gone"):
        storage.local_copy(uri)
    data = storage._entry(uri) / "data"
    assert not (data / "model.safetensors").exists() and not (data / "config.json").exists()
    assert not [p for p in data.rglob("*") if p.is_file()], "a temp file was left behind"
    monkeypatch.setattr(storage.shutil, "copyfileobj", real)
    assert (storage.local_copy(uri) / "model.safetensors").read_bytes() == b"w" * 1000


def test_upload_writes_the_marker_last_and_replaces_stale_objects(s3, tmp_path, monkeypatch):
    import pyarrow.fs as pafs

    src = _folder(tmp_path / "ck", {"layerswap_train.json": b"{}", "a": b"1", "z": b"2"})
    bucket = s3.bucket()
    uri = storage.join(bucket, "ck")
    order: list[str] = []
    real = pafs.copy_files

    def spy(source, destination, **kw):
        order.append(Path(source).name)
        # the marker never exists while another file is still missing
        if Path(source).name != "layerswap_train.json":
            assert not storage.exists(storage.join(uri, "layerswap_train.json"))
        return real(source, destination, **kw)

    monkeypatch.setattr(pafs, "copy_files", spy)
    storage.upload_dir(src, uri)
    assert order[-1] == "layerswap_train.json" and sorted(order) == ["a", "layerswap_train.json", "z"]  # fmt: skip
    (src / "a").unlink()
    order.clear()
    storage.upload_dir(src, uri)  # again, into the existing folder: the marker is taken away first
    assert storage.list_files(uri) == [storage.join(uri, n) for n in ("layerswap_train.json", "z")]
    assert storage.list_dirs(bucket) == [uri]


def test_upload_to_a_local_folder_is_atomic(tmp_path):
    src = _folder(tmp_path / "ck", {"a": b"1"})
    dest = tmp_path / "out" / "ck"
    _folder(dest, {"old": b"0"})
    assert storage.upload_dir(src, dest) == str(dest)
    assert sorted(p.name for p in dest.iterdir()) == ["a"]
    assert [p.name for p in dest.parent.iterdir()] == ["ck"]  # no temp folder left
    assert storage.upload_dir(src, f"file://{tmp_path}/out2") == f"file://{tmp_path}/out2"
    assert (tmp_path / "out2" / "a").read_bytes() == b"1"
    with pytest.raises(FileNotFoundError, match="nope: no such folder to upload"):
        storage.upload_dir(tmp_path / "nope", dest)


def test_errors_name_the_uri_and_what_is_wrong(s3, monkeypatch):
    bucket = s3.bucket()
    with pytest.raises(FileNotFoundError, match=f"{bucket}/nope: no such object or folder"):
        storage.local_copy(f"{bucket}/nope")
    with pytest.raises(
        FileNotFoundError,
        match=re.escape("s3://no-such-bucket-x/k: no such bucket 'no-such-bucket-x'"),
    ):
        storage.list_files("s3://no-such-bucket-x/k")
    with pytest.raises(FileNotFoundError, match=f"{bucket}/missing.json: no such object"):
        storage.read_text(f"{bucket}/missing.json")
    assert not storage.exists(f"{bucket}/nope")


def test_credential_errors_say_so():
    """A store's refusal is reported as a credentials problem with the variables to set
    (the message pyarrow gives for a 403; moto accepts any key, so it is not provoked here)."""
    said = "When getting information for key 'k' in bucket 'b': AWS Error ACCESS_DENIED"
    e = storage._explain(
        "s3://b/k", OSError(f"{said} during HeadObject operation: No response body.")
    )
    assert isinstance(e, PermissionError)
    assert str(e).startswith("s3://b/k: access denied: no or wrong credentials?")
    assert "AWS_ACCESS_KEY_ID" in str(e)


def test_marker_is_the_training_manifest():
    from layerswap.trainables.train.state import MANIFEST

    assert storage.MARKERS == (MANIFEST,)


def test_training_data_may_live_in_storage(s3, tmp_path):
    """A dataset `path` that is a URI is read from its local copy; `layerswap train` checks
    that it exists before any work."""
    from layerswap.cli.train import check_inputs
    from layerswap.spaces.train_experiment import DatasetSpec, parse_train_experiment
    from layerswap.trainables.train.data import load_pairs

    src = _folder(tmp_path / "d", {"math.jsonl": b'{"question": "1+1?", "answer": "2"}\n'})
    bucket = s3.bucket()
    uri = storage.join(storage.upload_dir(src, storage.join(bucket, "d")), "math.jsonl")
    assert load_pairs(DatasetSpec(path=uri)) == [("1+1?", "2")]
    exp = parse_train_experiment(
        {
            "name": "t",
            "base": "org/model",  # a Hub id: not checked offline
            "kind": "math",
            "language": "en",
            "datasets": [{"path": uri}, {"path": f"{bucket}/d/nope.jsonl"}],
            "mode": "mix",
            "hyper": {"lr": 1e-4, "batch_size": 8, "max_steps": 1},
        },
        source="test",
    )
    with pytest.raises(ValueError, match=re.escape(f"datasets[1].path: {bucket}/d/nope.jsonl does not exist")):  # fmt: skip
        check_inputs(exp)
