"""`trainer.fit()` under a driver's SIGINT and SIGTERM: Ray Train's own handling hides an interrupt.

`fit_interruptibly(trainer)` is what trainables/train/ray_train.train_with_ray calls; the CLI's
handlers (cli/__init__.py) decide the exit code. Tests: tests/cli/test_interrupts.py,
tests/trainables/train/test_ray_fit.py.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import ray
import ray.train.torch

from layerswap.trainables.ray_session import through_ray_get


@contextmanager
def _fit_signals() -> Iterator[None]:
    """SIGINT and SIGTERM as a fit() in the main thread needs them to stop it.

    fit() replaces the SIGINT handler with one that aborts the run and then returns from fit()
    as if it had ended (the caller could not tell an interrupted run from a finished one): it
    is kept out. fit() waits in a blocking ray.get, which passes a KeyboardInterrupt raised by
    a signal handler on but turns any other exception into exit code 1 (SystemExit, which
    Ray's driver SIGTERM handler raises) or drops it: while fit() runs, SIGTERM also raises
    KeyboardInterrupt, and leaves as SystemExit(SIGTERM), what Ray's own handler raises (the
    command exits 143). Python's handler also takes SIGTERM from Ray's C++ failure-signal
    handler, which would dump a stack and arm alarm(3) to abort the process (SIGABRT).
    (A fit() in a helper thread also avoids Ray's SIGINT handler, but that thread is still
    inside ray.get when Ray shuts down at exit, and Ray then ends the process with exit 1.)
    """
    real = signal.signal
    terminated = []
    before = signal.getsignal(signal.SIGTERM)
    # The caller's handler still hears of it (the CLI's records it and decides the exit code).
    caller = through_ray_get(before) if callable(before) else None

    def on_sigterm(signum, frame):
        terminated.append(signum)
        if caller is not None:
            caller(signum, frame)  # raises KeyboardInterrupt for whatever the caller's raises
        raise KeyboardInterrupt

    def keep(signum, handler):
        if signum in (signal.SIGINT, signal.SIGTERM):
            return signal.getsignal(signum)
        return real(signum, handler)

    real(signal.SIGTERM, on_sigterm)
    signal.signal = keep
    try:
        yield
    except KeyboardInterrupt:
        if terminated:
            signal.alarm(0)  # should Ray's C++ handler have seen it first (see above)
            raise SystemExit(signal.SIGTERM) from None
        raise
    finally:
        signal.signal = real
        real(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def fit_interruptibly(trainer: ray.train.torch.TorchTrainer):
    """`trainer.fit()`; in a driver's main thread SIGINT stops it with KeyboardInterrupt and
    SIGTERM with SystemExit(SIGTERM). Elsewhere (a Ray task, a Tune trial) it runs as it is."""
    in_ray_worker = ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    if in_ray_worker or threading.current_thread() is not threading.main_thread():
        return trainer.fit()
    with _fit_signals():
        return trainer.fit()
