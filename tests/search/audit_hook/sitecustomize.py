"""An outside record of the files a process opens: a `sys.addaudithook` on the `open` event.

Python imports `sitecustomize` at startup from the first folder on PYTHONPATH that has one, so a
process started with this folder on PYTHONPATH and LAYERSWAP_AUDIT_DIR / LAYERSWAP_AUDIT_ROOTS
set (Ray's raylet and every worker it spawns inherit them from the driver that starts Ray)
appends one line `pid<TAB>mode<TAB>path` to LAYERSWAP_AUDIT_DIR/<pid>.log for every open of a
file under one of the roots (os.pathsep-separated). The test process itself, already running,
calls `start()` / `stop()`. Used by tests/search/test_split_audit.py; nothing here imports the
project, so what it records does not depend on the code under test.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

DIR_VAR = "LAYERSWAP_AUDIT_DIR"
ROOTS_VAR = "LAYERSWAP_AUDIT_ROOTS"
# Set per Ray node (its raylet's env_vars, inherited by the node's workers): the process writes
# its node's label to LAYERSWAP_AUDIT_DIR/<pid>.node, so a test can tell which node opened what.
NODE_VAR = "LAYERSWAP_AUDIT_NODE"

# Audit hooks cannot be removed, so one hook per process reads this switchable state.
_state: dict = {"dir": None, "roots": ()}
# Writing the log opens a file too; per thread, so another thread's open is never skipped.
_local = threading.local()
_installed = False


def _hook(event: str, args: tuple) -> None:
    if event != "open" or _state["dir"] is None or getattr(_local, "busy", False):
        return
    path = args[0]
    if isinstance(path, int):  # os.fdopen / open(fd): no new file
        return
    try:
        path = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return
    if not path.startswith(_state["roots"]):
        return
    mode = args[1] if args[1] is not None else f"flags={args[2]}"
    _local.busy = True
    try:
        with open(os.path.join(_state["dir"], f"{os.getpid()}.log"), "a") as f:
            f.write(f"{os.getpid()}\t{mode}\t{path}\n")
    except OSError:
        pass
    finally:
        _local.busy = False


def start(log_dir: str | os.PathLike, roots: list[str | os.PathLike]) -> None:
    """Record this process's opens under `roots` into `log_dir` (installs the hook once)."""
    global _installed
    # Both spellings of each root: a caller may open a file through a symlinked path.
    spelled = {os.path.join(os.path.abspath(r), "") for r in roots}
    spelled |= {os.path.join(os.path.realpath(r), "") for r in roots}
    _state["roots"] = tuple(sorted(spelled))
    _state["dir"] = os.fspath(log_dir)
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


def stop() -> None:
    """Stop recording (the hook stays installed, idle)."""
    _state["dir"] = None


def environment(log_dir: str | os.PathLike, roots: list[str | os.PathLike]) -> dict[str, str]:
    """The environment variables that make processes started with them record their opens."""
    here = str(Path(__file__).resolve().parent)
    old = os.environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": here if not old else here + os.pathsep + old,
        DIR_VAR: os.fspath(log_dir),
        ROOTS_VAR: os.pathsep.join(os.fspath(r) for r in roots),
    }


def read_nodes(log_dir: str | os.PathLike) -> dict[int, str]:
    """pid -> node label, for every recording process that was started with NODE_VAR set."""
    return {int(f.stem): f.read_text() for f in Path(log_dir).glob("*.node")}


def read_log(log_dir: str | os.PathLike) -> list[tuple[int, str, str]]:
    """Every recorded open, as (pid, mode, path), from all processes' logs in `log_dir`."""
    out = []
    for f in sorted(Path(log_dir).glob("*.log")):
        for line in f.read_text().splitlines():
            pid, mode, path = line.split("\t", 2)
            out.append((int(pid), mode, path))
    return out


if __name__ == "sitecustomize" and os.environ.get(DIR_VAR):
    if os.environ.get(NODE_VAR):
        Path(os.environ[DIR_VAR], f"{os.getpid()}.node").write_text(os.environ[NODE_VAR])
    start(os.environ[DIR_VAR], [r for r in os.environ.get(ROOTS_VAR, "").split(os.pathsep) if r])
