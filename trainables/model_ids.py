"""Content ids of checkpoints, and the one recipe id every merged model and trial carries.

`content_recipe_id(recipe)` hashes the recipe's parameters with each checkpoint it names
replaced by `model_content_id(ref)`: a local checkpoint folder by the bytes of its weights and
configs, so the same recipe over the same experts has the same id in any run folder, on any
machine and in any storage location. spaces.recipe stays pure; this module does the I/O.
`saved_digests(FILE)` keeps the per-file digests of a run on disk (the search's
RUN/search/model_ids.json), so a resumed search and its promotion read no expert again.
Run: `python -c "from layerswap.trainables.model_ids import model_content_id as m; print(m('DIR'))"`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from layerswap.spaces.base import is_uri
from layerswap.spaces.recipe import Recipe, model_refs, recipe_id
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.merge.threads import run_in_threads

# The files that decide what a merge computes: the tensors (model and LoRA adapter shards) and
# the configs the engine reads (depth, model type, LoRA rank/alpha/targets). Not hashed:
# `*.safetensors.index.json`, which only says which shard holds which tensor (the shards' bytes
# already fix every tensor, so the index adds nothing); tokenizer and generation-config files,
# which the merge copies rather than computes and which equal tokenizers re-save as different
# bytes (another transformers version, a Hub download vs save_pretrained), so hashing them would
# split one expert into several ids.
CONFIGS = frozenset({"config.json", "adapter_config.json"})
CHUNK = 8 << 20  # bytes read at a time: 16 GB checkpoints are streamed, never held
WORKERS = 4  # files hashed at once (hashlib releases the GIL while it hashes a chunk)

# (realpath, size, mtime_ns, inode) -> sha256 hex of the file: a search proposes hundreds of
# recipes over the same experts, and each file is read once per process unless it changes (the
# inode catches a file replaced by rename, as atomic writers and save_pretrained do).
_FILE_DIGESTS: dict[tuple[str, int, int, int], str] = {}
_LOCK = threading.Lock()
# The keys each open `saved_digests` block has used: what it writes back (not every file this
# process ever hashed, which in a long-lived process may belong to other runs).
_RECORDERS: list[set[tuple[str, int, int, int]]] = []
# saved_digests' file layout; another number is ignored (hashed anew). 2: written under the
# RACY_NS rule below; a format-1 file (written before it) may hold the digest of a file hashed
# within its write's timestamp tick, so it is not trusted.
DIGESTS_FORMAT = 2
# A digest is kept only for a file last modified this long before its hashing began (git's
# "racily clean" rule): a same-size rewrite within the same timestamp tick as the write before
# it keeps size, mtime and inode, so the key alone cannot see it. Ticks are a few ms on ext4 and
# xfs (the kernel's coarse clock) and up to 2 s on FAT and some network file systems. A file
# newer than that is hashed again at each use (experts are written long before they are merged).
# A file dated further in the future (a file server's clock ahead of ours) is kept as before
# the rule: never keeping it would re-read 16 GB experts for every recipe.
RACY_NS = 2_000_000_000


def hashed_files(folder: Path) -> list[Path]:
    """The files of a checkpoint folder that its content id covers, sorted by name."""
    return sorted(
        p
        for p in Path(folder).iterdir()
        if p.is_file() and (p.name.endswith(".safetensors") or p.name in CONFIGS)
    )


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _file_key(path: Path) -> tuple[str, int, int, int]:
    real = os.path.realpath(path)
    st = os.stat(real)
    return real, st.st_size, st.st_mtime_ns, st.st_ino


def _digests(files: list[Path]) -> dict[Path, str]:
    """sha256 of each file, from the cache where its path, size and mtime are unchanged."""
    keys = {p: _file_key(p) for p in files}
    with _LOCK:
        out = {p: _FILE_DIGESTS[k] for p, k in keys.items() if k in _FILE_DIGESTS}
        for rec in _RECORDERS:
            rec.update(keys.values())
    todo = sorted((p for p in files if p not in out), key=lambda p: -keys[p][1])  # largest first

    def one(p: Path) -> None:
        started = time.time_ns()
        digest = _file_sha256(keys[p][0])
        with _LOCK:
            if abs(started - keys[p][2]) > RACY_NS:  # far in the future: a skewed clock
                _FILE_DIGESTS[keys[p]] = digest
            out[p] = digest

    if todo:
        run_in_threads(todo, one, min(WORKERS, len(todo)), "model-id")
    return out


def _read_saved(path: Path) -> dict[tuple[str, int, int, int], str]:
    """The digests a `saved_digests` file holds; {} when it is missing or not one we wrote.

    The file is only a cache of what hashing would give: an unreadable one (a crash of an older
    layerswap, a hand edit) costs one re-hash, never a wrong id, so it is not an error.
    """
    try:
        data = json.loads(path.read_text())
        if data.get("format") != DIGESTS_FORMAT:
            return {}
        return {
            (str(e["path"]), int(e["size"]), int(e["mtime_ns"]), int(e["inode"])): str(e["sha256"])
            for e in data["files"]
        }
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def _unchanged(key: tuple[str, int, int, int]) -> bool:
    try:
        return _file_key(Path(key[0])) == key
    except OSError:
        return False


@contextmanager
def saved_digests(path: Path | str, *, save: bool = True) -> Iterator[None]:
    """Reuse and save the file digests of a run: read `path` before the block, write it after.

    A saved digest is used only while its file has the same real path, size, mtime and inode
    (the in-memory cache's key), so a changed or replaced expert is hashed again. The file is
    written atomically, with the digests the block used and those saved before, also when the
    block raises (what was hashed before an interrupt is not hashed twice).

    Args:
        path: the JSON file (a search's RUN/search/model_ids.json).
        save: False: only read it (a check that may still refuse leaves the run as it was).
    """
    path = Path(path)
    saved = _read_saved(path)
    used: set[tuple[str, int, int, int]] = set()
    with _LOCK:
        for k, v in saved.items():
            _FILE_DIGESTS.setdefault(k, v)
        _RECORDERS.append(used)
    try:
        yield
    finally:
        with _LOCK:
            # By identity: nested blocks' sets are often equal (every hash joins all of them),
            # and list.remove would take the outer block's.
            _RECORDERS[:] = [r for r in _RECORDERS if r is not used]
            keep = {k: _FILE_DIGESTS[k] for k in used if k in _FILE_DIGESTS}
        # Saved digests of files since changed or removed would never match again: dropped.
        keep = {k: v for k, v in saved.items() if _unchanged(k)} | keep
        if save and keep != saved and path.parent.is_dir():
            _write_saved(path, keep)


def _write_saved(path: Path, digests: dict[tuple[str, int, int, int], str]) -> None:
    """Write the digest cache; a refused write (a full disk, a read-only mount) is one line, not
    an error: the file only saves the next run some hashing, and failing here would end a
    finished search, or hide the error that is ending it."""
    files = [
        {"path": k[0], "size": k[1], "mtime_ns": k[2], "inode": k[3], "sha256": v}
        for k, v in sorted(digests.items())
    ]
    try:
        atomic_write_text(path, json.dumps({"format": DIGESTS_FORMAT, "files": files}, indent=1))
    except OSError as e:
        print(f"layerswap: {path}: file digests not saved ({e}); the next run hashes again", file=sys.stderr)  # fmt: skip


def model_content_id(ref: str) -> str:
    """The content id of one checkpoint reference.

    A local checkpoint folder: "sha256:" + the sha256 of the sorted (file name, sha256 of its
    bytes) of its `hashed_files`, so a copy anywhere has the same id and one changed byte gives
    another. Anything else (a Hub id, an s3://, hf:// or other URI, a path that is not a
    folder, a folder with none of those files) stands for itself: its string. A Hub id names
    content only up to its revision (the repository can change under the same id), a URI
    whatever its store holds there.

    Args:
        ref: a recipe's checkpoint reference, as written in the recipe.
    Returns:
        The id; local folders are hashed once per process while their files are unchanged.
    """
    if is_uri(ref):
        return ref
    folder = Path(ref).expanduser()
    if not folder.is_dir():
        return ref
    files = hashed_files(folder)
    if not files:  # not a checkpoint (the merge will say so): nothing to identify it by
        return ref
    digests = _digests(files)
    listing = json.dumps([[p.name, digests[p]] for p in files], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(listing.encode()).hexdigest()


def content_recipe_id(recipe: Recipe) -> str:
    """The recipe's id by content: its parameters and its checkpoints' content ids.

    Args:
        recipe: a validated recipe.
    Returns:
        12 hex digits, equal for the same recipe over the same checkpoints wherever they are.
    """
    return recipe_id(recipe, {ref: model_content_id(ref) for ref in model_refs(recipe)})
