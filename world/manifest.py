"""A built world's manifest (world.json): the config it was built with and the sha256 of every
file, and the check that a world folder still holds what its manifest lists.

`verify_world(Path("runs/world"))` -> problems ([] when intact); `world_config_of(world)` -> its
WorldConfig. Pure file reading: no torch. Used by the build, the shipped bases, the search's
preflight and `layerswap eval --world`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from layerswap.spaces.world import WorldConfig

MANIFEST = "world.json"


def sha256_file(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_world(out: Path, only: Callable[[str], bool] | None = None, *, hand_made_ok: bool = False) -> list[str]:  # fmt: skip
    """What is wrong with the world at `out`: every file world.json lists must be there with
    the sha256 it lists. Hashes every listed file (0.02 s for the 6 MB full world).

    Args:
        out: a world folder.
        only: checks just the listed files it accepts (by relative path); e.g. the search
            leaves the test splits alone, since it must never open one.
        hand_made_ok: a folder without world.json (a world laid out by hand) has nothing to
            verify against: no problem then.
    Returns:
        one "relative/path: problem" line per problem; empty when the world is intact.
    """
    out = Path(out)
    try:
        m = json.loads((out / MANIFEST).read_bytes())
    except FileNotFoundError:
        return [] if hand_made_ok else [f"{MANIFEST}: missing"]
    except OSError as e:
        return [f"{MANIFEST}: cannot read ({e.strerror})"]
    except ValueError as e:  # not UTF-8 or not JSON
        return [f"{MANIFEST}: not valid JSON ({e})"]
    listed = m.get("sha256") if isinstance(m, dict) else None
    if not isinstance(listed, dict) or not listed:
        return [f"{MANIFEST}: no sha256 table"]
    problems = []
    root = out.resolve()
    for rel, digest in sorted(listed.items()):
        if only is not None and not only(rel):
            continue
        path = (out / rel).resolve()
        if not path.is_relative_to(root):  # a hand-edited manifest must not send us elsewhere
            problems.append(f"{rel}: not a path inside the world")
        elif not path.is_file():
            problems.append(f"{rel}: missing")
        elif sha256_file(path) != digest:
            problems.append(f"{rel}: sha256 differs from {MANIFEST}")
    return problems


def world_config_of(world: Path) -> WorldConfig:
    """The config a built world records in its world.json (seed, size, variant).

    Raises:
        ValueError: no readable world.json there, or its config is not a valid WorldConfig.
    """
    path = Path(world) / MANIFEST
    try:
        return WorldConfig.model_validate(json.loads(path.read_bytes())["config"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: no world config there ({e})") from e
