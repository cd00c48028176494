"""fit()'s signal guard (trainables/train/ray_fit.py), without a Ray run: SIGTERM leaves as
SystemExit(SIGTERM) through the caller's handler, SIGINT as KeyboardInterrupt, handlers set inside
(as Ray Train's fit() sets its SIGINT one) are kept out, and the caller's are back afterwards.
The whole path through a real fit() is tests/cli/test_interrupts.py.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_ray_fit.py
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from layerswap.trainables.train.ray_fit import _fit_signals


@pytest.fixture
def callers_handlers():
    """The CLI's SIGTERM handler as a stand-in that records; both handlers restored after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    heard = []
    signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
    yield heard
    for s, h in saved.items():
        signal.signal(s, h)


def _wait_for_signal():
    time.sleep(5)  # the handler raises long before
    pytest.fail("no signal arrived")


def test_sigterm_leaves_as_systemexit_and_the_caller_hears_of_it(callers_handlers):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e, _fit_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for_signal()
    assert e.value.code == signal.SIGTERM
    assert callers_handlers == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_handler_set_inside_is_kept_out_and_sigint_interrupts(callers_handlers):
    ray_trains = []
    with pytest.raises(KeyboardInterrupt), _fit_signals():
        signal.signal(signal.SIGINT, lambda *a: ray_trains.append(a))  # as fit() does
        os.kill(os.getpid(), signal.SIGINT)
        _wait_for_signal()
    assert ray_trains == [] and callers_handlers == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
