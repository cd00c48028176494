"""Safetensors checkpoints read in byte ranges, so a merge never holds a whole model.

`Checkpoint.open(dir)` validates every shard's header up front (truncation, bad offsets, pickle
files), then reads tensors or element ranges of them (copies, or mmap views). Writing shards is
trainables/merge/shard_writer.py. Tests: .venv/bin/python -m pytest -q tests/trainables/merge/test_checkpoint.py
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
    """The .safetensors shards of a checkpoint folder; refuses pickle-only checkpoints and a folder
    holding both a single weights file and a shard index (which of them is stale is unknown)."""
    for stem in WEIGHT_FILES:
        index = root / f"{stem}.index.json"
        if index.exists() and (root / stem).exists():
            # transformers loads the single file and ignores the index; reading the shards would
            # merge other weights than the model the folder loads as (one of them is stale).
            raise CheckpointError(
                f"{root}: holds both {stem} and {index.name}, two sets of weights (transformers "
                f"loads {stem}); remove the stale one"
            )
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
