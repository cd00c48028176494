"""A `layerswap` command in a process of its own, watched from outside (tests/cli fixtures).

`Cli` starts one and reads its output as it comes; `RayTmp` gives its Ray a temp dir of its own
and finds the processes it left; `leftovers` lists temporary outputs that should be gone. The
fixtures `cli` and `ray_tmp` (tests/cli/conftest.py) build them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ray_pids

# How long a command may take from the signal to its exit. Measured on a loaded 2-core machine:
# well under 10 s everywhere (the interpreter's own teardown with torch loaded is 2-4 s of it).
BOUND_S = 40  # and cli/watchdog.py ends any command 25 s after the signal
MESSAGE = "layerswap: interrupted ({}); nothing half-written was kept"
# What trainables/atomic.py and trainables/outputs.py leave only when something went wrong:
# `.NAME.tmp-PID-XXXXXXXX` (being built, or removed after a failure, by PID),
# `.NAME.old-...` (being replaced), `.NAME.replaced-...`.
LEFTOVER = re.compile(r"^\..+\.(tmp-\d+|old|replaced)-[0-9a-f]{8}$")
# A line Ray forwards from one of its own processes, "(TrainController pid=123) ...": their
# logs are Ray's business (e.g. its state API tracing back when two Ray instances share the
# machine), the command's own stderr is the rest.
RAY_FORWARDED = re.compile(r"^(\x1b\[[0-9;]*m)?\(([\w.:-]+ )?pid=\d+[^)]*\)")
SIGNAL_NAME = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}
EXIT_CODE = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Cli:
    """One `layerswap` command in a process of its own session; stdout/stderr read as they come.

    A session of its own: the signal goes to this process only (never to pytest), and the
    cleanup can reach whatever it started.
    """

    def __init__(self, *args: object, cwd: Path, env: dict[str, str] | None = None):
        self.args = [str(a) for a in args]
        self.started = time.monotonic()
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",  # progress lines arrive when printed, not at exit
            # Tiny models on 2 shared cores: one intra-op thread is many times faster (and a
            # run's steps then take a predictable ~50 ms).
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "layerswap.cli", *self.args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: dict[str, list[str]] = {"out": [], "err": []}
        self._readers = [
            threading.Thread(target=self._read, args=(stream, self.lines[name]), daemon=True)
            for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr))
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.lines["out"])

    @property
    def stderr(self) -> str:
        return "".join(self.lines["err"])

    @property
    def own_stderr(self) -> str:
        """stderr without the lines Ray forwards from its workers and actors."""
        return "".join(line for line in self.lines["err"] if not RAY_FORWARDED.match(line))

    def tail(self) -> str:
        return f"$ layerswap {' '.join(self.args)}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-5000:]}"  # fmt: skip

    def wait_for(self, ready: Callable[[], bool], what: str, timeout: float = 240) -> None:
        """Poll `ready` until it holds; fail if the command ends (or times out) first."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                pytest.fail(f"exited {self.proc.returncode} before {what}\n{self.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} after {timeout} s\n{self.tail()}")
            time.sleep(0.02)

    def interrupt(self, sig: signal.Signals, *, group: bool = False) -> float:
        """Send `sig` to the command (`group`: to its whole process group, as `timeout` and
        schedulers do); check the exit code, stderr (the command's own message, never the
        watchdog's) and timing; return seconds."""
        assert self.proc.poll() is None, f"finished before the signal\n{self.tail()}"
        t0 = time.monotonic()
        (os.killpg if group else os.kill)(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {BOUND_S} s after {sig.name}\n{self.tail()}")
        took = time.monotonic() - t0
        self._join()
        print(
            f"{sig.name} at {t0 - self.started:.1f} s -> exit {self.proc.returncode} in "
            f"{took:.2f} s: layerswap {self.args[0]}"
        )
        assert self.proc.returncode == EXIT_CODE[sig], self.tail()
        assert "Traceback" not in self.own_stderr, self.tail()
        assert MESSAGE.format(SIGNAL_NAME[sig]) in self.stderr, self.tail()
        return took

    def finish(self, timeout: float = 400) -> int:
        """Wait for the command to end by itself; returns its exit code."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running after {timeout} s\n{self.tail()}")
        self._join()
        return self.proc.returncode

    def _join(self) -> None:
        for t in self._readers:
            t.join(timeout=10)

    def kill(self) -> None:
        """Cleanup: SIGKILL the command's process group if it is still there."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()


def leftovers(root: Path) -> list[str]:
    """Every temporary or set-aside output under `root` (there should be none)."""
    return sorted(str(p) for p in Path(root).rglob(".*") if LEFTOVER.match(p.name))


class RayTmp:
    """A RAY_TMPDIR of its own (short: Ray's socket paths are length-limited) for the commands
    of one test, so their Ray never joins another's, and a way to see its processes."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="lsi", dir="/tmp")
        self.env = {"RAY_TMPDIR": self.dir}
        self._sessions: set[int] = set()

    def pids(self) -> list[int]:
        """The live processes of the Ray started under this RAY_TMPDIR (conftest.ray_pids)."""
        return ray_pids(self.dir, self._sessions)

    def gone(self, timeout: float = 20) -> list[int]:
        """Wait until no process of this RAY_TMPDIR's Ray is left; returns those that are."""
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.pids()

    def assert_gone(self) -> None:
        left = self.gone()
        assert not left, f"Ray processes outlived their command: {_describe(left)}"


def _describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:200]!r}")
        except OSError:
            out.append(str(pid))
    return out
