"""The one output policy: where a command may write, what `--overwrite` may replace, and how.

Every folder a layerswap command writes carries a marker file (`.layerswap.json`) naming the
kind of output, the command that wrote it and the run's identity (a recipe id, a config hash).
`--overwrite` replaces only a folder whose marker names the same kind, and of a folder built
at once (`output_dir`) only the files its marker lists: a file added since is refused, named.
An output never touches an input, nor a folder that contains one or lies inside one; it never
lies inside another layerswap output (a demo run aside, which holds the pipeline's outputs), nor
inside the installed layerswap package unless a maintainer flag says so. A replacement is built
beside the old folder (`output_dir`) or, for long resumable runs, the old one is set aside
(`replacing`); the old one is deleted only once the new one is complete, and put back if the
new one fails. Commands call `check_output` during their checks, before any work starts, and
hold the output's lock (`writing`, trainables/locks.py) while they write: one writer per output.
An output given as a symbolic link is its target (`atomic.output_path`): the link is kept, and
the data, lock, temporaries and set-aside copy live beside the target.

Run its tests: .venv/bin/python -m pytest -q tests/trainables/test_output_locks.py
tests/cli/test_bad_input_writers.py tests/trainables/test_output_symlinks.py
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from layerswap.trainables import outcome
from layerswap.trainables.atomic import (
    atomic_dir,
    atomic_write_text,
    link_problem,
    output_path,
    writer_sibling,
    writer_sibling_parts,
)
from layerswap.trainables.locks import (
    OutputLocked,
    clear_stale,
    command_line,
    is_lock_file,
    live_owner,
    writing,
)

__all__ = ["OutputLocked", "command_line", "writing"]  # the lock, from the one output policy

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


def nothing_to_do(out: Path, message: str | None) -> None:
    """The one way a command leaves an output it found finished ("nothing to do"): it says
    `message` (stdout), after clearing what a killed writer of `out` left beside it (a stale lock,
    temporaries: `locks.clear_stale`), which would otherwise stay until a writer's next change.

    Args:
        out: the finished output (the path the command locks when it writes it).
        message: the line to print (None: nothing, for a quiet caller).
    """
    clear_stale(out)
    if message is not None:
        print(message)


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


def _relation(out: Path, inp: Path) -> str | None:
    """How `out` relates to the input `inp` ('is', 'contains', 'is inside'), or None."""
    if out == inp:
        return "is"
    if out in inp.parents:
        return "contains"
    if inp in out.parents:
        return "is inside"
    return None


def _input_problems(out: Path, where: Path, inputs: Iterable[Path | str]) -> list[str]:
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


def _placement_problems(out: Path, where: Path, kind: str | None, maintainer: bool) -> list[str]:
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


def _writable_parent(out: Path) -> str | None:
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
    Returns:
        one message per problem, each naming the path.
    """
    out = Path(out)
    if (link := link_problem(out)) is not None:
        return [link]
    where = output_path(out)  # through a symbolic link: its target
    problems = _input_problems(out, where, inputs)
    problems += _placement_problems(out, where, kind, maintainer)
    if not where.exists():
        if (p := _writable_parent(where)) is not None:
            problems.append(p)
        return problems
    if not where.is_dir():
        problems.append(f"{out}: exists and is not a folder")
        return problems
    if not (overwrite or allow_existing):
        problems.append(f"{out}: already exists; pass --overwrite to replace it")
        return problems
    if (p := _writable_beside(out, where)) is not None:
        return [*problems, p]
    return problems + _existing_problems(out, where, kind, overwrite)


def _writable_beside(out: Path, where: Path) -> str | None:
    """A problem with writing beside the existing `out` (really `where`), or None: its lock, a
    replacement's temporary and the set-aside old one are made in its folder, so a read-only
    mount is named here, before work, not by the lock's write failing (exit 1)."""
    if os.access(where.parent, os.W_OK | os.X_OK):
        return None
    return f"{out}: cannot be replaced or continued, {where.parent} is not writable"


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


def check_output(out: Path, kind: str, **kw) -> None:
    """`output_problems`, raised as one OutputError listing them all (see there for Args)."""
    problems = output_problems(out, kind, **kw)
    if problems:
        raise OutputError("\n  ".join(problems))


def check_output_file(
    out: Path,
    *,
    overwrite: bool = False,
    inputs: Iterable[Path | str] = (),
    ours: Callable[[Path], bool],
    what: str,
    maintainer: bool = False,
) -> None:
    """The policy for a single output file (a file carries no marker, so `ours` recognises one).

    Args:
        out: the output file.
        overwrite: the user asked to replace an existing file.
        inputs: paths the command reads; `out` may not be, contain or lie inside any of them.
        ours: tells whether an existing file is `what`, written by layerswap.
        what: what such a file is, e.g. "an lm-eval result JSON".
        maintainer: a maintainer command may write into the installed package.
    Raises:
        OutputError listing every problem.
    """
    out = Path(out)
    if (link := link_problem(out)) is not None:
        raise OutputError(link)
    where = output_path(out)  # through a symbolic link: its target
    problems = _input_problems(out, where, inputs)
    problems += _placement_problems(out, where, None, maintainer)
    if where.is_dir():
        problems.append(f"{out}: is a folder; give a file name")
    elif where.exists():
        if not overwrite:
            problems.append(f"{out}: already exists; pass --overwrite to replace it")
        elif (p := _writable_beside(out, where)) is not None:
            problems.append(p)
        elif not ours(where):
            problems.append(f"{out}: is not {what}; refusing to replace it")
    elif (p := _writable_parent(where)) is not None:
        problems.append(p)
    if problems:
        raise OutputError("\n  ".join(problems))


@contextmanager
def output_dir(
    out: Path,
    kind: str,
    *,
    overwrite: bool = False,
    inputs: Iterable[Path | str] = (),
    identity: str | None = None,
    maintainer: bool = False,
) -> Iterator[Path]:
    """Build an output folder beside `out` and swap it in; the old one goes only after the swap.
    The output's lock is held throughout (checked again under it: another writer may have
    finished meanwhile), and the marker lists every file written.

    Args: as for `output_problems`; `identity` is recorded in the marker.
    Yields:
        the temporary folder to fill; on an error (or an interrupt) it vanishes and `out` is
        as it was.
    """
    check_output(out, kind, overwrite=overwrite, inputs=inputs, maintainer=maintainer)
    with writing(out):
        check_output(out, kind, overwrite=overwrite, inputs=inputs, maintainer=maintainer)
        placed = partial(outcome.placed, Path(out))
        with atomic_dir(Path(out), overwrite=overwrite, on_placed=placed) as tmp:
            yield tmp
            write_marker(tmp, kind, identity, files=written_files(tmp))


@contextmanager
def replacing(paths: Iterable[Path]) -> Iterator[dict[Path, Path]]:
    """Set existing `paths` aside while a long run rebuilds them; drop them only on success.

    For outputs written in place over a long, resumable run (training, a search, the demo),
    where building beside would break the absolute paths the run records. On an error or an
    interrupt the partial new outputs are removed and the old ones put back.

    A path given as a symbolic link keeps it: its target is set aside (beside the target) and an
    empty folder made in its place when it was one, so a run writing in place through the link
    (`mkdir(exist_ok=True)`, then files) writes into the target.

    Yields:
        {path: where its old content waits meanwhile} for the paths that existed.
    """
    tag = uuid.uuid4().hex[:8]
    moved = []
    try:
        for given in map(Path, paths):
            p = output_path(given)
            if p.exists():
                aside = writer_sibling(p, "replaced", tag)  # its pid: named if we are killed
                moved.append((given, p, aside))  # before the rename: an interrupt is undone
                os.rename(p, aside)
                if given.is_symlink() and aside.is_dir():
                    p.mkdir()  # the link leads to a folder still: no mkdir through a dangling one
        yield {given: aside for given, _, aside in moved}
    except BaseException:
        for given, p, aside in reversed(moved):
            if not (aside.exists() or aside.is_symlink()):
                continue  # interrupted before its rename: p is still the old one
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            elif p.exists() or p.is_symlink():
                p.unlink()
            os.rename(aside, p)
            outcome.put_back(given)  # the interrupted line says so (not "continue it")
        raise
    for _, _, aside in moved:  # an interrupt here leaves only hidden leftovers of the old run
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside, ignore_errors=True)
        elif aside.exists() or aside.is_symlink():
            aside.unlink()
