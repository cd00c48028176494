"""One writer per output: an exclusive lock a command holds on its output for its lifetime.

`writing(out)` takes the lock of `out` (a folder or a file) or refuses in one line naming the
owner (pid, host, command, since when); trainables/outputs.py, the one output policy, takes it
for every writer, so every command gets it from one place. Readers never take it: a lock only
keeps a second writer out.

The lock is a file beside the output, `.NAME.layerswap.lock`, not inside it: outputs are built
in a temporary sibling and renamed into place (trainables/atomic.py), or set aside while a run
rebuilds them (`outputs.replacing`); a file inside would move away with the old folder, and two
writers would then lock two different files. It lies beside where the output really is
(`atomic.output_path`): an output given as a symbolic link is locked beside its target. It holds
the owner's pid, host and command as JSON and is locked with `fcntl.flock`, which the kernel
drops when the owner dies: a lock file whose flock is free is stale (its owner was killed), and
is taken over, saying so. The file is removed when the lock is released, so nothing is left
beside the output. The lock file itself (path, owner record, held or not) is
trainables/lock_files.py. Taking over a stale lock also clears what its dead owner left
(trainables/lock_recovery.py): its temporary siblings (`.NAME.tmp-PID-*`, trainables/atomic.py)
beside the output and inside it (a step it was writing there) are removed, an output it was
swapping out (`.NAME.old-PID-*`) is put back, and one its long run was replacing
(`.NAME.replaced-PID-*`) is named, each in one line.

Run its tests: .venv/bin/python -m pytest -q tests/trainables/test_output_locks.py
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from layerswap.trainables.lock_files import SUFFIX, busy_owner, lock_path, owner_text, read_owner
from layerswap.trainables.lock_recovery import sweep_dead_writer

# Pids holding locks that this process's tree writes under: children (Ray's processes started
# after the lock, subprocesses) inherit it, and may write outputs inside those of their owner.
OWNERS_ENV = "LAYERSWAP_LOCK_OWNERS"
# The command a process works for, set by the CLI: a Ray worker's own argv is Ray's
# default_worker.py, which the markers and locks it writes would otherwise record.
COMMAND_ENV = "LAYERSWAP_COMMAND"
# This process among all that had its pid: in a container every command may be pid 1, so a stale
# lock of a killed pid-1 writer carries the next writer's own pid.
_NONCE = uuid.uuid4().hex
PROBE_RETRIES = 10  # a lock busy 10 times 20 ms apart is held, not probed

# Locks this process holds: {lock file: [fd, depth]}. A command takes its output's lock early and
# the library takes it again where it writes (an `output_dir` inside `merge`); flock locks belong
# to an open file, so a second open in the same process would refuse its own owner.
_HELD: dict[Path, list[int]] = {}


class OutputLocked(ValueError):
    """Another live process is writing the output (the message names it); exit 2."""


def _open_locked(path: Path, out: Path) -> int:
    """Open `path` and flock it, or raise OutputLocked naming its owner.

    Retries when the file was replaced or removed between the open and the flock (its owner
    released it meanwhile): the lock must be on the file the path names now.
    """
    tries = 0
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = read_owner(fd)
            os.close(fd)
            tries += 1
            if tries < PROBE_RETRIES:  # another writer's brief probe (`_inside_locked`) passes
                time.sleep(0.02)
                continue
            raise OutputLocked(
                f"{out}: another layerswap command is writing it: {owner_text(info)}; wait for "
                f"it to finish or stop it (its lock: {path})"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _working_for(pid: object) -> bool:
    """Whether this process works for the process `pid`: one of its descendants (a local Ray
    worker of a driver, a subprocess), or started under a lock it holds (OWNERS_ENV)."""
    if not isinstance(pid, int):
        return False
    if str(pid) in os.environ.get(OWNERS_ENV, "").split(","):
        return True
    p = os.getpid()
    while p > 1:
        if p == pid:
            return True
        try:  # /proc/P/stat: "pid (comm) state ppid ..."; comm may hold spaces and parens
            p = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _inside_locked(where: Path) -> None:
    """Refuse an output inside (or holding) an output another live process is writing.

    An ancestor's lock file is tried (never kept): a free one is stale and left alone.
    """
    for anc in where.parents:
        path = anc.parent / f".{anc.name}{SUFFIX}"
        if path in _HELD or not path.exists():
            continue
        info = busy_owner(path)
        if info is None or _working_for(info.get("pid")):
            continue  # free, or e.g. the demo's training runs in Ray workers of its driver
        raise OutputLocked(
            f"{where}: lies inside {anc}, which another layerswap command is writing: "
            f"{owner_text(info)}; wait for it to finish or choose another output"
        )


def _holding_locked(where: Path) -> None:
    """Refuse to write a folder that holds an output another live process is writing (e.g. a
    demo run replaced while a search writes inside it)."""
    if not where.is_dir():
        return
    for path in where.rglob(f".*{SUFFIX}"):
        if path in _HELD:
            continue
        info = busy_owner(path)
        if info is not None:
            inner = path.parent / path.name[1 : -len(SUFFIX)]
            raise OutputLocked(
                f"{where}: holds {inner}, which another layerswap command is writing: "
                f"{owner_text(info)}; wait for it to finish or stop it"
            )


def live_owner(out: Path | str) -> str | None:
    """Who holds `out`'s lock, as one phrase, while another live process holds it; else None."""
    path = lock_path(Path(out))
    if path in _HELD:  # this process's own lock (it checks again under it)
        return None
    info = busy_owner(path)
    return None if info is None or _working_for(info.get("pid")) else owner_text(info)


def _make_parents(parent: Path) -> list[Path]:
    """Create `parent` and its missing ancestors; returns those created, outermost first."""
    made = []
    p = parent
    while not p.exists():
        made.append(p)
        p = p.parent
    parent.mkdir(parents=True, exist_ok=True)
    return list(reversed(made))


def _take(path: Path, out: Path) -> int:
    """Flock `path` for this process and write the owner record; a stale one is named."""
    fd = _open_locked(path, out)
    try:
        before = read_owner(fd)
        if before and (before.get("pid") != os.getpid() or before.get("nonce") != _NONCE):
            print(
                f"layerswap: {out}: taking over a stale lock of {owner_text(before)}, which is "
                "no longer running",
                file=sys.stderr,
                flush=True,
            )
            sweep_dead_writer(path.parent / path.name[1 : -len(SUFFIX)], before)
        record = {
            "pid": os.getpid(),
            "nonce": _NONCE,
            "host": socket.gethostname(),
            "command": command_line(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
        # On a shared file system (EFS/NFS) other nodes read the owner record to check they
        # see this RUN (node_paths); unsynced, a node could read the truncated, empty file.
        os.fsync(fd)
    except BaseException:  # e.g. Ctrl-C while the record was written: the lock is ours, so it
        _release(path, fd, [])  # goes as on a normal release, not left behind as a stale file
        raise
    return fd


def _release(path: Path, fd: int, made: list[Path]) -> None:
    """Remove the lock file (while still holding it), unlock, and drop parents made for it."""
    try:
        path.unlink(missing_ok=True)  # before the unlock: a waiter re-checks the inode
    finally:
        os.close(fd)  # closes the flock too
    _drop_parents(made)


_UNSET = object()


@contextmanager
def writing(out: Path | str) -> Iterator[Path]:
    """Hold the exclusive lock of the output `out` while the block runs (re-entrant).

    Args:
        out: the output folder or file (it need not exist; missing parents are created and,
            if still empty, removed again on release).
    Yields:
        the lock file.
    Raises:
        OutputLocked: a live process (of this host or another sharing the filesystem) holds
            it, or `out` lies inside an output another process is writing.
    """
    out = Path(out)
    path = lock_path(out)
    if path in _HELD:
        _HELD[path][1] += 1
        try:
            yield path
        finally:
            _HELD[path][1] -= 1
        return
    where = path.parent / path.name[1 : -len(SUFFIX)]
    _inside_locked(where)
    _holding_locked(where)
    try:
        made = _make_parents(path.parent)
    except OSError as e:  # a parent that is a file, or not writable: named, not a traceback
        raise ValueError(f"{out}: cannot be created ({e.strerror}: {e.filename})") from None
    owners = _UNSET
    try:
        fd = _take(path, out)
    except OSError as e:  # e.g. a read-only folder: named, not a traceback
        _drop_parents(made)
        raise ValueError(f"{out}: cannot take its lock {path} ({e.strerror})") from None
    except BaseException:
        _drop_parents(made)
        raise
    # The try starts as _take returns: a Ctrl-C in the bookkeeping below (os.environ's methods
    # are Python calls, where signal handlers run) left the lock file behind, as a stale lock of
    # a command that exited 130 (a test stopping the writer just after it took the lock saw it).
    try:
        _HELD[path] = [fd, 1]
        owners = os.environ.get(OWNERS_ENV)
        os.environ[OWNERS_ENV] = ",".join(filter(None, [owners, str(os.getpid())]))
        yield path
    finally:
        try:  # the bookkeeping runs Python calls too, where a Ctrl-C can land: released anyway
            _HELD.pop(path, None)
            if owners is None:
                os.environ.pop(OWNERS_ENV, None)
            elif owners is not _UNSET:
                os.environ[OWNERS_ENV] = owners
        finally:
            _release(path, fd, made)


def clear_stale(out: Path | str) -> None:
    """Clear what a killed writer of `out` left (its stale lock, its temporaries, a swap it cut)
    without writing `out`: for a command that finds its output finished and leaves it as it is
    (outputs.nothing_to_do). The stale lock is taken over, which sweeps (saying so), and
    released. A lock a live process holds, or this one, is left alone: a reader is never blocked.

    Args:
        out: the output folder or file.
    """
    path = lock_path(Path(out))
    if path in _HELD or not path.exists() or busy_owner(path) is not None:
        return
    try:
        with writing(out):
            pass
    except ValueError:  # a live writer took it meanwhile, or the folder is read-only: left
        pass


def _drop_parents(made: list[Path]) -> None:
    """Remove the folders made for a lock, innermost first, while they are empty: a refused or
    failed command leaves no new empty folders."""
    for p in reversed(made):
        try:
            p.rmdir()
        except OSError:
            break


def command_line() -> str:
    """The command being run, as a shell would show it (recorded in locks and markers): the
    `layerswap` command this process works for (COMMAND_ENV, which Ray workers inherit from
    the driver, trainables/ray_session.py), else this process's own command line."""
    if cmd := os.environ.get(COMMAND_ENV):
        return cmd
    return own_command_line()


def own_command_line(argv: list[str] | None = None) -> str:
    """This process's command line, or `layerswap ARGV` for a command called in-process."""
    if argv is not None:
        return shlex.join(["layerswap", *argv])
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if prog in ("__main__.py", "-c", "-m"):
        prog = "layerswap"
    return shlex.join([prog, *sys.argv[1:]])
