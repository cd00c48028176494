"""Ctrl-C from the first instant: SIGINT/SIGTERM while a `layerswap` process starts up.

The command's own handler (cli.main: KeyboardInterrupt, so every `finally` and atomic writer
cleans up) exists only once the command line is parsed; before it, Python's default turned
SIGINT into a traceback out of whichever import was running and SIGTERM killed the process
without a word. This module is the CLI package's first import and calls `install`
when the process is the command, before any heavy import; until the command starts a signal ends the process at once: one line, exit 130 (143 for
SIGTERM). Nothing has been written before the command starts, so there is nothing to clean up.

Why end the process from the handler (`os._exit`) rather than raise: a Python handler runs
between bytecodes of the main thread, and during an extension's import that may be Python code
called from C++ (torch's bindings). A KeyboardInterrupt raised there unwinds through C++
frames, and where one of them cannot pass an exception on, C++ calls `terminate`: the reported
exit 134 (1 in 30 early Ctrl-Cs of a merge). `os._exit` raises nothing and unwinds nothing. The
alternatives were weighed: blocking the signals (pthread_sigmask) holds only in the threads
that block them, and a handler that merely records the signal would make Ctrl-C wait for the
whole import. `preload_torch` imports torch while this handler is still in place, so torch's
C++ initialisation never sees the command's raising handler; the command's later imports are
pure Python or extensions that report an interrupt as an exception (the CLI's outcome then
follows the signal).

Before the first line of layerswap's code runs, the interpreter itself starts (its site module,
runpy): ~0.05-0.1 s in which no program's code can act. Tested in tests/cli/test_bad_input_checks.py
and tests/cli/test_early_interrupts.py.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading

# The exit status of each signal (128 + its number, as a shell reports a process it killed);
# the CLI's outcome and the watchdog read this one table.
EXIT = {signal.SIGINT: ("SIGINT", 130), signal.SIGTERM: ("SIGTERM", 143)}


def _while_starting(signum, frame) -> None:
    name, code = EXIT[signum]
    try:  # os.write: no Python-level lock that the interrupted code may hold
        os.write(2, f"layerswap: interrupted ({name}) while starting; nothing was written\n".encode())  # fmt: skip
    except OSError:  # stderr gone with the rest of a pipeline
        pass
    os._exit(code)


def is_the_command() -> bool:
    """Whether this process is the `layerswap` command: the console script, or `python -m
    layerswap.cli` (read from the interpreter's own argv: runpy sets sys.argv[0] only after
    importing the package). Elsewhere (a test calling cli.main, a notebook) the signal handling
    stays the caller's."""
    if os.path.basename(sys.argv[0]) == "layerswap":
        return True
    modules = ("layerswap.cli", "layerswap.cli.__main__")
    return any(a == "-m" and b in modules for a, b in itertools.pairwise(sys.orig_argv))


def install() -> None:
    """SIGINT/SIGTERM end the process at once, with one line (main thread only; idempotent)."""
    if threading.current_thread() is threading.main_thread():
        for s in EXIT:
            signal.signal(s, _while_starting)


# On import, before the rest of this module: cli/__init__.py imports it before anything else,
# and it imports no project module itself.
if is_the_command():
    install()


def is_startup(handler: object) -> bool:
    """Whether `handler` is the start-up handler."""
    return handler is _while_starting


def starting() -> bool:
    """Whether the start-up handler is the one in place."""
    return is_startup(signal.getsignal(signal.SIGINT))


def preload_torch() -> None:
    """Import torch now, under the start-up handler (see the module docstring for why)."""
    # lazy: only a command that uses torch pays for it; --help and schema stay fast
    import torch  # noqa: F401
