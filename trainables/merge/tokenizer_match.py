"""Whether a merge's checkpoints share one tokenizer: token ids index the embedding rows, so
experts of the same shapes but another vocabulary merge into nonsense without any error.

`check_same_tokenizer([folder, ...])` is called by the disk merge (engine.open_checkpoints) and
by the search's preflight (search/preflight_folders.py), so it imports no torch.
Run: `python -c "from layerswap.trainables.merge.tokenizer_match import tokenizer_fingerprint as f; print(f(__import__('pathlib').Path('DIR')))"`.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path


class TokenizerMismatch(ValueError):
    """Checkpoints of one merge whose tokenizers differ, or a tokenizer file that cannot be read."""


# What is compared, per file: what decides which token an id stands for. Not the bytes of the
# JSON files: one tokenizer re-saved by another transformers/tokenizers version is other bytes
# (key order, indentation, merges written as "a b" or as ["a", "b"] since tokenizers 0.20), and
# it must still merge. tokenizer.model (sentencepiece) is a binary copied as it is: its bytes.
FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")

# (realpath, size, mtime_ns, inode) -> digest: a process merging many recipes over the same
# experts (a promotion, tests) reads each tokenizer file once while it is unchanged.
_CACHE: dict[tuple[str, int, int, int], str | None] = {}
_BY_BYTES: dict[tuple[str, str], str | None] = {}  # (file name, sha256 of its bytes) -> digest
_LOCK = threading.Lock()


def _merge_pair(m: object) -> list[str]:
    return list(m) if isinstance(m, list) else str(m).split(" ", 1)


def _content(name: str, raw: bytes) -> object | None:
    """The part of one tokenizer file that decides the ids; None when the file holds none."""
    if name == "tokenizer.model":
        return raw.hex()
    data = json.loads(raw)
    if name == "tokenizer_config.json":  # only its added tokens: the rest is settings
        added = data.get("added_tokens_decoder") or {}
        return sorted((int(i), t.get("content")) for i, t in added.items()) or None
    model = data.get("model") or {}
    return {
        "type": model.get("type"),
        "vocab": model.get("vocab"),
        "merges": [_merge_pair(m) for m in model.get("merges") or []],
        "added": sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens") or []),
    }


def _digest(path: Path) -> str | None:
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    raw = path.read_bytes()
    # Experts usually carry their base's file byte for byte: parsed once per distinct content
    # (a 10 MB tokenizer.json takes ~0.7 s to parse and canonicalise, ~20 ms to hash).
    raw_key = (path.name, hashlib.sha256(raw).hexdigest())
    with _LOCK:
        if raw_key in _BY_BYTES:
            _CACHE[key] = _BY_BYTES[raw_key]
            return _CACHE[key]
    try:
        content = _content(path.name, raw)
    except (ValueError, AttributeError, TypeError) as e:
        raise TokenizerMismatch(f"{path}: not a readable tokenizer file ({e})") from None
    digest = None
    if content is not None:
        text = json.dumps(content, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(text.encode()).hexdigest()
    with _LOCK:
        _CACHE[key] = _BY_BYTES[raw_key] = digest
    return digest


def tokenizer_fingerprint(folder: Path) -> dict[str, str]:
    """{tokenizer file name: sha256 of what decides its ids} for the files `folder` has.

    Args:
        folder: a checkpoint folder.
    Returns:
        One entry per file of FILES present (a tokenizer_config.json without added tokens has
        none); {} for a folder without tokenizer files: unknown, not different.
    """
    out = {}
    for name in FILES:
        if (folder / name).is_file() and (d := _digest(folder / name)) is not None:
            out[name] = d
    return out


def check_same_tokenizer(folders: list[Path]) -> None:
    """Refuse checkpoints whose tokenizers differ, comparing each file among the folders that
    have it.

    Args:
        folders: the checkpoint folders of one merge.
    Raises:
        TokenizerMismatch naming the file and the two folders that differ.
    """
    seen: dict[str, tuple[str, Path]] = {}
    for folder in folders:
        for name, digest in tokenizer_fingerprint(folder).items():
            first = seen.setdefault(name, (digest, folder))
            if first[0] != digest:
                raise TokenizerMismatch(
                    f"different tokenizers: {name} of {folder} differs from that of {first[1]} "
                    f"(vocabulary, merges or added tokens); the experts of a merge must share "
                    f"one tokenizer, as token ids index the embedding rows"
                )
