"""The lock file of an output: where it lies, the owner it records, and whether a live process
holds it. trainables/locks.py takes and releases it (`writing`); trainables/lock_recovery.py
clears up after an owner that was killed.

Run its tests: .venv/bin/python -m pytest -q tests/trainables/test_output_locks.py
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from layerswap.trainables.atomic import output_path

SUFFIX = ".layerswap.lock"


def lock_path(out: Path) -> Path:
    """The lock file of the output `out`: `.NAME.layerswap.lock` beside where it really is
    (`atomic.output_path`: an output given as a symbolic link is locked beside its target,
    where its temporaries are made), so every spelling of one output shares one lock."""
    where = output_path(out)
    return where.parent / f".{where.name}{SUFFIX}"


def owner_text(info: dict) -> str:
    """'pid 123 on host h since 2026-01-01T00:00:00Z (`layerswap world build ...`)'."""
    return (
        f"pid {info.get('pid')} on host {info.get('host')} since {info.get('since')} "
        f"(`{info.get('command')}`)"
    )


def read_owner(fd: int) -> dict:
    """The owner record in an open lock file ({} when empty or unreadable: being written)."""
    try:
        raw = os.pread(fd, 65536, 0)
        info = json.loads(raw.decode("utf-8")) if raw else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def busy_owner(path: Path) -> dict | None:
    """The owner recorded in lock file `path` while another process holds it; None when it is
    free (stale) or cannot be read. Only tries the lock (shared, never kept)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_owner(fd)
    finally:
        os.close(fd)  # also drops a shared lock taken on a stale file
    return None


def is_lock_file(name: str) -> bool:
    """Whether a file name is one of layerswap's lock files (`.NAME.layerswap.lock`)."""
    return name.startswith(".") and name.endswith(SUFFIX)
