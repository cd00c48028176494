"""Safetensors checkpoints read and written in byte ranges, so a merge never holds a whole model.

`Checkpoint.open(dir)` validates every shard's header up front (truncation, bad offsets, pickle
files); `ShardWriter` streams tensors into HF-style shards with an index.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from layerswap.trainables.merge.threads import signals_blocked

# safetensors dtype tag -> (torch dtype, bytes per element)
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}
TAGS = {dt: tag for tag, (dt, _) in DTYPES.items()}
FLOAT_TAGS = {"F64", "F32", "F16", "BF16"}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors")
MAX_HEADER = 100 * 1024 * 1024  # the safetensors spec's own limit


class CheckpointError(ValueError):
    """A checkpoint that cannot be read safely; the message names the file and tensor."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes are: file, dtype tag, shape, absolute [start, end) offsets."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype][0]

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and check one .safetensors file's header without reading its data.

    Raises:
        CheckpointError naming the file (and tensor) for a truncated or corrupt file.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or 8 + n > size:
            raise CheckpointError(
                f"{path}: corrupt or truncated safetensors header (claims {n} bytes, file has {size})"
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: corrupt safetensors header: {e}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    data_start, data_len = 8 + n, size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            tag, shape, (lo, hi) = meta["dtype"], tuple(meta["shape"]), meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name!r}: malformed header entry") from None
        # JSON of the wrong types (strings, floats, negative sizes) is as corrupt as bad JSON.
        if not (
            isinstance(tag, str)
            and all(type(d) is int and d >= 0 for d in shape)
            and type(lo) is int
            and type(hi) is int
        ):
            raise CheckpointError(f"{path}: tensor {name!r}: malformed header entry")
        if tag not in DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r}: unsupported dtype {tag}")
        if hi > data_len:
            raise CheckpointError(
                f"{path}: tensor {name!r} ends at byte {hi} of a {data_len}-byte data section: "
                f"the file is truncated"
            )
        if not 0 <= lo <= hi or hi - lo != math.prod(shape) * DTYPES[tag][1]:
            raise CheckpointError(
                f"{path}: tensor {name!r}: offsets [{lo}, {hi}) do not match shape {list(shape)} {tag}"
            )
        out[name] = TensorInfo(name, path, tag, shape, data_start + lo, data_start + hi)
    return out


def find_weights(root: Path) -> list[Path]:
    """The .safetensors shards of a checkpoint folder; refuses pickle-only checkpoints."""
    for stem in WEIGHT_FILES:
        index = root / f"{stem}.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from None
            shards = sorted({root / f for f in weight_map.values()})
            missing = [str(s) for s in shards if not s.exists()]
            if missing:
                raise CheckpointError(f"{index}: names missing shard(s) {missing}")
            return shards
        if (root / stem).exists():
            return [root / stem]
    pickles = sorted(p.name for p in root.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise CheckpointError(
            f"{root}: only pickled weights ({', '.join(pickles)}); layerswap never loads pickles. "
            f"Convert to safetensors first (e.g. save_pretrained(safe_serialization=True))."
        )
    raise CheckpointError(f"{root}: no model.safetensors, adapter_model.safetensors or index")


class Checkpoint:
    """A checkpoint folder: its config and the location of every tensor, read lazily."""

    def __init__(self, root: Path, tensors: dict[str, TensorInfo], config: dict):
        self.root = root
        self.tensors = tensors
        self.config = config
        self._fds: dict[Path, int] = {}
        self._fd_lock = threading.Lock()  # the engine reads from two threads

    @classmethod
    def open(cls, root: str | Path) -> Checkpoint:
        """Validate a checkpoint folder's headers and config.

        Args:
            root: folder with config.json (or adapter_config.json) and safetensors weights.
        Returns:
            The checkpoint, with no tensor data read yet.
        """
        root = Path(root)
        if not root.is_dir():
            raise CheckpointError(f"{root}: not a checkpoint folder")
        config = {}
        for name in ("config.json", "adapter_config.json"):
            if (root / name).exists():
                try:
                    config = json.loads((root / name).read_text())
                except json.JSONDecodeError as e:
                    raise CheckpointError(f"{root / name}: invalid JSON ({e})") from None
                break
        tensors: dict[str, TensorInfo] = {}
        for shard in find_weights(root):
            for name, info in read_header(shard).items():
                if name in tensors:
                    raise CheckpointError(f"{shard}: tensor {name!r} also in {tensors[name].path}")
                tensors[name] = info
        return cls(root, tensors, config)

    def fd(self, path: Path) -> int:
        """The open read-only descriptor of one of this checkpoint's shards."""
        return self._fd(path)

    def _fd(self, path: Path) -> int:
        with self._fd_lock:
            if path not in self._fds:
                self._fds[path] = os.open(path, os.O_RDONLY)
            return self._fds[path]

    def read_into(self, info: TensorInfo, offset: int, buf: memoryview) -> None:
        """Fill `buf` with the tensor's bytes from byte `offset` (relative to the tensor)."""
        fd, pos, got = self._fd(info.path), info.start + offset, 0
        while got < len(buf):
            n = os.preadv(fd, [buf[got:]], pos + got)
            if n == 0:
                raise CheckpointError(f"{info.path}: tensor {info.name!r}: unexpected end of file")
            got += n

    def read(self, name: str, elem_start: int = 0, count: int | None = None) -> torch.Tensor:
        """A tensor (or a flat range of its elements) as a new CPU tensor.

        Returns:
            Shape `info.shape` when reading it whole, else a flat [count] tensor.
        """
        info = self.tensors[name]
        whole = elem_start == 0 and count is None
        count = info.numel - elem_start if count is None else count
        t = torch.empty(count, dtype=info.torch_dtype)  # no zero-fill: read_into overwrites it
        if count:
            self.read_into(info, elem_start * info.itemsize, byte_view(t))
        return t.view(info.shape) if whole else t

    @contextmanager
    def mapped(self, name: str, elem_start: int = 0, count: int | None = None):
        """A read-only flat tensor over a range of a tensor's elements, straight from the page
        cache (mmap, no copy); valid only inside the `with` block.

        Yields:
            A flat [count] tensor of the tensor's dtype (do not keep references to it).
        """
        info = self.tensors[name]
        count = info.numel - elem_start if count is None else count
        if count == 0:
            yield torch.empty(0, dtype=info.torch_dtype)
            return
        pos = info.start + elem_start * info.itemsize
        base = pos - pos % mmap.ALLOCATIONGRANULARITY
        nbytes = count * info.itemsize
        with mmap.mmap(
            self._fd(info.path), pos + nbytes - base, offset=base, access=mmap.ACCESS_READ
        ) as mm:
            with warnings.catch_warnings():  # torch warns that the buffer is read-only: it is
                warnings.simplefilter("ignore", UserWarning)
                t = torch.frombuffer(mm, dtype=info.torch_dtype, offset=pos - base, count=count)
            try:
                yield t
            finally:
                del t  # release the buffer export before the map closes

    def close(self) -> None:
        while self._fds:  # one at a time: an interrupt halfway never leads to a double close
            os.close(self._fds.popitem()[1])

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def byte_view(t: torch.Tensor) -> memoryview:
    """A contiguous tensor's storage as a writable flat byte view (no copy)."""
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


@dataclass(frozen=True)
class OutSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1]


def _header_bytes(specs: list[OutSpec], metadata: dict[str, str]) -> bytes:
    header: dict = {"__metadata__": metadata}
    offset = 0
    for s in specs:
        header[s.name] = {
            "dtype": s.dtype,
            "shape": list(s.shape),
            "data_offsets": [offset, offset + s.nbytes],
        }
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(raw)) + raw


class ShardWriter:
    """Writes tensors into HF-style safetensors shards plus an index, in any order, from threads.

    The layout (which tensor in which shard, at which offset) is fixed up front from the specs:
    `open()` writes every shard's header and sizes the file, then each tensor's bytes land at
    their final offsets with positional writes (use it as `with ShardWriter(...) as w: w.open()`).
    Bytes of one tensor arrive in order (each call appends to that tensor); different tensors may
    be written concurrently.
    """

    def __init__(
        self, out_dir: Path, specs: list[OutSpec], max_shard_bytes: int, stem: str = "model"
    ):
        self.out_dir = out_dir
        self.stem = stem
        groups: list[list[OutSpec]] = [[]]
        size = 0
        for s in specs:
            if groups[-1] and size + s.nbytes > max_shard_bytes:
                groups.append([])
                size = 0
            groups[-1].append(s)
            size += s.nbytes
        n = len(groups)
        names = (
            [f"{stem}.safetensors"]
            if n == 1
            else [f"{stem}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        )
        self.shards = list(zip(names, groups, strict=True))
        self.total_bytes = sum(s.nbytes for s in specs)
        self._lock = threading.Lock()
        self._fds: list[int] = []
        # name -> (fd, absolute offset, nbytes); name -> bytes written so far
        self._where: dict[str, tuple[int, int, int]] = {}
        self._done: dict[str, int] = {}

    def open(self) -> ShardWriter:
        """Create every shard: header written, file sized, each tensor's offset noted.

        Call it inside `with writer:`, which closes the files on any way out (an interrupt
        included); it is not done in the constructor, so no file is open before that `with`.
        """
        try:
            for fname, group in self.shards:
                self._create(self.out_dir / fname, group)
        except BaseException:  # a full disk at shard 3: shards 1-2 must not stay open
            self.close_files()
            raise
        return self

    def _create(self, path: Path, group: list[OutSpec]) -> None:
        header = _header_bytes(group, {"format": "pt"})
        with signals_blocked():  # an interrupt between open and append would leak the file
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # the umask decides
            self._fds.append(fd)
        _pwrite_all(fd, header, 0)
        offset = len(header)
        for s in group:
            self._where[s.name] = (fd, offset, s.nbytes)
            self._done[s.name] = 0
            offset += s.nbytes
        os.ftruncate(fd, offset)

    def _claim(self, name: str, count: int) -> tuple[int, int]:
        """Reserve the next `count` bytes of tensor `name`; returns (fd, absolute offset)."""
        with self._lock:
            if name not in self._where:
                what = "unknown tensor" if self._fds else "not open (call open()) for tensor"
                raise RuntimeError(f"ShardWriter: {what} {name!r}")
            fd, start, nbytes = self._where[name]
            done = self._done[name]
            if done + count > nbytes:
                raise RuntimeError(f"ShardWriter: too many bytes for {name!r}")
            self._done[name] = done + count
            return fd, start + done

    def write(self, name: str, data: memoryview | bytes) -> None:
        """Append bytes to tensor `name`."""
        fd, pos = self._claim(name, len(data))
        _pwrite_all(fd, data, pos)

    def copy_range(self, name: str, src_fd: int, src_offset: int, count: int) -> None:
        """Append `count` bytes to tensor `name` from another file, copied inside the kernel.

        The bytes never enter user space (copy_file_range), with a pread/pwrite fallback where
        the kernel or filesystem does not support it.
        """
        fd, pos = self._claim(name, count)
        done = 0
        while done < count:
            try:
                n = os.copy_file_range(src_fd, fd, count - done, src_offset + done, pos + done)
            except OSError:  # EXDEV/EINVAL/ENOSYS on some kernels and filesystems
                n = 0
            if n == 0:
                data = os.pread(src_fd, min(count - done, 1 << 25), src_offset + done)
                if not data:
                    raise CheckpointError(f"copy of {name!r}: unexpected end of source file")
                _pwrite_all(fd, data, pos + done)
                n = len(data)
            done += n

    def close_files(self) -> None:
        """Close the shard files (idempotent); `close` also checks completeness and indexes."""
        while self._fds:  # one at a time: an interrupt halfway never leads to a double close
            os.close(self._fds.pop())

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close_files()

    def __del__(self) -> None:
        # The last resort: a signal can land on __exit__'s first line, before it closes anything.
        if getattr(self, "_fds", None):
            self.close_files()

    def close(self) -> None:
        """Close the shards and write the index (only when there are several shards).

        Raises:
            RuntimeError if any tensor is incomplete (the caller's temporary folder is then
            discarded, so an incomplete file never becomes visible).
        """
        self.close_files()
        missing = [n for n, (_, _, nb) in self._where.items() if self._done[n] != nb]
        if missing:
            raise RuntimeError(
                f"ShardWriter: {len(missing)} tensors not written, e.g. {missing[:3]}"
            )
        if len(self.shards) > 1:
            index = {
                "metadata": {"total_size": self.total_bytes},
                "weight_map": {s.name: shard for shard, g in self.shards for s in g},
            }
            (self.out_dir / f"{self.stem}.safetensors.index.json").write_text(
                json.dumps(index, indent=2) + "\n"
            )


def _pwrite_all(fd: int, data: memoryview | bytes, pos: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n
