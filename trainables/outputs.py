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

The markers live in trainables/output_markers.py, the refusals in trainables/output_checks.py;
this module holds the entry points commands call and re-exports the rest.
Run its tests: .venv/bin/python -m pytest -q tests/trainables/test_output_locks.py
tests/cli/test_bad_input_writers.py tests/trainables/test_output_symlinks.py
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from layerswap.trainables import outcome
from layerswap.trainables.atomic import atomic_dir, link_problem, output_path, writer_sibling
from layerswap.trainables.locks import OutputLocked, clear_stale, command_line, writing
from layerswap.trainables.output_checks import (
    input_problems,
    output_problems,
    placement_problems,
    writable_beside,
    writable_parent,
)
from layerswap.trainables.output_markers import (
    KINDS,
    MARKER,
    SEARCH_SIBLINGS,
    OutputError,
    claim_sibling,
    marker,
    read_marker,
    sibling_problems,
    write_marker,
    written_files,
)

# The one output policy's names, wherever they live: markers (output_markers), the checks
# (output_checks), the lock (locks) and the writers below.
__all__ = [
    "KINDS", "MARKER", "SEARCH_SIBLINGS", "OutputError", "OutputLocked", "check_output",
    "check_output_file", "claim_sibling", "command_line", "marker", "nothing_to_do",
    "output_dir", "output_problems", "read_marker", "replacing", "sibling_problems",
    "write_marker", "writing", "written_files",
]  # fmt: skip


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
    problems = input_problems(out, where, inputs)
    problems += placement_problems(out, where, None, maintainer)
    if where.is_dir():
        problems.append(f"{out}: is a folder; give a file name")
    elif where.exists():
        if not overwrite:
            problems.append(f"{out}: already exists; pass --overwrite to replace it")
        elif (p := writable_beside(out, where)) is not None:
            problems.append(p)
        elif not ours(where):
            problems.append(f"{out}: is not {what}; refusing to replace it")
    elif (p := writable_parent(where)) is not None:
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
