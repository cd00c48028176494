"""The one output policy: where a command may write, what `--overwrite` may replace, and how.

Every folder a layerswap command writes carries a marker file (`.layerswap.json`) naming the
kind of output, the command that wrote it and the run's identity (a recipe id, a config hash).
`--overwrite` replaces only a folder whose marker names the same kind; it never touches an
input, nor a folder that contains one or lies inside one. A replacement is built beside the old
folder (`output_dir`) or, for long resumable runs, the old one is set aside (`replacing`); the
old one is deleted only once the new one is complete, and put back if the new one fails.
Commands call `check_output` during their checks, before any work starts.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from layerswap.trainables.atomic import atomic_dir, atomic_write_text

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
}


class OutputError(ValueError):
    """An output location that the policy refuses; the message lists every problem."""


def command_line() -> str:
    """The command being run, as a shell would show it (recorded in markers)."""
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if prog in ("__main__.py", "-c", "-m"):
        prog = "layerswap"
    return shlex.join([prog, *sys.argv[1:]])


def marker(kind: str, identity: str | None = None) -> dict:
    """The marker content for a new output of `kind`."""
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r} (known: {sorted(KINDS)})")
    return {
        "kind": kind,
        "command": command_line(),
        "identity": identity,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def read_marker(folder: Path) -> dict | None:
    """The marker of `folder`, or None when layerswap did not write it (or it is unreadable)."""
    try:
        m = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("kind") in KINDS else None


def write_marker(folder: Path, kind: str, identity: str | None = None) -> None:
    """Mark `folder` as an output of `kind` (atomically)."""
    atomic_write_text(Path(folder) / MARKER, json.dumps(marker(kind, identity), indent=1) + "\n")


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
) -> list[str]:
    """Every reason the policy refuses to write an output of `kind` at `out` (empty: allowed).

    Args:
        out: the output folder.
        kind: a key of KINDS.
        overwrite: the user asked to replace an existing output.
        inputs: paths the command reads; `out` may not be, contain or lie inside any of them.
        allow_existing: the caller continues an existing output of the same kind (a resume);
            an existing folder is then checked for its kind only.
    Returns:
        one message per problem, each naming the path.
    """
    out = Path(out)
    where = out.expanduser().resolve()
    problems = _input_problems(out, where, inputs)
    if not out.exists():
        if out.is_symlink():
            problems.append(f"{out}: is a broken symbolic link")
        elif (p := _writable_parent(where)) is not None:
            problems.append(p)
        return problems
    if not out.is_dir():
        problems.append(f"{out}: exists and is not a folder")
        return problems
    if not (overwrite or allow_existing):
        problems.append(f"{out}: already exists; pass --overwrite to replace it")
        return problems
    found = read_marker(out)
    if found is None:
        if any(out.iterdir()):
            problems.append(
                f"{out}: exists and was not written by layerswap (no {MARKER}); refusing to "
                "replace it: remove it yourself or choose another output folder"
            )
    elif found["kind"] != kind:
        problems.append(
            f"{out}: holds {KINDS[found['kind']]} (written by `{found.get('command')}`), not "
            f"{KINDS[kind]}; refusing to replace it"
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
) -> None:
    """The policy for a single output file (a file carries no marker, so `ours` recognises one).

    Args:
        out: the output file.
        overwrite: the user asked to replace an existing file.
        inputs: paths the command reads; `out` may not be, contain or lie inside any of them.
        ours: tells whether an existing file is `what`, written by layerswap.
        what: what such a file is, e.g. "an lm-eval result JSON".
    Raises:
        OutputError listing every problem.
    """
    out = Path(out)
    where = out.expanduser().resolve()
    problems = _input_problems(out, where, inputs)
    if out.is_dir():
        problems.append(f"{out}: is a folder; give a file name")
    elif out.exists():
        if not overwrite:
            problems.append(f"{out}: already exists; pass --overwrite to replace it")
        elif not ours(out):
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
) -> Iterator[Path]:
    """Build an output folder beside `out` and swap it in; the old one goes only after the swap.

    Args: as for `output_problems`; `identity` is recorded in the marker.
    Yields:
        the temporary folder to fill; on an error (or an interrupt) it vanishes and `out` is
        as it was.
    """
    check_output(out, kind, overwrite=overwrite, inputs=inputs)
    with atomic_dir(Path(out), overwrite=overwrite) as tmp:
        yield tmp
        write_marker(tmp, kind, identity)


@contextmanager
def replacing(paths: Iterable[Path]) -> Iterator[dict[Path, Path]]:
    """Set existing `paths` aside while a long run rebuilds them; drop them only on success.

    For outputs written in place over a long, resumable run (training, a search, the demo),
    where building beside would break the absolute paths the run records. On an error or an
    interrupt the partial new outputs are removed and the old ones put back.

    Yields:
        {path: where its old content waits meanwhile} for the paths that existed.
    """
    tag = uuid.uuid4().hex[:8]
    moved = []
    try:
        for p in map(Path, paths):
            if p.exists() or p.is_symlink():
                aside = p.parent / f".{p.name}.replaced-{tag}"
                moved.append((p, aside))  # before the rename: an interrupt between is undone
                os.rename(p, aside)
        yield {p: aside for p, aside in moved}
    except BaseException:
        for p, aside in reversed(moved):
            if not (aside.exists() or aside.is_symlink()):
                continue  # interrupted before its rename: p is still the old one
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            elif p.exists() or p.is_symlink():
                p.unlink()
            os.rename(aside, p)
        raise
    for _, aside in moved:  # an interrupt here leaves only hidden leftovers of the old run
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside, ignore_errors=True)
        elif aside.exists() or aside.is_symlink():
            aside.unlink()
