"""trainables/ray_session.py: the caller's SIGTERM handler survives ray.init and gets out of ray.get.

Run: .venv/bin/python -m pytest tests/trainables/test_ray_session.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from layerswap.trainables.ray_session import through_ray_get

ROOT = Path(__file__).resolve().parents[2]


class Stop(BaseException):
    """What a caller's handler may raise (the CLI raises its own Terminated)."""


def test_through_ray_get_raises_keyboardinterrupt_for_anything_else():
    heard = []

    def handler(signum, frame):
        heard.append(signum)
        raise Stop

    wrapped = through_ray_get(handler)
    with pytest.raises(KeyboardInterrupt):
        wrapped(15, None)
    assert heard == [15]
    assert through_ray_get(wrapped) is wrapped  # wrapped once, however often Ray is started

    def interrupt(signum, frame):
        raise KeyboardInterrupt("kept")

    with pytest.raises(KeyboardInterrupt, match="kept"):
        through_ray_get(interrupt)(15, None)
    quiet = through_ray_get(lambda s, f: heard.append(s))
    assert quiet(15, None) is None and heard == [15, 15]


# A real driver: Ray replaces the handler (the adapter's reason to exist: if Ray stops doing so,
# this says it), init_ray puts the caller's back, and a SIGTERM during a blocking ray.get reaches
# the caller as KeyboardInterrupt after its handler ran.
DRIVER = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import ray
    from layerswap.trainables.ray_session import init_ray

    heard = []
    class Stop(BaseException):
        pass
    def mine(signum, frame):
        heard.append(signum)
        raise Stop

    kw = dict(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=sys.argv[1])
    signal.signal(signal.SIGTERM, mine)
    ray.init(**kw)
    print("ray.init replaced it:", signal.getsignal(signal.SIGTERM) is not mine, flush=True)
    ray.shutdown()

    signal.signal(signal.SIGTERM, mine)
    init_ray(**kw)

    @ray.remote
    def slow():
        time.sleep(60)

    ref = slow.remote()
    threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    try:
        ray.get(ref)
        print("ray.get returned", flush=True)
    except KeyboardInterrupt:
        print(f"KeyboardInterrupt after {time.monotonic() - t0:.1f} s, heard {heard}", flush=True)
    ray.shutdown()
    """
)


@pytest.mark.slow
def test_init_ray_keeps_the_callers_handler_and_sigterm_leaves_ray_get():
    tmp = tempfile.mkdtemp(prefix="lss", dir="/tmp")  # Ray's socket paths are length-limited
    p = subprocess.run(
        [sys.executable, "-c", DRIVER, tmp], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    out = p.stdout
    assert "ray.init replaced it: True" in out, (out, p.stderr[-3000:])
    line = next((x for x in out.splitlines() if x.startswith("KeyboardInterrupt after")), None)
    assert line is not None, (out, p.stderr[-3000:])
    took = float(line.split()[2])
    assert took < 30 and line.endswith("heard [15]"), line
    assert "SIGTERM received" not in p.stderr, p.stderr[-3000:]  # Ray's C++ dump kept out
