"""Where checkpoints live: local folders or cloud URIs (s3://, gs://, file://), read and written alike.

The one module that knows about URIs. `local_copy(uri)` downloads a remote folder or file into a
local cache (reused while the objects are unchanged) so everything else reads local files;
`upload_dir(local, uri)` writes a folder with its marker file last. S3 endpoints and credentials
come from the usual AWS variables (pyarrow reads AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 itself).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from layerswap.spaces.base import is_uri, uri_scheme
from layerswap.trainables.atomic import atomic_dir, atomic_write, atomic_write_text

SCHEMES = ("file", "gs", "gcs", "s3")
CACHE_ENV = "LAYERSWAP_CACHE"
INDEX = "index.json"  # per cache entry: relative path -> the object's signature when fetched
# Written last by `upload_dir`: a checkpoint is complete once its manifest is there. The name is
# trainables.train.state.MANIFEST (a literal here: that module imports torch).
MARKERS = ("layerswap_train.json",)
_CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL "
    "for an S3-compatible store",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS",
}


def scheme(path: str | os.PathLike) -> str | None:
    """The URI scheme of `path` ("s3", "gs", "file"), or None for a plain local path."""
    return uri_scheme(path)


def join(base: str | os.PathLike, *parts: str) -> str:
    """`base` joined with `parts`: "/"-joined for a URI, os.path rules for a local path."""
    if not is_uri(base):
        return str(Path(base, *parts))
    return "/".join([str(base).rstrip("/"), *(p.strip("/") for p in parts)])


def absolute(path: str | os.PathLike) -> str:
    """A URI as written (trailing "/" dropped); a local path made absolute."""
    return str(path).rstrip("/") if is_uri(path) else str(Path(path).expanduser().resolve())


def is_under(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether `path` is `folder` or lies inside it (URIs compare by prefix, paths resolved)."""
    if is_uri(path) or is_uri(folder):
        p, f = absolute(path), absolute(folder)
        return p == f or p.startswith(f + "/")
    return Path(absolute(path)).is_relative_to(absolute(folder))


def filesystem(uri: str):
    """The pyarrow filesystem of a URI and the path inside it (what Ray's RunConfig takes).

    Args:
        uri: s3://bucket/key, gs://bucket/key or file:///path.
    Returns:
        (pyarrow.fs.FileSystem, path): e.g. (S3FileSystem, "bucket/key").
    Raises:
        ValueError: not a URI, or a scheme this project does not read.
    """
    import pyarrow.fs as pafs

    s = scheme(uri)
    if s not in SCHEMES:
        raise ValueError(
            f"{uri}: unknown storage scheme {s!r} (expected a local path or one of "
            f"{', '.join(x + '://' for x in SCHEMES)})"
        )
    try:
        return pafs.FileSystem.from_uri(str(uri).rstrip("/"))
    except Exception as e:  # unparsable URI, missing GCS/S3 support: name the URI
        raise _explain(uri, e) from None


class StorageError(OSError):
    """A store's error, naming the URI and what is wrong."""


class StorageNotFoundError(StorageError, FileNotFoundError):
    """No such object, folder or bucket."""


class StoragePermissionError(StorageError, PermissionError):
    """Access denied: no or wrong credentials."""


def _explain(uri: str, e: BaseException) -> StorageError:
    """One error naming `uri` and what is wrong (missing object, credentials, the store's own)."""
    text = str(e)
    low = text.lower()
    if "no_such_bucket" in low or ("bucket" in low and ("not found" in low or "not exist" in low)):
        return StorageNotFoundError(f"{uri}: no such bucket ({text})")
    if isinstance(e, FileNotFoundError) or "no_such_key" in low or "not found" in low:
        return StorageNotFoundError(f"{uri}: no such object or folder ({text})")
    denied = ("access_denied", "accessdenied", "forbidden", "http status 403", "credential",
              "invalidaccesskeyid", "signaturedoesnotmatch", "unauthorized", "http status 401")  # fmt: skip
    if isinstance(e, PermissionError) or any(d in low for d in denied):
        need = _CREDENTIALS.get(scheme(uri) or "", "the store's credentials")
        return StoragePermissionError(
            f"{uri}: access denied: no or wrong credentials? (set {need}) ({text})"
        )
    return StorageError(f"{uri}: {text}")


@contextlib.contextmanager
def _store_errors(uri: str) -> Iterator[None]:
    """pyarrow's errors (OSError, ArrowInvalid) re-raised as `_explain` says; ours pass."""
    try:
        yield
    except StorageError:
        raise
    except Exception as e:
        raise _explain(uri, e) from None


def _missing(uri: str, fs, path: str, what: str = "object or folder") -> StorageNotFoundError:
    """The error for a URI that names nothing: its bucket is missing, or the object is."""
    bucket = path.strip("/").split("/")[0]
    if bucket != path.strip("/") and scheme(uri) != "file":
        with _store_errors(uri):
            gone = fs.get_file_info(bucket).type.name == "NotFound"
        if gone:
            return StorageNotFoundError(f"{uri}: no such bucket {bucket!r}")
    return StorageNotFoundError(f"{uri}: no such {what}")


def _info(uri: str):
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    with _store_errors(uri):
        return fs, path, fs.get_file_info(path), pafs


def exists(path: str | os.PathLike) -> bool:
    """Whether a local path, or an object or folder (prefix) at a URI, exists.

    Args:
        path: a local path or URI.
    Returns:
        True if there is something; False for a missing object or bucket.
    Raises:
        StorageError naming the URI when the store cannot be asked (credentials, network).
    """
    if not is_uri(path):
        return Path(path).expanduser().exists()
    _, _, info, pafs = _info(str(path))
    return info.type != pafs.FileType.NotFound


def list_files(path: str | os.PathLike) -> list[str]:
    """Every file under a folder (recursively), as paths or URIs like `path`, sorted.

    Args:
        path: a local folder or a URI (a single object lists itself).
    Returns:
        the files' paths or URIs.
    Raises:
        FileNotFoundError naming `path` when there is no such folder.
    """
    return [join(path, rel) for rel in sorted(_listing(str(path)))]


def file_sizes(path: str | os.PathLike) -> dict[str, int]:
    """Bytes of every file under a folder (recursively), by path relative to it.

    Args:
        path: a local folder or a URI (a single object lists itself).
    Returns:
        relative path -> size in bytes.
    Raises:
        FileNotFoundError naming `path` when there is no such folder.
    """
    listing = _listing(str(path))
    if not is_uri(path):
        return {rel: p.stat().st_size for rel, p in listing.items()}
    return {rel: int(info.size) for rel, info in listing.items()}


def list_dirs(path: str | os.PathLike) -> list[str]:
    """The immediate subfolders of a folder, as paths or URIs like `path`, sorted.

    Args:
        path: a local folder or a URI.
    Returns:
        the subfolders' paths or URIs.
    """
    if not is_uri(path):
        return sorted(str(p) for p in Path(path).iterdir() if p.is_dir())
    fs, root, info, pafs = _info(str(path))
    if info.type != pafs.FileType.Directory:
        raise _missing(str(path), fs, root, "folder")
    with _store_errors(str(path)):
        found = fs.get_file_info(pafs.FileSelector(root, recursive=False))
    return sorted(join(path, PurePosixPath(i.path).name) for i in found if i.type == pafs.FileType.Directory)  # fmt: skip


def _listing(uri: str) -> dict[str, object]:
    """Relative path -> pyarrow FileInfo of every file under a folder (or the file itself)."""
    if not is_uri(uri):
        root = Path(uri)
        if not root.is_dir():
            raise StorageNotFoundError(f"{uri}: no such folder")
        return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file()}
    fs, root, info, pafs = _info(uri)
    if info.type == pafs.FileType.File:
        return {PurePosixPath(root).name: info}
    if info.type != pafs.FileType.Directory:
        raise _missing(uri, fs, root)
    with _store_errors(uri):
        found = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    n = len(root.rstrip("/")) + 1
    return {i.path[n:]: i for i in found if i.type == pafs.FileType.File}


def read_text(path: str | os.PathLike) -> str:
    """A UTF-8 text file at a local path or URI (e.g. a checkpoint's config.json).

    Args:
        path: the file.
    Returns:
        its text.
    Raises:
        FileNotFoundError (StorageNotFoundError for a URI) naming the file when it is missing.
    """
    if not is_uri(path):
        return Path(path).expanduser().read_text(encoding="utf-8")
    fs, p = filesystem(str(path))
    with _store_errors(str(path)), fs.open_input_stream(p) as f:
        return f.read().decode("utf-8")


def upload_dir(local: str | os.PathLike, dest: str | os.PathLike, *, last: tuple[str, ...] = MARKERS) -> str:  # fmt: skip
    """Copy a local folder to `dest` so a reader never takes a half copy for a whole one.

    A local `dest` is built beside and renamed into place. An object store has no folder
    rename: the files named in `last` (the marker readers wait for) are removed first and
    written after everything else, and objects the folder no longer has are deleted.

    Args:
        local: the folder to copy.
        dest: a local folder or a URI (replaced if it exists).
        last: file names (relative paths) written last.
    Returns:
        `dest` as a string.
    """
    import pyarrow.fs as pafs

    local = Path(local)
    if not local.is_dir():
        raise FileNotFoundError(f"{local}: no such folder to upload")
    files = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    fs, root = filesystem(str(dest)) if is_uri(dest) else (None, str(dest))
    if fs is None or isinstance(fs, pafs.LocalFileSystem):  # a real folder rename: atomic
        with atomic_dir(Path(root), overwrite=True) as tmp:
            shutil.copytree(local, tmp, dirs_exist_ok=True)
        return str(dest)
    uri = str(dest)
    with _store_errors(uri):
        old = _listing(uri) if exists(uri) else {}
        for rel in (r for r in last if r in old):  # no marker while the folder is changing
            fs.delete_file(f"{root}/{rel}")
        for rel in (f for f in files if f not in last):
            pafs.copy_files(str(local / rel), f"{root}/{rel}", destination_filesystem=fs)
        for stale in sorted(set(old) - set(files) - set(last)):
            fs.delete_file(f"{root}/{stale}")
        for rel in (f for f in files if f in last):
            pafs.copy_files(str(local / rel), f"{root}/{rel}", destination_filesystem=fs)
    return uri


def cache_dir() -> Path:
    """The download cache: $LAYERSWAP_CACHE, else ~/.cache/layerswap/storage."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "layerswap" / "storage"


def _entry(uri: str) -> Path:
    # One entry per URI and S3 endpoint: the same bucket name on two stores is two things.
    where = "\0".join([absolute(uri), os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""])  # fmt: skip
    name = PurePosixPath(absolute(uri)).name or "root"
    return cache_dir() / f"{hashlib.sha256(where.encode()).hexdigest()[:20]}-{name[:40]}"


@contextlib.contextmanager
def _locked(entry: Path) -> Iterator[None]:
    # Trials on one node copy the same expert at once: one downloads, the others then find it.
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _signature(fs, info, meta: dict | None = None) -> dict:
    """What identifies an object's content: its ETag and size, else its mtime and size."""
    if meta is None:
        try:
            with fs.open_input_file(info.path) as f:
                meta = f.metadata()
        except Exception:  # no metadata from this store: mtime and size decide
            meta = {}
    etag = meta.get("ETag") or meta.get(b"ETag")
    if etag:
        return {"size": info.size, "etag": etag.decode() if isinstance(etag, bytes) else etag}
    return {"size": info.size, "mtime_ns": info.mtime_ns}


def _fetch(fs, info, dest: Path) -> dict:
    """Download one object to `dest` atomically; returns its signature as read."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    meta: dict = {}

    def write(tmp: Path) -> None:
        with fs.open_input_stream(info.path) as src, open(tmp, "wb") as out:
            meta.update(src.metadata() or {})
            shutil.copyfileobj(src, out, 16 << 20)

    atomic_write(dest, write)
    return _signature(fs, info, meta)


# What readers of an expert never need: a training checkpoint's resumable state (fp32 masters,
# AdamW moments, DCP shards) is ~6x its weights (~96 GB beside 16 GB at 8B).
READ_SKIP = ("trainer_state/",)


def local_copy(path: str | os.PathLike, skip: tuple[str, ...] = READ_SKIP) -> Path:
    """A local path holding `path`: local paths as they are, URIs downloaded into the cache.

    A URI's folder (or single object) is mirrored under `cache_dir()`; an object is fetched
    again only when its signature (ETag and size, else mtime and size) changed, objects gone
    from the store are removed, and each file is written atomically (temp, then rename).

    Args:
        path: a local path, file:// URI, or a remote folder or object URI.
        skip: relative-path prefixes inside a folder not to download (default: the trainer
            state of a training checkpoint); `()` mirrors everything.
    Returns:
        the local folder or file.
    Raises:
        FileNotFoundError / PermissionError / OSError naming the URI; ValueError for a scheme
        this project does not read.
    """
    if not is_uri(path):
        return Path(path)
    uri = str(path)
    fs, root, info, pafs = _info(uri)
    if isinstance(fs, pafs.LocalFileSystem):
        return Path(root)
    if info.type == pafs.FileType.NotFound:
        raise _missing(uri, fs, root)
    entry = _entry(uri)
    data = entry / "data"
    with _locked(entry), _store_errors(uri):
        index_path = entry / INDEX
        have = json.loads(index_path.read_text()) if index_path.is_file() else {}
        want = {r: o for r, o in _listing(uri).items() if not r.startswith(skip)}
        for rel in sorted(set(have) - set(want)):  # gone from the store: gone here
            (data / rel).unlink(missing_ok=True)
            have.pop(rel)
        for rel, obj in sorted(want.items()):
            if rel in have and (data / rel).is_file() and have[rel] == _signature(fs, obj):
                continue
            have[rel] = _fetch(fs, obj, data / rel)
            # after every object: an interrupted copy of a big checkpoint resumes where it was
            _write_index(index_path, have)
        _write_index(index_path, have)
    return data / PurePosixPath(root).name if info.type == pafs.FileType.File else data


def _write_index(path: Path, index: dict) -> None:

    atomic_write_text(path, json.dumps(index, indent=1, sort_keys=True))


def uri_of(like: str, fs_path: str) -> str:
    """The URI of a path inside the filesystem of `like` (e.g. Ray's checkpoint.path).

    Args:
        like: a URI of the same store ("s3://bucket/run").
        fs_path: the path as pyarrow names it ("bucket/run/ckpt").
    """
    s = scheme(like)
    return f"file://{fs_path}" if s == "file" else f"{s}://{str(fs_path).lstrip('/')}"
