"""Atomic outputs: folders and files built in a temporary sibling, renamed into place, never
half-written. Every writer of a run's files goes through here."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_dir(out: Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder next to `out`; on success it becomes `out`, on error it vanishes.

    Args:
        out: the final folder.
        overwrite: replace an existing `out` (only after the new one is complete).
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: already exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    tmp = out.parent / f".{out.name}.tmp-{tag}"
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{tag}"
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write a file so readers see the old content or the new, never a prefix.

    Args:
        path: the final file.
        write: writes the whole content to the temporary sibling path it is given.
    """
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write` of a UTF-8 text file."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
