"""fit()'s signal guard (trainables/train/ray_fit.py), without a Ray run: SIGTERM leaves as
SystemExit(SIGTERM) through the caller's handler, SIGINT as KeyboardInterrupt, handlers set inside
(as Ray Train's fit() sets its SIGINT one) are kept out, and the caller's are back afterwards.
Each case runs in a fresh Python process: the signals are real, and a handler another test left
in the pytest process (Ray Train's fit() leaves its own) cannot answer them.
The whole path through a real fit() is tests/cli/test_interrupts.py.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_ray_fit.py
"""

from __future__ import annotations

import subprocess
import sys

_PRELUDE = """
import os, signal, time
from layerswap.trainables.train.ray_fit import _fit_signals

heard, ray_trains = [], []
signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))  # the CLI's, recording
before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

def wait_for_signal():
    time.sleep(5)  # the handler raises long before
    raise SystemExit("no signal arrived")
"""

_SIGTERM = """
try:
    with _fit_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for_signal()
except SystemExit as e:
    print("exit", e.code)
print("heard", heard)
print("restored", signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM])
"""

_SIGINT = """
try:
    with _fit_signals():
        signal.signal(signal.SIGINT, lambda *a: ray_trains.append(a))  # as fit() does
        os.kill(os.getpid(), signal.SIGINT)
        wait_for_signal()
except KeyboardInterrupt:
    print("KeyboardInterrupt")
print("ray_trains", ray_trains, "heard", heard)
print("restored", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


def _run(case: str) -> list[str]:
    p = subprocess.run([sys.executable, "-c", _PRELUDE + case], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def test_sigterm_leaves_as_systemexit_and_the_caller_hears_of_it():
    assert _run(_SIGTERM) == [f"exit {15}", "heard [15]", "restored True"]


def test_a_handler_set_inside_is_kept_out_and_sigint_interrupts():
    assert _run(_SIGINT) == ["KeyboardInterrupt", "ray_trains [] heard []", "restored True"]
