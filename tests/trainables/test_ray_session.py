"""trainables/ray_session.py: the caller's SIGTERM handler survives ray.init and gets out of ray.get;
Ray's local processes run in a session of their own.

Run: .venv/bin/python -m pytest tests/trainables/test_ray_session.py
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import ray

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


def test_ray_still_starts_its_processes_through_consolepopen():
    """_own_session swaps `ray._private.services.ConsolePopen`; if Ray renames it or stops
    looking it up at each start, the swap would silently do nothing: say so here."""
    from ray._private import services

    assert issubclass(services.ConsolePopen, subprocess.Popen)
    assert "ConsolePopen(" in inspect.getsource(services.start_ray_process)
    assert ray.__version__ == "2.60.0", "re-check _own_session against this Ray, then re-pin"


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
    # Ray's processes (found by their temp dir in /proc) are outside this process's session.
    ours = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()
            and sys.argv[1].encode() in open(f"/proc/{p}/cmdline", "rb").read()]
    print("Ray's processes:", len(ours), "in our session:",
          sum(os.getsid(p) == os.getsid(0) for p in ours), flush=True)

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
    line = next((x for x in out.splitlines() if x.startswith("Ray's processes:")), "")
    assert line.endswith("in our session: 0") and " 0 " not in line, (line, p.stderr[-3000:])
    line = next((x for x in out.splitlines() if x.startswith("KeyboardInterrupt after")), None)
    assert line is not None, (out, p.stderr[-3000:])
    took = float(line.split()[2])
    assert took < 30 and line.endswith("heard [15]"), line
    assert "SIGTERM received" not in p.stderr, p.stderr[-3000:]  # Ray's C++ dump kept out
