"""Why the output policy refuses a location: every problem with writing an output at a path (an
input it touches, a place it may not nest, a folder another kind or the user owns, files
layerswap did not write there), each one line naming the path.

Part of the one output policy (trainables/outputs.py: `check_output` raises these). Tests:
.venv/bin/python -m pytest -q tests/cli/test_bad_input_writers.py tests/trainables/test_output_locks.py
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from layerswap.trainables.atomic import link_problem, output_path, writer_sibling_parts
from layerswap.trainables.lock_files import is_lock_file
from layerswap.trainables.locks import live_owner
from layerswap.trainables.output_markers import CONTAINERS, KINDS, MARKER, read_marker


def _relation(out: Path, inp: Path) -> str | None:
    """How `out` relates to the input `inp` ('is', 'contains', 'is inside'), or None."""
    if out == inp:
        return "is"
    if out in inp.parents:
        return "contains"
    if inp in out.parents:
        return "is inside"
    return None


def input_problems(out: Path, where: Path, inputs: Iterable[Path | str]) -> list[str]:
    """`out` (resolved: `where`) is, contains or lies inside an input: one line per input."""
    problems = []
    for inp in inputs:
        rel = _relation(where, Path(inp).expanduser().resolve())
        if rel is not None:
            problems.append(f"{out}: {rel} the input {inp}; choose an output outside the inputs")
    return problems


def package_dirs() -> list[Path]:
    """The folders of the installed layerswap package (in a source checkout: its rooms, every
    top-level folder with an __init__.py), where no output goes without a maintainer flag."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file():
        return sorted(p for p in root.iterdir() if (p / "__init__.py").is_file())
    return [root]  # an installed wheel: site-packages/layerswap holds the rooms


def placement_problems(out: Path, where: Path, kind: str | None, maintainer: bool) -> list[str]:
    """`out` lies inside the package (without `maintainer`) or inside another layerswap
    output (a demo run aside): its --overwrite would delete this one, or the reverse."""
    problems = []
    if not maintainer:
        for pkg in package_dirs():
            if where == pkg or pkg in where.parents:
                problems.append(
                    f"{out}: is inside the installed layerswap package ({pkg}); refusing to "
                    "write there (maintainers shipping files: pass --maintainer)"
                )
                break
    for anc in where.parents:
        found = read_marker(anc)
        if found is not None and found["kind"] not in CONTAINERS:
            what = "" if kind is None else f" ({KINDS[kind]})"
            problems.append(
                f"{out}: lies inside {anc}, which holds {KINDS[found['kind']]}; an output{what} "
                "may not nest inside another (replacing one would delete the other): choose "
                "an output outside it"
            )
            break
    return problems


def writable_parent(out: Path) -> str | None:
    """A problem with creating `out` (a missing parent may be created), or None."""
    parent = out.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        return f"{out}: cannot be created, {parent} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{out}: cannot be created, {parent} is not writable"
    return None


def output_problems(
    out: Path,
    kind: str,
    *,
    overwrite: bool = False,
    inputs: Iterable[Path | str] = (),
    allow_existing: bool = False,
    maintainer: bool = False,
    inside: bool = True,
) -> list[str]:
    """Every reason the policy refuses to write an output of `kind` at `out` (empty: allowed).

    Args:
        out: the output folder.
        kind: a key of KINDS.
        overwrite: the user asked to replace an existing output.
        inputs: paths the command reads; `out` may not be, contain or lie inside any of them.
        allow_existing: the caller continues an existing output of the same kind (a resume);
            an existing folder is then checked for its kind only.
        maintainer: a maintainer command may write into the installed package (world/bases/).
        inside: with `allow_existing`, refuse an existing folder that is itself not writable;
            False for a command that may find the output finished and write nothing into it
            (`--continue`): it calls `writable_inside` once it knows it will write there.
    Returns:
        one message per problem, each naming the path.
    """
    out = Path(out)
    if (link := link_problem(out)) is not None:
        return [link]
    where = output_path(out)  # through a symbolic link: its target
    problems = input_problems(out, where, inputs)
    problems += placement_problems(out, where, kind, maintainer)
    if not where.exists():
        if (p := writable_parent(where)) is not None:
            problems.append(p)
        return problems
    if not where.is_dir():
        problems.append(f"{out}: exists and is not a folder")
        return problems
    if not (overwrite or allow_existing):
        problems.append(f"{out}: already exists; pass --overwrite to replace it")
        return problems
    if (
        p := writable_beside(out, where, inside=inside and allow_existing and not overwrite)
    ) is not None:
        return [*problems, p]
    return problems + _existing_problems(out, where, kind, overwrite)


def writable_beside(out: Path, where: Path, *, inside: bool = False) -> str | None:
    """A problem with writing beside the existing `out` (really `where`), or None: its lock, a
    replacement's temporary and the set-aside old one are made in its folder, so a read-only
    mount is named here, before work, not by the lock's write failing (exit 1).

    Args:
        out: the output, as the user named it.
        where: its real path (through a symbolic link).
        inside: the command continues `out` (--resume, --continue) and so writes into it too:
            a read-only `where` in a writable folder is refused as well.
    """
    if not os.access(where.parent, os.W_OK | os.X_OK):
        return f"{out}: cannot be replaced or continued, {where.parent} is not writable"
    return writable_inside(out) if inside else None


def writable_inside(out: Path) -> str | None:
    """A problem with writing into the existing folder `out` (through a link: its target), or
    None (also when it is no folder: nothing to continue). A read-only mount in a writable folder
    is named here, before work, not by the first write inside it failing (exit 1).

    Args:
        out: an output the command continues (--resume, or --continue of an unfinished one).
    Returns:
        one line naming `out`, or None.
    """
    where = output_path(Path(out))
    if where.is_dir() and not os.access(
        where, os.W_OK | os.X_OK
    ):  # a read-only mount too, for root
        return f"{out}: cannot be continued, it is not writable"
    return None


def _existing_problems(out: Path, where: Path, kind: str, overwrite: bool) -> list[str]:
    """Why the existing folder `out` (really `where`) may not be replaced or continued as an
    output of `kind`: another writer, no marker, another kind, files layerswap did not write."""
    problems = []
    found = read_marker(where)
    if found is None and (owner := live_owner(where)) is not None:
        # a writer that took the lock but has not marked its output yet: name it, not the folder
        problems.append(f"{out}: another layerswap command is writing it: {owner}")
        return problems
    if found is None:
        if any(where.iterdir()):
            problems.append(
                f"{out}: exists and was not written by layerswap (no {MARKER}); refusing to "
                "replace it: remove it yourself or choose another output folder"
            )
    elif found["kind"] != kind:
        problems.append(
            f"{out}: holds {KINDS[found['kind']]} (written by `{found.get('command')}`), not "
            f"{KINDS[kind]}; refusing to replace it"
        )
    elif overwrite and (extra := _foreign_files(where, found)):
        shown = ", ".join(extra[:3]) + (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
        problems.append(
            f"{out}: holds what layerswap did not write there ({shown}); refusing to replace "
            "it: move it out or choose another output folder"
        )
    return problems


def _foreign_files(out: Path, found: dict) -> list[str]:
    """What lies in `out` that its marker does not list, outermost only (a foreign folder as
    "name/", not its contents); [] when the marker lists nothing: an output written in place,
    or one marked before markers listed their files."""
    listed = found.get("files")
    if not isinstance(listed, list):
        return []
    steps = CONTAINERS.get(found.get("kind"), ())
    # A step built inside its container carries its own marker, which no marker lists
    files = set(listed) | {MARKER} | {f"{step}/{MARKER}" for step in steps}
    dirs = {str(parent) for f in listed for parent in Path(f).parents if str(parent) != "."}
    foreign = []
    for root, subdirs, names in os.walk(out):
        rel = Path(root).relative_to(out)
        for d in list(subdirs):
            if str(rel / d) in dirs:
                continue
            subdirs.remove(d)  # its contents go with it: named once
            if rel == Path(".") and _steps_leftover(d, steps):
                continue
            own_step = str(rel / d) in steps
            inner = read_marker(out / rel / d) if own_step else None
            if inner is None:
                foreign.append(f"{rel / d}/")
            else:  # an output of the container's own steps (the merge-only demo's merged/)
                foreign += [str(rel / d / f) for f in _foreign_files(out / rel / d, inner)]
        # a step's lock file (.merged.layerswap.lock) is layerswap's: held by a running step
        # (that writer is refused by the lock itself) or left by a killed one
        foreign += [
            str(rel / n)
            for n in names
            if str(rel / n) not in files
            and not is_lock_file(n)
            and not (rel == Path(".") and _steps_leftover(n, steps))
        ]
    return sorted(foreign)


def _steps_leftover(name: str, steps: tuple[str, ...]) -> bool:
    """Whether `name`, inside a container, is what a writer of one of its `steps` builds or sets
    aside beside it (`.merged.tmp-PID-*`, `.merged.old-PID-*`): layerswap's, left by a killed
    step (the lock's takeover sweeps it), never the user's. A long run's set-aside copy
    (`.NAME.replaced-*`) is not: it holds what the user may want back."""
    parts = writer_sibling_parts(name)
    return parts is not None and parts[0] in steps and parts[1] in ("tmp", "old")
