"""cli/watchdog.py: a signalled process whose main thread does not finish is ended on a deadline.

Each case is a real process sent a real signal; its main thread "blocks" in a sleep that the
signal handler cannot end (PEP 475 resumes it). Run: .venv/bin/python -m pytest tests/cli/test_watchdog.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from layerswap.cli.watchdog import Watchdog
    signal.signal(signal.SIGINT, lambda *a: None)   # handled, and the command runs on
    signal.signal(signal.SIGTERM, lambda *a: None)
    dog = Watchdog(deadline_s=float(sys.argv[1]))
    if sys.argv[3] == "closed":
        dog.close()
        assert signal.set_wakeup_fd(-1) == -1, "the wakeup fd was not given back"
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    time.sleep(float(sys.argv[4]))  # the main thread still busy
    print("finished", flush=True)
    """
)


def _run(deadline: float, sig: str, state: str, busy: float) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(deadline), sig, state, str(busy)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


@pytest.mark.parametrize("sig,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_process_still_busy_at_the_deadline_exits_with_the_signals_code(sig, code):
    rc, out, err, took = _run(1.0, sig, "open", 30)
    assert rc == code, err
    assert "finished" not in out
    assert f"layerswap: interrupted ({sig}); still running 1 s later" in err
    assert took < 15, f"took {took:.1f} s for a 1 s deadline"


def test_a_process_that_finishes_before_the_deadline_is_left_alone():
    rc, out, err, _ = _run(5.0, "SIGTERM", "open", 0.3)
    assert (rc, out, err) == (0, "finished\n", "")


def test_a_closed_watchdog_ends_nothing_and_gives_the_wakeup_fd_back():
    rc, out, err, _ = _run(0.2, "SIGTERM", "closed", 1.5)
    assert (rc, out, err) == (0, "finished\n", "")


def test_a_forked_childs_sigterm_is_not_taken_for_the_commands():
    """A forked child (multiprocessing's fork pool in lm-eval's bootstrap SIGTERMs its workers on
    exit) inherits the wakeup fd; the command must not be ended for the child's signal."""
    script = textwrap.dedent(
        """
        import multiprocessing as mp, os, signal, sys, time
        from layerswap.cli.watchdog import Watchdog
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # a Python handler, as the CLI's
        Watchdog(deadline_s=0.5)
        child = mp.get_context("fork").Process(target=time.sleep, args=(30,))
        child.start()
        time.sleep(0.5)  # the child is in its sleep, its handler installed
        os.kill(child.pid, signal.SIGTERM)
        child.join(timeout=20)
        assert child.exitcode == 143, child.exitcode
        time.sleep(2)
        print("finished", flush=True)
        """
    )
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (p.returncode, p.stdout) == (0, "finished\n"), p.stderr


def test_the_deadline_holds_when_stderr_is_gone():
    """Ctrl-C on `layerswap ... | tee log` ends tee too: the message cannot be written."""
    r, w = os.pipe()
    os.close(r)  # a reader that is gone: writes fail with EPIPE
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, "1", "SIGTERM", "open", "30"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=w, text=True, timeout=60,
    )  # fmt: skip
    os.close(w)
    assert p.returncode == 143 and time.monotonic() - t0 < 15, p.stdout
