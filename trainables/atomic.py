"""Atomic outputs: folders and files built in a temporary sibling, renamed into place, never
half-written. Every writer of a run's files goes through here, and every reader of a Parquet file
that a running job may replace (`read_parquet`). A write the file system refuses (a full disk, a
quota, a file-size limit, a read-only mount) leaves nothing behind and becomes `WriteFailed`, one
line naming the output (the CLI exits 1).

An output given through a symbolic link (`runs/exp1 -> /scratch/me/exp1`) is its target:
`output_path` resolves it, and every writer here, the output policy (trainables/outputs.py) and
its lock (trainables/locks.py) take their path from it, so the link survives and the data, the
temporaries and the lock all live beside the target.

Run its tests: .venv/bin/python -m pytest -q tests/trainables/test_atomic.py
tests/trainables/test_output_symlinks.py
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from layerswap.spaces.errors import RunFailed

if TYPE_CHECKING:
    import pyarrow

# What the file system answers a write it refuses: the output cannot be finished where it is
# (a full disk, a quota, a file-size limit, a read-only mount). Read errors (EIO) are not here:
# a writer also reads its inputs.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
# Rust libraries (safetensors, tokenizers) report an OS error only in their message.
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")


class WriteFailed(RunFailed):
    """The file system refused to write an output mid-run; its partial files were removed."""


def write_failure(e: BaseException, out: Path | str | None = None) -> WriteFailed | None:
    """`e` as one line naming the output, when it (or an error it was raised from) is a write
    the file system refused (WRITE_ERRNOS); else None.

    Args:
        e: the error a writer raised (libraries wrap the OSError: safetensors' SafetensorError
            names only the errno, torch a RuntimeError).
        out: the output being written (the error's own file name when not given).
    """
    if not isinstance(e, Exception):  # an interrupt stays an interrupt
        return None
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, WriteFailed):
            return cur
        code = cur.errno if isinstance(cur, OSError) else _rust_errno(str(cur))
        if code in WRITE_ERRNOS:
            where = out if out is not None else getattr(cur, "filename", None)
            what = f"{where}: could not be written" if where else "an output could not be written"
            return WriteFailed(f"{what} ({os.strerror(code)}); nothing half-written was kept")
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _rust_errno(message: str) -> int | None:
    m = _RUST_OS_ERROR.search(message)
    return int(m.group(1) or m.group(2)) if m else None


def output_path(out: Path | str) -> Path:
    """Where the output `out` really is: `~` expanded and every symbolic link resolved, the last
    component's too (a link to a missing target resolves to that target).

    The one place an output's spelling becomes its location. Renaming a new folder onto a link
    would replace the link (the user's pointer to scratch storage gone, the data on the home
    disk), and temporaries made beside the link would lie where the lock's sweep never looks.

    Args:
        out: the output folder or file, as the user gave it.
    Returns:
        the absolute, resolved path.
    Raises:
        ValueError: `out` passes through a symbolic link loop (one line naming it).
    """
    real = Path(os.path.realpath(Path(out).expanduser()))
    if real.is_symlink():  # realpath stops where a link cannot be followed: a loop
        raise ValueError(f"{out}: is a symbolic link loop ({real} never reaches a file)")
    return real


def link_problem(out: Path | str) -> str | None:
    """Why `out` cannot be written through its symbolic links, or None (no link, or one that
    leads somewhere): a link loop, or a link (`out` or a folder it lies in) to a missing target
    whose own folder is missing too.

    A missing target is created when its folder exists (a user who linked `runs/exp1` to
    `/scratch/me/exp1` before the first run means that folder); a missing folder too is more
    likely an unmounted scratch disk or a mistyped link, where creating a chain of folders would
    put the data on the wrong disk.
    """
    try:
        if output_path(out).exists():
            return None  # every link on the way leads somewhere
    except ValueError as e:
        return str(e)
    path = Path(out).expanduser().absolute()
    for link in [path, *path.parents]:
        if not link.is_symlink() or link.exists():
            continue
        target = output_path(link)
        if not target.parent.is_dir():
            what = "is" if link == path else f"lies in {link}, which is"
            return (
                f"{out}: {what} a symbolic link to {target}, which does not exist (nor does its "
                f"folder {target.parent}); create that folder or fix the link"
            )
    return None


def temp_sibling(out: Path) -> Path:
    """The hidden sibling `.NAME.tmp-PID-TAG` a writer of `out` builds it in: the pid names the
    writer, so a later writer that takes over from a killed one knows which temps were its
    (`dead_writer_temps`)."""
    return writer_sibling(out, "tmp", uuid.uuid4().hex[:8])


def writer_sibling(out: Path, kind: str, tag: str) -> Path:
    """`.NAME.KIND-PID-TAG` beside `out`: where this process keeps a temporary (`tmp`), an output
    it is swapping out (`old`, `atomic_dir`) or one a long run replaces (`replaced`,
    outputs.replacing)."""
    return out.parent / f".{out.name}.{kind}-{os.getpid()}-{tag}"


_WRITER_SIBLING = re.compile(r"\.(.+)\.(tmp|old|replaced)-(\d+)-[0-9a-f]{8}")


def is_writer_sibling(name: str) -> bool:
    """Whether a file or folder name is a writer's `writer_sibling` (a temporary, or an output
    set aside), of any pid: not content anyone reads as an input."""
    return writer_sibling_parts(name) is not None


def writer_sibling_parts(name: str) -> tuple[str, str, int] | None:
    """(output name, kind, pid) of a `writer_sibling` name (`.merged.tmp-942-0a1b2c3d`:
    ("merged", "tmp", 942)); None for any other name.

    Args:
        name: a file or folder name.
    """
    m = _WRITER_SIBLING.fullmatch(name)
    return None if m is None else (m.group(1), m.group(2), int(m.group(3)))


def dead_writer_temps(out: Path, pid: int, kind: str = "tmp") -> list[Path]:
    """The siblings of `out` of one `kind` that the writer `pid` made (`writer_sibling`'s names).

    Only for a writer known dead: the caller holds `out`'s lock, taken over from `pid`'s stale
    one. Names of any other form (another pid, a user's file) are never returned.
    """
    return [p for name, p in dead_writer_siblings(out.parent, pid, kind) if name == out.name]


def dead_writer_siblings(parent: Path, pid: int, kind: str) -> list[tuple[str, Path]]:
    """(output name, path) of every `.NAME.KIND-PID-TAG` in `parent` that the writer `pid` made,
    whatever the output (a search sets aside four outputs beside the one it locks)."""
    try:
        found = [(m.group(1), p) for p in parent.iterdir() if (m := _WRITER_SIBLING.fullmatch(p.name)) and m.group(2) == kind and int(m.group(3)) == pid]  # fmt: skip
    except OSError:  # the parent is gone or unreadable: nothing of ours to find there
        return []
    return sorted(found)


def remove_left_temps(folder: Path) -> list[Path]:
    """Remove the temporaries killed writers left in `folder` (not below it), one line each on
    stderr: `.NAME.tmp-*`, `temp_sibling`'s folders and a Ray upload's staging folder
    (ray_train._upload_into).

    Only for the one writer of the run `folder` belongs to, before it writes there: it holds the
    run's lock (or is a trial of the sweep that holds it), so no live writer's temporary can be
    there. A SIGKILL runs no cleanup, and a checkpoint's temporary holds a whole model.

    Args:
        folder: where the writer builds its outputs (missing: nothing to do).
    Returns:
        the paths removed.
    """
    found = sorted(Path(folder).glob(".*.tmp-*"))
    for stale in found:
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
        print(f"layerswap: removed {stale}, left unfinished by a killed writer", file=sys.stderr, flush=True)  # fmt: skip
    return found


@contextmanager
def atomic_dir(
    out: Path, *, overwrite: bool = False, on_placed: Callable[[bool], None] | None = None
) -> Iterator[Path]:
    """Yield a temporary folder next to `out`; on success it becomes `out`, on error it vanishes.

    Args:
        out: the final folder.
        overwrite: replace an existing `out` (only after the new one is complete).
        on_placed: called once the new folder is `out` (with whether it replaced an old one),
            also when an interrupt lands after that rename, while the old one is deleted: the
            command's interrupted line then says the output is complete (trainables/outcome.py).
    """
    given, out = out, output_path(out)  # through a link: into its target, the link kept
    if out.exists() and not overwrite:
        raise FileExistsError(f"{given}: already exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(out)
    tag = tmp.name.rsplit("-", 1)[1]
    tmp.mkdir()
    old = None
    try:
        yield tmp
        follow_umask(tmp)
        if out.exists():
            old = writer_sibling(out, "old", tag)  # the pid in it: a killed swap is undone
            os.rename(out, old)
        os.rename(tmp, out)
    except BaseException as e:
        # Only the rename moves the temporary folder away: gone, the new output is in place
        if on_placed is not None and not tmp.exists():
            on_placed(old is not None)
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists():
            if out.exists():  # interrupted right after the swap: the new output is complete
                shutil.rmtree(old, ignore_errors=True)
            else:  # interrupted between the two renames: the old output goes back
                os.rename(old, out)
        if (failed := write_failure(e, given)) is not None and failed is not e:
            raise failed from None  # a full disk is one line naming the output, no traceback
        raise
    if on_placed is not None:
        on_placed(old is not None)
    if old is not None:
        try:
            shutil.rmtree(old)
        except BaseException:  # interrupted mid-delete: finish it, leave no half old output
            shutil.rmtree(old, ignore_errors=True)
            raise


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write a file so readers see the old content or the new, never a prefix.

    Args:
        path: the final file.
        write: writes the whole content to the temporary sibling path it is given.
    """
    given, path = path, output_path(path)  # through a link: into its target, the link kept
    tmp = temp_sibling(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if (failed := write_failure(e, given)) is not None and failed is not e:
            raise failed from None
        raise


def read_parquet(path: Path) -> pyarrow.Table:
    """Read a Parquet file through one open handle: the old table or the new, never a mix.

    `pyarrow.parquet.read_table(path)` (and `pandas.read_parquet(path)`) open the path twice
    (strace: once for the footer, once for the pages); when `atomic_write` replaces the file in
    between, the old file's footer is used on the new file's bytes and the read fails ("Page was
    smaller than expected"). Measured with a writer replacing a 1-50 row table in a loop: 44 % of
    path reads failed, none through a handle. The handle keeps the inode it opened, which
    `os.replace` leaves whole; pyarrow's own file (not a Python one) keeps its reads native.

    Args:
        path: the .parquet file.
    Returns:
        The table (pyarrow errors pass through for the caller to name the file).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pa.OSFile(str(path)) as fh:
        return pq.read_table(fh)


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write` of a UTF-8 text file."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def follow_umask(root: Path) -> None:
    """Give everything under `root` the mode a plain open()/mkdir() would under this umask.

    safetensors >= 0.8 writes through a 0o600 temporary file renamed into place
    (safetensors/safetensors#782), so base/model.safetensors would otherwise be private while
    its neighbours follow the umask. The modes are read off probes, not os.umask(), which
    cannot be read without being set (a race with other threads).
    """
    probe = root / f".umask-probe-{os.getpid()}"
    probe.mkdir()
    dir_mode = stat.S_IMODE(probe.stat().st_mode)
    probe.rmdir()
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    os.close(fd)
    file_mode = stat.S_IMODE(probe.stat().st_mode)
    probe.unlink()
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        mode = stat.S_IMODE(p.stat().st_mode)
        want = dir_mode if p.is_dir() else file_mode | (dir_mode & 0o111 if mode & 0o111 else 0)
        if mode != want:
            p.chmod(want)
