"""What an output folder says about itself: its marker file (`.layerswap.json`: kind, command,
identity, the files it wrote) and the outputs a search claims beside RUN/search.

Part of the one output policy (trainables/outputs.py, which re-exports these names). Tests:
.venv/bin/python -m pytest -q tests/trainables/test_output_locks.py
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.locks import command_line

MARKER = ".layerswap.json"

# kind -> what a user calls such a folder (messages name it).
KINDS = {
    "merge": "a merged model",
    "world": "an embedded world",
    "base": "a shipped world base",
    "analysis": "an analysis report",
    "merge-demo": "a merge-only demo",
    "demo": "a demo run",
    "train": "a training run",
    "search": "a merge search",
    "study-export": "a study's exported configs",
}


# Kinds whose folder holds other outputs, each with the outputs its own steps write inside it
# (which its --overwrite replaces with it): a demo run is the pipeline's run folder (its world,
# training runs, search, best model and analysis; it keeps no file list: a long run, its
# --overwrite replaces the whole run), a merge-only demo holds its generated family and its
# merged/. Any other output inside (`merge --out mo/my_swap`, `analyze mo`) is the user's, named
# and kept. Every other kind holds only its own files.
CONTAINERS: dict[str, tuple[str, ...]] = {"demo": (), "merge-demo": ("merged",)}
# The outputs beside RUN/search that a search and its promotion write (`claim_sibling`).
SEARCH_SIBLINGS = ("promotion", "leaderboard.md", "best")


class OutputError(ValueError):
    """An output location that the policy refuses; the message lists every problem."""


def marker(kind: str, identity: str | None = None, files: list[str] | None = None) -> dict:
    """The marker content for a new output of `kind`; `files`: what it wrote (relative paths),
    None for an output written in place over a long run (its whole folder is its own)."""
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r} (known: {sorted(KINDS)})")
    m = {
        "kind": kind,
        "command": command_line(),
        "identity": identity,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if files is not None:
        m["files"] = files
    return m


def read_marker(folder: Path) -> dict | None:
    """The marker of `folder`, or None when layerswap did not write it (or it is unreadable)."""
    try:
        m = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("kind") in KINDS else None


def write_marker(
    folder: Path, kind: str, identity: str | None = None, files: list[str] | None = None
) -> None:
    """Mark `folder` as an output of `kind` (atomically). A search marked again (a resume)
    keeps the siblings it claimed (`claim_sibling`)."""
    m = marker(kind, identity, files)
    old = read_marker(folder)
    if old is not None and old["kind"] == kind and isinstance(old.get("siblings"), list):
        m["siblings"] = old["siblings"]
    atomic_write_text(Path(folder) / MARKER, json.dumps(m, indent=1) + "\n")


def written_files(folder: Path) -> list[str]:
    """Every file under `folder` (relative, sorted), its marker aside: what a marker lists."""
    folder = Path(folder)
    names = (p for p in folder.rglob("*") if p.is_file() or p.is_symlink())
    return sorted(str(p.relative_to(folder)) for p in names if p.name != MARKER)


def claim_sibling(search_dir: Path, name: str) -> None:
    """Record in RUN/search's marker that this search writes RUN/`name` (before writing it),
    so that `--overwrite` later replaces it and nothing of the user's under that name."""
    m = read_marker(search_dir)
    if m is None or name in m.get("siblings", []):
        return  # a search layerswap did not mark (a hand-made run): nothing to record in
    m["siblings"] = sorted({*m.get("siblings", []), name})
    atomic_write_text(Path(search_dir) / MARKER, json.dumps(m, indent=1) + "\n")


def sibling_problems(search_dir: Path, names: Iterable[str] = SEARCH_SIBLINGS) -> list[str]:
    """The outputs beside RUN/search that exist but that no search there wrote: one line each.

    Args:
        search_dir: RUN/search.
        names: the siblings the command would write or replace.
    """
    search_dir = Path(search_dir)
    claimed = (read_marker(search_dir) or {}).get("siblings", [])
    there = [search_dir.parent / n for n in names if n not in claimed]
    return [
        f"{p}: exists and was not written by the search in {search_dir}; refusing to replace "
        "it: remove it yourself or choose another --out"
        for p in there
        if p.exists() or p.is_symlink()
    ]
