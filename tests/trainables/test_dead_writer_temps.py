"""A `world build` killed with SIGKILL leaves its hidden `.NAME.tmp-PID-*` folder; the next writer
of that output, taking over the dead owner's lock, removes it (saying so in one line) and nothing
else: not another writer's temp, not a user's file of a similar name.

Run: .venv/bin/python -m pytest -q tests/trainables/test_dead_writer_temps.py   (about 20 s)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from layerswap.trainables.locks import lock_path


def _layerswap(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "layerswap.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _killed_mid_build(out: Path) -> tuple[int, Path]:
    """Start `world build --out OUT`, SIGKILL it once its temp folder has files; (pid, temp)."""
    proc = _layerswap("world", "build", "--out", str(out), "--size", "tiny")
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            temps = list(out.parent.glob(f".{out.name}.tmp-{proc.pid}-*"))
            if temps and any(temps[0].iterdir()):
                break
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    assert len(temps) == 1 and any(temps[0].iterdir()), err[-2000:]
    return proc.pid, temps[0]


@pytest.mark.slow
def test_the_next_writer_sweeps_a_killed_writers_temp_folder_and_nothing_else(tmp_path):
    out = tmp_path / "world"
    pid, temp = _killed_mid_build(out)
    assert lock_path(out).exists() and not out.exists()  # the dead owner's stale lock
    # Not the dead writer's: another pid's temp (no live writer: still not provably ours to
    # remove), and a user's files whose names merely look alike.
    others = [
        tmp_path / f".world.tmp-{pid + 1}-0123abcd",
        tmp_path / f".world.tmp-{pid}-notes",
        tmp_path / f".world.tmp-{pid}-0123abcd.bak",
    ]
    for p in others:
        p.mkdir()
        (p / "keep.txt").write_text("mine\n")

    proc = _layerswap("world", "build", "--out", str(out), "--size", "tiny", env=os.environ)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    removed = [line for line in err.splitlines() if "removed" in line]
    assert removed == [f"layerswap: {out}: removed {temp.name}, the unfinished output of pid {pid}"]  # fmt: skip
    assert "Traceback" not in err
    assert not temp.exists() and (out / "world.json").is_file()
    assert all((p / "keep.txt").read_text() == "mine\n" for p in others)
    assert not lock_path(out).exists()
