"""run_in_threads and the merge engine under an interrupt at every point the caller can take one.

A real Ctrl-C lands between two bytecodes of the calling thread, anywhere it is not blocking
signals. These tests raise KeyboardInterrupt from a trace function at the k-th traced line of
the caller, for every k (signals blocked: skipped, as the kernel would), and check from outside
that the call raises within seconds, every worker thread is gone and no shard file is held
open. `concurrent.futures.as_completed` failed this (a worker blocked forever on a future lock
the interrupted caller still held). Run: pytest -q tests/trainables/merge/test_threads.py
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from layerswap.trainables.merge.threads import run_in_threads

BOUND_S = 20  # the call must be over this long after the interrupt (it takes ~0.1 s)


def _blocked() -> bool:
    return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def _inside(frame, function: str | None) -> bool:
    while frame is not None:
        if function is None or frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def _interrupt_at(
    k: int, call, files: tuple[str, ...], within: str | None = None
) -> tuple[type | None, int, str]:
    """Run `call()` on a fresh thread that gets KeyboardInterrupt at its k-th traced line.

    Only lines in files whose path ends with one of `files`, and (if given) while a function
    named `within` runs, count. Returns (the type of what the call raised or None, lines
    counted, where the interrupt landed); fails if the call is not over within BOUND_S. The
    exception itself is dropped, as a command's top level does: its traceback would keep the
    interrupted frames and what they hold alive.
    """
    seen = 0
    where = ""
    outcome: list[type | None] = []

    def tracer(frame, event, arg):
        nonlocal seen, where
        if (
            event == "line"
            and frame.f_code.co_filename.endswith(files)
            and not _blocked()
            and _inside(frame, within)
        ):
            seen += 1
            if seen == k:
                code = frame.f_code
                where = f"{Path(code.co_filename).name}:{frame.f_lineno} in {code.co_name}"
                raise KeyboardInterrupt
        return tracer

    def body():
        sys.settrace(tracer)
        try:
            call()
            outcome.append(None)
        except BaseException as e:
            outcome.append(type(e))
        finally:
            sys.settrace(None)

    runner = threading.Thread(target=body, daemon=True)
    runner.start()
    runner.join(BOUND_S)
    assert not runner.is_alive(), f"interrupt at {where}: still running {BOUND_S} s on"
    return outcome[0], seen, where


def _workers(prefix: str, grace_s: float = 2.0) -> list[str]:
    """Threads named `prefix`* still alive `grace_s` on (past their work, a thread takes a few
    more bytecodes to end)."""
    end = time.monotonic() + grace_s
    while True:
        alive = [t.name for t in threading.enumerate() if t.name.startswith(prefix)]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.01)


def _open_under(folder: Path) -> list[str]:
    """Files under `folder` this process holds open (read from /proc, not from the code)."""
    fd_dir = Path("/proc/self/fd")
    held = []
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue
        if target.startswith(str(folder)):
            held.append(target)
    return held


def test_every_item_once_and_worker_errors_raised():
    done: list[int] = []
    run_in_threads(range(50), done.append, workers=3, name="t-once")
    assert sorted(done) == list(range(50))

    started: list[int] = []

    def fail_at_3(i: int) -> None:
        started.append(i)
        if i == 3:
            raise ValueError("item 3 is bad")
        time.sleep(0.01)

    with pytest.raises(ValueError, match="item 3 is bad"):
        run_in_threads(range(1000), fail_at_3, workers=2, name="t-fail")
    assert len(started) < 20  # the others stopped soon after
    assert not _workers("t-fail")


def test_interrupt_anywhere_in_run_in_threads_stops_every_worker():
    files = ("trainables/merge/threads.py", "threading.py")
    finished: list[int] = []
    busy: list[int] = []  # items being worked on right now

    def item(i: int) -> None:
        busy.append(i)
        time.sleep(0.002)
        finished.append(i)
        busy.remove(i)

    k = 0
    while True:
        k += 1
        finished.clear()
        got, seen, at = _interrupt_at(k, lambda: run_in_threads(range(40), item, 2, "t-int"), files)
        assert not busy, f"items still running after an interrupt at {at}: {busy}"
        n = len(finished)
        time.sleep(0.01)
        assert len(finished) == n, f"work went on after an interrupt at {at}"
        assert not _workers("t-int"), f"workers alive after an interrupt at {at}"
        if seen < k:  # the call ran to the end before line k: every point was covered
            assert got is None and sorted(finished) == list(range(40))
            break
        assert got is KeyboardInterrupt, (at, got)
    assert k > 20  # the trace did cover the caller's lines


# Open files are read from Linux's /proc (CI and the clusters this targets are Linux).
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads open files from /proc")
def test_interrupt_anywhere_in_write_assembly_leaves_no_thread_or_open_file(tmp_path):
    from layerswap.spaces.recipe import parse_recipe
    from layerswap.trainables.merge.assembly import recipe_refs
    from layerswap.trainables.merge.engine import assembly_for, open_checkpoints, write_assembly
    from layerswap.world.tiny import make_tiny_family

    # Two layers (20 tensors): every line of write_assembly is ~1000 interrupt points already.
    fam = make_tiny_family(tmp_path / "fam", num_layers=2, with_tokenizer=False)
    models = [str(fam["task"]), str(fam["language"])]
    recipe = parse_recipe({"method": "ties", "base": str(fam["base"]), "models": models})
    ckpts = open_checkpoints(recipe_refs(recipe))
    assembly, _ = assembly_for(recipe, ckpts)
    # The engine's writer and the thread machinery: where an interrupt meets running workers.
    files = ("merge/engine.py", "merge/checkpoint.py", "merge/threads.py", "threading.py")
    k = 0
    runs = tmp_path / "runs"
    try:
        while True:
            k += 1
            out = runs / f"out{k}"
            out.mkdir(parents=True)

            def call(out=out):
                write_assembly(assembly, ckpts, out, max_shard_bytes=2**15)  # several shards

            got, seen, at = _interrupt_at(k, call, files, within="write_assembly")
            assert not _workers("layerswap-merge"), (
                f"merge threads alive after an interrupt at {at}"
            )
            assert not _open_under(runs), f"files still open after an interrupt at {at}"
            if seen < k:
                assert got is None and len(list(out.glob("*.safetensors"))) > 1
                break
            assert got is KeyboardInterrupt, (at, got)
    finally:
        for ck in ckpts.values():
            ck.close()
    assert k > 100
