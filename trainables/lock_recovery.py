"""What a killed writer left of an output, cleared under the lock taken over from it: its
half-built temporaries removed, a swap it cut settled, an output it was replacing named.

trainables/locks.py calls `sweep_dead_writer` when it takes over a stale lock.
Run its tests: .venv/bin/python -m pytest -q tests/trainables/test_dead_writer_temps.py
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

from layerswap.trainables.atomic import dead_writer_siblings, dead_writer_temps
from layerswap.trainables.lock_files import SUFFIX, busy_owner


def sweep_dead_writer(out: Path, owner: dict) -> None:
    """Clean up after a killed writer of `out`: its half-built temporary siblings are removed, an
    output it was swapping out is put back (or removed, when its replacement was already in
    place), and an output its long run was replacing is named, never removed.

    Called under `out`'s lock, taken over from `owner`'s stale one: no live process writes `out`,
    and only names `atomic.writer_sibling` gave that pid are touched (never a user's file, nor
    those of another writer). Only for an owner on this host: where a shared file system
    keeps flocks per node (NFS mounted with local_lock), a writer on another host can look dead
    from here while it runs, so its siblings are named and left.
    """
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return
    here = owner.get("host") == socket.gethostname()
    for old in dead_writer_temps(out, pid, "old"):
        if here:
            _settle_swap(out, old, pid)
        else:
            _say(out, f"left {old.name}: {_elsewhere(pid, owner)}")
    for tmp in dead_writer_temps(out, pid):
        if not here:
            _say(out, f"left {tmp.name}: {_elsewhere(pid, owner)}")
            continue
        _remove(tmp)
        _say(out, f"removed {tmp.name}, the unfinished output of pid {pid}")
    if here and out.is_dir():
        _sweep_inside(out, pid)
    for name, aside in dead_writer_siblings(out.parent, pid, "replaced"):
        # The user asked for it to be replaced, but the run replacing it never finished: which
        # of the two to keep is theirs to say. Any output beside `out`: a search locks RUN/search
        # and sets aside RUN/promotion, RUN/best and RUN/leaderboard.md with it.
        _say(
            out,
            f"left {aside.name}: it holds the {name} that pid {pid} was replacing when it "
            f"stopped; move it back over {out.parent / name} to keep it, or remove it",
        )


def _sweep_inside(out: Path, pid: int) -> None:
    """What the killed writer `pid` left inside its output `out` while writing a step there (a
    merge-only demo of an older version merged into `out/merged` in place): its temporaries are
    removed, a swap it cut is settled, and its step's stale lock file removed, each in one line.

    Only names carrying `pid`, under `out`'s lock: a live writer of a step inside `out` would
    have made `writing(out)` refuse (`_holding_locked`), and no new one can start (its
    `_inside_locked` meets this lock).
    """
    for name, old in dead_writer_siblings(out, pid, "old"):
        _settle_swap(out / name, old, pid)
    for _, tmp in dead_writer_siblings(out, pid, "tmp"):
        _remove(tmp)
        _say(out, f"removed {tmp.name}, the unfinished output of pid {pid}")
    for path in out.glob(f".*{SUFFIX}"):
        try:
            owner = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(owner, dict) and owner.get("pid") == pid and busy_owner(path) is None:
            path.unlink(missing_ok=True)
            _say(out, f"removed {path.name}, the stale lock of pid {pid}")


def _settle_swap(out: Path, old: Path, pid: int) -> None:
    """Finish `atomic_dir`'s swap that a kill cut: the old output goes back when nothing took its
    place (the writer failed, so its command changed nothing), and goes when its replacement was
    already renamed in (the writer died deleting it)."""
    if out.exists() or out.is_symlink():
        _remove(old)
        _say(out, f"removed {old.name}, the output pid {pid} had already replaced")
    else:
        os.rename(old, out)
        _say(out, f"put back {out.name} from {old.name}: pid {pid} was killed while replacing it")


def _elsewhere(pid: int, owner: dict) -> str:
    return (
        f"its writer, pid {pid}, ran on host {owner.get('host')}; remove it by hand once that is "
        "surely not running"
    )


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _say(out: Path, what: str) -> None:
    print(f"layerswap: {out}: {what}", file=sys.stderr, flush=True)
