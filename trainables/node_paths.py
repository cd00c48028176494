"""Refuse, before any trial or training worker starts, a local input path some Ray node cannot see.

A driver runs on the head, where every path of its config exists, so each driver-side check
passes; on a `ray up` cluster a worker node without that path failed minutes or hours later with
a file-not-found deep in a worker's traceback. `check_node_paths(inputs)` (after `init_ray`) runs
one tiny task pinned to each alive node with CPUs or GPUs, which describes each path there (kind,
size, the file names and sizes under a folder: no hashing), and raises NodePathError, one line
per problem, where a node's view differs from the driver's. With one node alive it returns at
once. Nodes that join later (an autoscaler's GPU nodes) are checked where the work runs: the
driver passes `described(inputs)` in a trial's or training worker's config and the worker calls
`check_here` before it loads anything (the same `difference` rule; once per process). The
command's lock file in RUN (trainables/locks.py) is compared by content too: a node that sees
another RUN, or none, is named. The listing of paths is spaces/local_inputs.py. Tests:
.venv/bin/python -m pytest -q tests/trainables/test_node_paths.py
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from layerswap.trainables.lock_files import SUFFIX as LOCK_SUFFIX
from layerswap.trainables.lock_files import lock_path
from layerswap.trainables.ray_session import init_ray

TIMEOUT_S = 60.0  # a node that has not answered by then is named on stderr and left unchecked
MAX_FILES = 5000  # files described under one folder (an HF cache or a world has far fewer)
SHOWN = 3  # file names quoted per problem
FIX = (
    "put it on storage every node mounts (e.g. the cluster's EFS at /mnt/layerswap) or in a bucket"
)

# (inputs, nodes) already checked by this process: the sweep's CLI checks before it writes its
# folder, and run_sweep, which others call directly, checks again.
_CHECKED: set[tuple] = set()
# Descriptions a worker process found as the driver's: a reused actor (the next trial, the next
# attempt of a worker group in the same process) does not describe them again.
_HERE_OK: set[int] = set()
RUN_FIELD = "--out (this command's lock in RUN)"


class NodePathError(ValueError):
    """A local input path is missing, or differs, on some Ray node (one line per problem)."""


def describe(path: str) -> dict:
    """What a worker reading `path` would find: cheap facts only (no file is read, except a
    command's lock file, LOCK_SUFFIX, whose few bytes name the command holding it).

    Args:
        path: an absolute path.
    Returns:
        {"kind": "missing"} | {"kind": "file", "size": n[, "text": lock's owner record]} |
        {"kind": "dir", "files": {relative path: size}, "cut": bool}; hidden entries (".x",
        lock files, caches' metadata) are left out, and a folder's listing stops at MAX_FILES.
    """
    p = Path(path)
    try:
        if p.is_file():
            if p.name.endswith(LOCK_SUFFIX):  # another command's lock can have the same size
                return {"kind": "file", "size": p.stat().st_size, "text": p.read_text("utf-8", "replace")}  # fmt: skip
            return {"kind": "file", "size": p.stat().st_size}
        if not p.is_dir():
            return {"kind": "missing"}
        files: dict[str, int] = {}
        for root, dirs, names in os.walk(p, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(n for n in names if not n.startswith(".")):
                full = os.path.join(root, name)
                try:
                    files[os.path.relpath(full, p)] = os.stat(full).st_size
                except OSError:  # a dangling link reads as missing there
                    continue
                if len(files) >= MAX_FILES:
                    return {"kind": "dir", "files": files, "cut": True}
        return {"kind": "dir", "files": files, "cut": False}
    except OSError as e:  # e.g. no permission: as good as missing to a worker
        return {"kind": "missing", "why": e.strerror}


@ray.remote(num_cpus=0, max_retries=0)
def _describe_all(paths: list[str]) -> dict[str, dict]:
    return {p: describe(p) for p in paths}


def difference(here: dict, there: dict) -> str | None:
    """How a node's description of a path differs from the driver's, in words, or None.

    Args:
        here, there: `describe` of the path on the driver and on the node.
    """
    if there["kind"] == "missing":
        return "missing there" + (f" ({there['why']})" if there.get("why") else "")
    if here["kind"] != there["kind"]:
        names = {"file": "a file", "dir": "a folder"}
        return f"{names[here['kind']]} here, {names[there['kind']]} there"
    if here["kind"] == "file":
        if here.get("text") is not None and here["text"] != there.get("text"):
            return "another command's lock there (or another folder): not this RUN"
        if here["size"] != there["size"]:
            return f"{here['size']} bytes here, {there['size']} there"
        return None
    a, b = here["files"], there["files"]
    if there.get("cut"):  # a listing cut short there: only the names it reached compare
        a = {k: v for k, v in a.items() if k in b}
    missing = sorted(set(a) - set(b))
    sized = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    parts = []
    if missing:
        parts.append(f"{len(missing)} of its {len(a)} file(s) missing there ({_some(missing)})")
    if sized:
        k = sized[0]
        more = f" and {len(sized) - 1} more" if len(sized) > 1 else ""
        parts.append(f"other sizes there: {k} {a[k]} bytes here, {b[k]} there{more}")
    return "; ".join(parts) or None


def _some(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")


def path_problems(inputs: list[tuple[str, str]], here: dict[str, dict], nodes: dict[str, dict[str, dict]]) -> list[str]:  # fmt: skip
    """One line per (node, input) whose description differs from the driver's.

    Args:
        inputs: [(config field, path)] (spaces/local_inputs.py).
        here: {path: describe(path)} on the driver.
        nodes: {node label: {path: describe(path) there}}.
    Returns:
        e.g. "node 10.0.1.7 (3f2a9c1e): base /data/base: missing there; put it on ...".
    """
    out = []
    for node, seen in nodes.items():
        for field, path in inputs:
            if here[path]["kind"] == "missing":
                continue  # the driver-side checks speak for a path missing here
            if (why := difference(here[path], seen[path])) is not None:
                out.append(f"node {node}: {field} {path}: {why}; {FIX}")
    return out


def worker_nodes() -> list[dict]:
    """The alive Ray nodes with CPUs or GPUs (ray.nodes() entries): where workers may run."""
    res = ("CPU", "GPU")
    return [n for n in ray.nodes() if n.get("Alive") and any(n.get("Resources", {}).get(r, 0) > 0 for r in res)]  # fmt: skip


def check_node_paths(inputs: list[tuple[str, str]], timeout_s: float = TIMEOUT_S) -> None:
    """Check that every alive node with CPUs or GPUs sees each input as the driver does.

    Call after Ray is initialised and before trials or workers start. Free with one node alive.

    Args:
        inputs: [(config field, absolute local path)] (spaces/local_inputs.py).
        timeout_s: how long to wait for all nodes; one that has not answered is named on stderr.
    Raises:
        NodePathError: one line per node and input that is missing or differs there.
    """
    alive = [n for n in ray.nodes() if n.get("Alive")]
    if len(alive) <= 1 or not inputs:
        return
    nodes = worker_nodes()
    key = (tuple(inputs), tuple(sorted(n["NodeID"] for n in nodes)))
    if key in _CHECKED:
        return
    paths = [p for _, p in inputs]
    here = {p: describe(p) for p in paths}
    labels = {n["NodeID"]: f"{n.get('NodeManagerAddress', '?')} ({n['NodeID'][:8]})" for n in nodes}  # fmt: skip
    refs = {
        _describe_all.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(paths): n["NodeID"]
        for n in nodes
    }
    done, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    for ref in late:
        ray.cancel(ref, force=True)
        print(f"layerswap: warning: node {labels[refs[ref]]} did not answer the path check within {timeout_s:g} s; its paths are unchecked", file=sys.stderr)  # fmt: skip
    seen = {}
    for ref in done:
        try:
            seen[labels[refs[ref]]] = ray.get(ref)
        except Exception as e:  # the node died meanwhile, or cannot import layerswap
            late.append(ref)
            print(f"layerswap: warning: node {labels[refs[ref]]} could not run the path check ({type(e).__name__}); its paths are unchecked", file=sys.stderr)  # fmt: skip
    if problems := path_problems(inputs, here, seen):
        raise NodePathError("\n  ".join(problems))
    if not late:
        _CHECKED.add(key)


def start_checked(inputs: list[tuple[str, str]], *, verbose: bool = False, **kwargs) -> None:
    """`init_ray(verbose=verbose, **kwargs)` unless Ray is initialised, then `check_node_paths`:
    what a driver runs before it writes anything or starts a trial or training worker.

    Raises:
        NodePathError: as check_node_paths.
    """
    if not ray.is_initialized():
        init_ray(verbose=verbose, **kwargs)
    check_node_paths(inputs)


def run_lock(out: str | os.PathLike) -> tuple[str, str]:
    """The input pair that stands for an output folder in RUN that workers write or read:
    the lock file this command holds for it (trainables/locks.py), compared by content. While
    no command holds it (a direct library call), the driver sees it missing and it is skipped.

    Args:
        out: the output folder (e.g. RUN/train/<name>).
    """
    return (RUN_FIELD, str(lock_path(Path(out).absolute())))


def described(inputs: list[tuple[str, str]]) -> list[list]:
    """The driver's descriptions of `inputs`, to pass in a trial's or worker's config (plain
    JSON data); paths missing here are left out (the driver-side checks speak for them).

    Returns:
        [[field, path, describe(path)]].
    """
    out = [[field, path, describe(path)] for field, path in inputs]
    return [row for row in out if row[2]["kind"] != "missing"]


def node_label() -> str:
    """This process's node as the problems name it: "IP (node id[:8])" (host name outside Ray)."""
    if ray.is_initialized():
        ctx = ray.get_runtime_context()
        return f"{ray.util.get_node_ip_address()} ({ctx.get_node_id()[:8]})"
    return socket.gethostname()


def check_here(driver: list[list] | None) -> None:
    """In a trial or training worker, before it loads anything: check that this node sees each
    input as the driver described it (`described`). Cheap: names and sizes; once per process.

    Args:
        driver: `described(inputs)` from the driver (None or empty: nothing to check).
    Raises:
        NodePathError: one line per input that is missing or differs here, naming this node.
    """
    if not driver:
        return
    key = hash(json.dumps(driver, sort_keys=True))
    if key in _HERE_OK:
        return
    here = {path: d for _, path, d in driver}
    seen = {path: describe(path) for path in here}
    inputs = [(field, path) for field, path, _ in driver]
    if problems := path_problems(inputs, here, {node_label(): seen}):
        raise NodePathError("\n  ".join(problems))
    _HERE_OK.add(key)
