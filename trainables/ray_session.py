"""Start or join Ray from a driver without losing the driver's own SIGTERM handling.

Every layerswap driver (demo, search, sweep, `train` on Ray) calls `init_ray(...)` where it
would call `ray.init(...)`; tests: tests/trainables/test_ray_session.py, and the process-group
SIGTERM test in tests/cli/test_interrupts.py.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import ray


def init_ray(**kwargs) -> None:
    """`ray.init(**kwargs)`, then the caller's Python SIGTERM handler again, made to pass `ray.get`
    (a default or ignored SIGTERM is left to Ray's handler).

    `ray.init` replaces the driver's SIGTERM handler with `sys.exit(SIGTERM)`, and its core
    worker puts a C++ handler in front that dumps a stack and arms `alarm(3)` to abort. A
    driver blocked in `ray.get` passes only KeyboardInterrupt out of a signal handler (any other
    exception ends the process with exit 1). When a scheduler or `timeout` sends SIGTERM to the
    whole process group, Ray's own processes die too, `ray.shutdown` waits ~5 s on the dead
    GCS, the alarm fires, and the driver aborted with exit 134 and a stack dump (measured with
    the tiny demo under `timeout`). With the caller's handler back (as a Python handler, which
    also takes the signal from the C++ one), the CLI's handler records SIGTERM and the command
    exits 143 after Ray has shut down.

    Args:
        kwargs: passed to `ray.init`.
    """
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    ray.init(**kwargs)
    if callable(before):
        signal.signal(signal.SIGTERM, through_ray_get(before))


def through_ray_get(handler: Callable) -> Callable:
    """`handler`, with whatever it raises other than KeyboardInterrupt raised as one.

    The caller decides what the signal means (the CLI records it and exits 143); the exception
    only has to reach the caller's `finally` blocks, and out of `ray.get` only KeyboardInterrupt
    does.
    """
    if getattr(handler, "passes_ray_get", False):
        return handler

    def on_sigterm(signum, frame):
        try:
            handler(signum, frame)
        except KeyboardInterrupt:
            raise
        except BaseException:
            raise KeyboardInterrupt from None

    on_sigterm.passes_ray_get = True
    return on_sigterm
