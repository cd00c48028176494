"""Ends a signalled command that cannot finish cleaning up: a deadline after SIGINT/SIGTERM.

A main thread blocked in C cannot run its signal handler or its `finally` blocks: measured, when
Ray's processes still shared the command's process group, a SIGTERM sent to the whole group
(`timeout`, a scheduler) mid-search also stopped Ray's GCS, and the driver's main thread then sat
in Ray's GCS client (`_internal_kv_get`, then `list_named_actors` in the search's cleanup, each
retrying for 60 s). They now run in sessions of their own (trainables/ray_session.py), but a
GCS or raylet can still die under a driver (the OOM killer, a lost node). Python's C-level
handler still writes the signal number to the wakeup fd, so a thread hears of it at once; if the
command is still running `DEADLINE_S` later, it ends with the signal's exit code. Opened by the
console script (`cli.run`) for the whole process; tested in tests/cli/test_watchdog.py.
"""

from __future__ import annotations

import os
import signal
import threading

from layerswap.cli import continue_hint
from layerswap.cli.startup import EXIT

# How long a signalled command may take to clean up. Measured: under 10 s (a search's Ray shut
# down after a process-group SIGTERM: ~3 s); the call that needed the watchdog blocks for 60 s.
DEADLINE_S = 25.0


class Watchdog:
    """While open: a thread that ends the process `deadline_s` after a SIGINT/SIGTERM.

    Open it in the main thread (the wakeup fd is the main thread's). `close` stops it; the
    console script never does, so the deadline also covers the interpreter's exit (call
    `command_ended` once the command's outcome is decided). Something that sets its own wakeup
    fd later (an asyncio loop's signal handlers in the main thread; none in layerswap's drivers)
    takes the signals away from it until it gives the fd back.

    Args:
        deadline_s: how long after the first signal the command may run on.
    """

    def __init__(self, deadline_s: float = DEADLINE_S):
        self.deadline_s = deadline_s
        self._closed = threading.Event()
        self._ended = threading.Event()
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)  # the C handler must never block on a full pipe
        self._previous = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        # A forked child (multiprocessing's fork pool in lm-eval's bootstrap, datasets.map)
        # inherits the wakeup fd: its SIGTERM would land in this pipe as if it were ours.
        os.register_at_fork(after_in_child=self._forget_in_child)
        self._thread = threading.Thread(target=self._watch, name="layerswap-watchdog", daemon=True)
        self._thread.start()

    def command_ended(self) -> None:
        """The command's outcome is decided and said; what remains is the interpreter's exit."""
        self._ended.set()

    def close(self) -> None:
        """Stop watching and give the wakeup fd back (main thread)."""
        if self._closed.is_set():
            return
        self._closed.set()
        signal.set_wakeup_fd(self._previous)
        os.close(self._w)  # the thread's read returns b"" and it ends, closing its end
        self._thread.join(timeout=5)

    def _forget_in_child(self) -> None:
        if self._closed.is_set():  # the fds are closed, their numbers may be someone else's
            return
        self._closed.set()
        try:
            current = signal.set_wakeup_fd(-1)
            if current != self._w:  # not ours after all: put it back
                signal.set_wakeup_fd(current)
        except ValueError:  # not the main thread
            pass
        for fd in (self._r, self._w):
            os.close(fd)

    def _watch(self) -> None:
        try:
            sig = self._next_signal()
            if sig is None or self._closed.wait(self.deadline_s):
                return
        finally:
            os.close(self._r)  # this thread's end (the thread does not exist in a forked child)
        name, code = EXIT[sig]
        if self._ended.is_set():
            said = f"still exiting {self.deadline_s:g} s after {name} (Ray's shutdown): ended"
        else:
            said = (
                f"interrupted ({name}); still running {self.deadline_s:g} s later (blocked in a "
                "call that does not return, e.g. Ray's GCS client after the GCS stopped): ended "
                f"without cleaning up; hidden .NAME.tmp-* folders may be left{continue_hint.hint()}"
            )
        try:  # os.write: sys.stderr's lock may be held by the blocked main thread
            os.write(2, f"layerswap: {said}\n".encode())
        except OSError:  # stderr gone with the rest of a pipeline
            pass
        finally:
            os._exit(code)

    def _next_signal(self) -> int | None:
        """The first SIGINT/SIGTERM written to the wakeup fd; None once closed."""
        while True:
            try:
                data = os.read(self._r, 64)
            except OSError:
                return None
            if not data or self._closed.is_set():
                return None
            for byte in data:
                if byte in EXIT:
                    return byte
