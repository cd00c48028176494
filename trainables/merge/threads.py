"""A few worker threads over a list of independent tasks, safe to interrupt (SIGINT/SIGTERM).

The merge engine writes tensors in parallel with `run_in_threads`. It is not a
`concurrent.futures` pool because an interrupt there can hang the process: `as_completed`
acquires every future's lock one by one, and a KeyboardInterrupt raised halfway leaves the rest
held, so a worker finishing its task blocks forever and so does the pool's shutdown (seen as a
`layerswap merge` that ignored Ctrl-C). Here the calling thread holds no lock a worker needs: it
starts the workers with signals blocked, then only waits for them, and whatever interrupts it,
every worker is done before `run_in_threads` returns or raises.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")
_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def run_in_threads(items: Iterable[T], fn: Callable[[T], None], workers: int, name: str) -> None:
    """Call `fn(item)` for every item, on `workers` threads, in the order given.

    The first exception of a worker, or an interrupt of the calling thread, stops the rest after
    the item each worker is on; the exception is re-raised once every worker has returned.

    Args:
        items: the tasks (taken in order, so put the largest first).
        fn: what to do with one item; called from the worker threads.
        workers: threads (at least 1).
        name: thread-name prefix (shows in py-spy and faulthandler dumps).
    Raises:
        The first worker error, or what interrupted the caller (KeyboardInterrupt, ...).
    """
    todo = iter(items)
    take = threading.Lock()  # only workers take it: an interrupt of the caller cannot leave it held
    stop = threading.Event()
    errors: list[BaseException] = []
    live: set[int] = set()  # workers not yet past their last line

    def work(i: int) -> None:
        try:
            while not stop.is_set():
                with take:
                    item = next(todo, _END)
                if item is _END:
                    return
                try:
                    fn(item)
                except BaseException as e:  # the caller re-raises it
                    errors.append(e)
                    stop.set()
        finally:
            live.discard(i)

    try:
        with signals_blocked():  # workers inherit the mask: signals reach the caller only
            for i in range(max(1, workers)):
                live.add(i)
                try:
                    threading.Thread(target=work, args=(i,), name=f"{name}-{i}").start()
                except BaseException:
                    live.discard(i)
                    raise
        while live:
            time.sleep(_POLL_S)  # interruptible, and leaves no lock or state behind
    finally:
        stop.set()
        _wait_for(live)
    if errors:
        raise errors[0]


_END = object()
_POLL_S = 0.005  # the caller's latency once the last worker is done


@contextmanager
def signals_blocked():
    """Hold SIGINT/SIGTERM pending (delivered on exit) where the platform allows it."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _wait_for(live: set[int]) -> None:
    """Wait until no worker is left, even if a second signal arrives meanwhile (re-raised after).

    A worker outliving the call would go on writing to files the caller is about to close.
    Polling, not Thread.join: an interrupt at the wrong bytecode of CPython 3.11's join can
    mark a running thread as stopped (seen in this file's test), and join then returns early.
    """
    pending: BaseException | None = None
    while live:
        try:
            time.sleep(_POLL_S)
        except BaseException as e:  # a second Ctrl-C: keep waiting, raise it at the end
            pending = pending or e
    if pending is not None:
        raise pending
