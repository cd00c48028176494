"""Safetensors shards written in byte ranges: `ShardWriter` streams tensors into HF-style shards
with an index, from several threads, so a merge never holds a whole model.

`with ShardWriter(out_dir, [OutSpec(name, "BF16", shape), ...], max_shard_bytes) as w: w.open()`,
then `w.write(name, bytes)` or `w.copy_range(...)` per tensor and `w.close()`. Reading is
trainables/merge/checkpoint.py. Tests: .venv/bin/python -m pytest -q tests/trainables/merge/test_checkpoint.py
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from layerswap.trainables.merge.checkpoint import DTYPES, CheckpointError
from layerswap.trainables.merge.threads import signals_blocked


@dataclass(frozen=True)
class OutSpec:
    """One tensor a ShardWriter will write: its name, safetensors dtype tag and shape."""

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
