"""Content fingerprints of the local dataset files a training run reads, and the one rule that
compares them: a run is finished, or continued, only on the data its checkpoints were trained on.

`data_fingerprint(exp)` hashes each `path:` file (a URI's cached local copy) and each
`data_files:` file of a `source:` (sha256 of the bytes, streamed); checkpoint manifests record it
(`data_fingerprint`), and `data_change(recorded, now)` says what differs. The driver refuses a
changed file before any work (trainables/train/rerun_rule.py `decide`), Ray's workers pick no on-disk
checkpoint of other data (ray_train._resume_point) and the loop refuses to resume one
(loop.run_training). A source read from the Hub is not fingerprinted (its revision is not known
here without a network call). Tests:
.venv/bin/python -m pytest -q tests/trainables/test_data_fingerprint.py
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.trainables.storage import local_copy

CHUNK = 1 << 20  # 1 MiB reads: hashing runs at sha256's speed, memory stays flat
KEY = "data_fingerprint"  # the manifest's field
# A file modified less than this before it was hashed is hashed again at each use: a same-size
# rewrite within one timestamp tick keeps its stat (git's "racily clean" rule, as model_ids).
RACY_S = 2.0

_cache: dict[tuple, dict] = {}  # (path, size, mtime_ns, inode) -> the file's fingerprint


def _hash_file(path: Path) -> dict:
    """sha256, size and newline-delimited line count of one file, cached per process by stat."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key in _cache:
        return _cache[key]
    digest, lines, last = hashlib.sha256(), 0, b"\n"
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    out = {"file": str(path), "bytes": st.st_size, "lines": lines + (last != b"\n"), "sha256": digest.hexdigest()}  # fmt: skip
    if time.time() - st.st_mtime > RACY_S:
        _cache[key] = out
    return out


def data_fingerprint(exp: TrainExperiment) -> dict[str, dict]:
    """What each dataset of `exp` reads, by content.

    Args:
        exp: the experiment.
    Returns:
        {"datasets[i].path" or "datasets[i].data_files[j]": {"file", "bytes", "lines",
        "sha256"}}; a source read from the Hub: {"datasets[i].source": {"source", "sha256":
        None}} (not fingerprinted).
    Raises:
        ValueError naming the field and file when a file cannot be read.
    """
    out: dict[str, dict] = {}
    for i, spec in enumerate(exp.datasets):
        if spec.path is not None:
            files = {f"datasets[{i}].path": spec.path}
        elif spec.data_files:
            files = {f"datasets[{i}].data_files[{j}]": f for j, f in enumerate(spec.data_files)}
        else:
            out[f"datasets[{i}].source"] = {"source": spec.source, "sha256": None}
            continue
        for field, name in files.items():
            try:
                out[field] = _hash_file(Path(local_copy(name)))
            except OSError as e:
                raise ValueError(f"{field}: {name}: cannot read ({e.strerror or e})") from None
    return out


def _size(fp: dict) -> str:
    return f"{fp['lines']} lines, {fp['bytes']} bytes"


def data_change(recorded: dict | None, now: dict[str, dict] | Callable[[], dict[str, dict]], trained: str = "the run") -> str:  # fmt: skip
    """What differs between the data a checkpoint was trained on and the data there now.

    Args:
        recorded: a manifest's `data_fingerprint` (None: written before fingerprints were
            recorded, or by a Python caller that gave none: nothing to compare).
        now: `data_fingerprint(exp)` as the files are now, or a function that takes it: called
            only when something fingerprinted was recorded (no hashing with nothing to compare).
        trained: what trained on the recorded data, as the phrase names it ("the sweep").
    Returns:
        "" when every fingerprinted file is unchanged (or nothing was recorded), else one
        phrase naming each changed file: "datasets[0].path /d/x.jsonl changed since the run
        trained on it (8 lines, 560 bytes -> 4 lines, 300 bytes)".
    """
    if not isinstance(recorded, dict) or not any(isinstance(o, dict) and o.get("sha256") for o in recorded.values()):  # fmt: skip
        return ""  # nothing recorded, or only Hub sources: nothing to hash for
    if callable(now):
        now = now()
    diffs = []
    for field, old in sorted(recorded.items()):
        new = now.get(field)
        if not isinstance(old, dict) or old.get("sha256") is None:
            continue  # a Hub source: not fingerprinted
        if new is None or new.get("sha256") is None:
            diffs.append(f"{field} {old.get('file')} is no longer read")
        elif new["sha256"] != old["sha256"]:
            what = f"{_size(old)} -> {_size(new)}" if _size(old) != _size(new) else f"same size, other content: sha256 {old['sha256'][:12]} -> {new['sha256'][:12]}"  # fmt: skip
            diffs.append(f"{field} {new['file']} changed since {trained} trained on it ({what})")
    return "; ".join(diffs)


def resume_data_problem(exp: TrainExperiment, manifest: dict, now: dict | Callable[[], dict] | None = None) -> str | None:  # fmt: skip
    """Why a run of `exp` must not finish or continue from a checkpoint with this manifest, by
    its data: the one rule the driver's rerun decision, Ray's resume point and the loop apply.

    Args:
        exp: the experiment.
        manifest: a checkpoint's manifest.
        now: `data_fingerprint(exp)` when already taken, or a function that takes it (default:
            taken here, only when the manifest recorded a fingerprint to compare with).
    Returns:
        one line naming the changed file and the way out (--overwrite), or None.
    """
    what = data_change(manifest.get(KEY), now if now is not None else lambda: data_fingerprint(exp))
    if not what:
        return None
    return (
        f"{what}; this run was trained on the old data, so it is neither finished nor continued "
        "on the new (one expert trained on two datasets): pass --overwrite to train from "
        "scratch on the data as it is now"
    )
