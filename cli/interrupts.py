"""How a running command receives SIGINT and SIGTERM: as exceptions raised in its main thread
(KeyboardInterrupt, `Terminated`), so every `finally` and atomic writer cleans up on the way out,
and, where Python drops that exception, as the same signal sent again until the command sees it.

Python cannot propagate an exception raised in a weakref callback or `__del__`: it reports it to
`sys.unraisablehook` and carries on. A signal landing there (seen: SQLAlchemy's class registry,
collected between two search trials) would leave the command running to its end (a Ctrl-C
mid-search ran every remaining trial). `unraisable_hook` keeps quiet about it and sends the
signal again to the main thread, from a timer thread (raised inside the hook it would be
dropped again) and as a real signal (`signal.pthread_kill`), so a main thread blocked in a
sleep, a lock or a child process wakes up as it does for the user's own Ctrl-C.

A re-sent signal is raised only while the command's function runs (`ended()` stops it, before
main decides the outcome) and only while every signal so far was swallowed: one that propagated
is already unwinding the command, and a second exception would cut its cleanup short.
Run its tests: .venv/bin/python -m pytest -q tests/cli/test_root.py
"""

from __future__ import annotations

import signal
import threading

MAX_RESENDS = 5  # a signal swallowed again and again is left to main's check at the end
RESEND_DELAY_S = 0.01  # long enough for the unraisable hook to have returned


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so every `finally` and atomic writer cleans up."""


SIGNALLED: list[int] = []  # signals received while a command ran (the outcome follows them)
_SWALLOWED: list[int] = []  # those whose exception Python dropped
_RUNNING = threading.Event()  # the command's function runs: a re-sent signal still has work
_RESENT = threading.Event()  # the next signal is our own re-send, not the user's
# A re-send decides and sends under it, and `ended()` waits for it. Reentrant: the unraisable hook
# may run in the main thread while it holds the lock (a weakref callback run by the GC there).
_LOCK = threading.RLock()
_TIMERS: list[threading.Timer] = []


def begin() -> None:
    """A command starts: no signal received yet, re-sends allowed."""
    with _LOCK:
        SIGNALLED.clear()
        _SWALLOWED.clear()
        _RESENT.clear()
        _RUNNING.set()


def ended() -> None:
    """The command's function returned or raised: nothing is re-sent any more.

    `_RUNNING` is cleared before the lock is taken, so a re-send deciding now either sees it
    cleared or has sent already; its signal then reaches `on_signal` with the command over, and
    is dropped there (no lock is taken in a signal handler: the main thread may hold it).
    """
    _RUNNING.clear()
    with _LOCK:
        for t in _TIMERS:
            t.cancel()
        _TIMERS.clear()


def on_signal(signum, frame):
    """The handler of SIGINT and SIGTERM while a command runs."""
    if _RESENT.is_set():
        _RESENT.clear()
        if not _RUNNING.is_set():
            return  # our re-send, arriving after the command ended: nothing left to stop
    SIGNALLED.append(signum)
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated()


def unraisable_hook(previous):
    """An unraisable hook that drops our own signal exceptions and re-sends their signal; every
    other unraisable goes to `previous` (Python's "Exception ignored in ... Traceback").

    The dropped signal is already in SIGNALLED: it decides the exit code and the one-line
    message whatever the command does next.
    """

    def hook(unraisable):
        if SIGNALLED and isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
            _SWALLOWED.append(SIGNALLED[-1])
            _schedule_resend()
            return
        previous(unraisable)

    return hook


def _schedule_resend() -> None:
    if len(_SWALLOWED) > MAX_RESENDS:
        return
    timer = threading.Timer(RESEND_DELAY_S, _resend, args=(_SWALLOWED[-1],))
    timer.daemon = True  # never holds the exit up
    with _LOCK:
        if not _RUNNING.is_set():
            return
        _TIMERS.append(timer)
    timer.start()


def _resend(signum: int) -> None:
    """Send `signum` to the main thread if the command still runs and no signal propagates."""
    with _LOCK:
        if not _RUNNING.is_set() or len(_SWALLOWED) != len(SIGNALLED):
            return
        _RESENT.set()
        signal.pthread_kill(threading.main_thread().ident, signum)
