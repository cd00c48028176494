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

from layerswap.trainables.lock_files import lock_path
from layerswap.trainables.locks import writing


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


# A writer killed at a chosen point: it takes OUT's lock, then stops (printing "at the kill point")
# after the given number of os.rename calls inside trainables/atomic.py or trainables/outputs.py.
_KILLED_WRITER = """
import os, sys, time
from pathlib import Path
from layerswap.trainables import atomic, outputs
from layerswap.trainables.locks import writing

out, how, renames = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
real_rename, done = os.rename, []

def rename(a, b):
    real_rename(a, b)
    done.append(b)
    if len(done) == renames:
        print("at the kill point", flush=True)
        time.sleep(600)

atomic.os.rename = rename  # the module's os: both files import it whole
with writing(out):
    if how == "atomic_dir":
        with atomic.atomic_dir(out, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new\\n")
    else:
        with outputs.replacing([out]):
            out.mkdir()
            (out / "new.txt").write_text("half\\n")
            print("at the kill point", flush=True)
            time.sleep(600)
"""


def _kill_writer_at(out: Path, how: str, renames: int) -> int:
    """Run `_KILLED_WRITER` on `out` and SIGKILL it at its kill point; its pid."""
    proc = _layerswap_python(_KILLED_WRITER, str(out), how, str(renames))
    try:
        line = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
    assert line == "at the kill point\n", err[-2000:]
    return proc.pid


def _layerswap_python(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _old_output(out: Path) -> None:
    out.mkdir()
    (out / "old.txt").write_text("the user's\n")


def _next_writer(out: Path, capfd) -> list[str]:
    """Take `out`'s lock as the next writer does; the lines it said about the dead one's files."""
    with writing(out):
        pass
    return [line for line in capfd.readouterr().err.splitlines() if "taking over" not in line]


def test_a_swap_killed_between_its_renames_puts_the_old_output_back(tmp_path, capfd):
    out = tmp_path / "out"
    _old_output(out)
    pid = _kill_writer_at(out, "atomic_dir", renames=1)  # OUT moved aside, the new one not in
    assert not out.exists() and len(list(tmp_path.glob(f".out.old-{pid}-*"))) == 1
    [old] = tmp_path.glob(f".out.old-{pid}-*")
    [tmp] = tmp_path.glob(f".out.tmp-{pid}-*")
    said = _next_writer(out, capfd)
    assert said == [
        f"layerswap: {out}: put back out from {old.name}: pid {pid} was killed while replacing it",
        f"layerswap: {out}: removed {tmp.name}, the unfinished output of pid {pid}",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert [p.name for p in out.iterdir()] == ["old.txt"]


def test_a_swap_killed_after_its_renames_drops_the_replaced_output(tmp_path, capfd):
    out = tmp_path / "out"
    _old_output(out)
    pid = _kill_writer_at(out, "atomic_dir", renames=2)  # the new one in, the old one not yet gone
    [old] = tmp_path.glob(f".out.old-{pid}-*")
    said = _next_writer(out, capfd)
    assert said == [f"layerswap: {out}: removed {old.name}, the output pid {pid} had already replaced"]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert [p.name for p in out.iterdir()] == ["new.txt"]


def test_an_output_a_killed_run_was_replacing_is_named_and_kept(tmp_path, capfd):
    out = tmp_path / "out"
    _old_output(out)
    pid = _kill_writer_at(out, "replacing", renames=0)
    [aside] = tmp_path.glob(f".out.replaced-{pid}-*")
    said = _next_writer(out, capfd)
    assert said == [
        f"layerswap: {out}: left {aside.name}: it holds the out that pid {pid} was replacing when "
        f"it stopped; move it back over {out} to keep it, or remove it"
    ]
    assert (aside / "old.txt").read_text() == "the user's\n"
    assert (out / "new.txt").read_text() == "half\n"  # the killed run's, for --resume


def test_a_dead_writer_with_this_process_s_pid_is_still_cleaned_up_after(tmp_path, capfd):
    """In a container every command may be pid 1: the stale lock then carries the next writer's
    own pid, and is still a dead writer's (its swap is settled, not left hidden)."""
    import json
    import socket

    out, me = tmp_path / "out", os.getpid()
    old = tmp_path / f".out.old-{me}-0123abcd"
    old.mkdir()
    (old / "old.txt").write_text("the user's\n")
    record = {"pid": me, "host": socket.gethostname(), "command": "c", "since": "s"}
    lock_path(out).write_text(json.dumps(record))
    said = _next_writer(out, capfd)
    assert said == [f"layerswap: {out}: put back out from {old.name}: pid {me} was killed while replacing it"]  # fmt: skip
    assert (out / "old.txt").read_text() == "the user's\n"


def test_every_output_a_killed_run_was_replacing_beside_it_is_named(tmp_path, capfd):
    """A search locks RUN/search but sets aside RUN/promotion, RUN/best and RUN/leaderboard.md
    with it: all are named, none removed; another pid's are not named."""
    import json
    import socket

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)  # fmt: skip
    pid = int(dead.stdout)
    out = tmp_path / "search"
    asides = [tmp_path / f".{n}.replaced-{pid}-0123abcd" for n in ("best", "leaderboard.md", "search")]  # fmt: skip
    for p in asides:
        p.mkdir()
    other = tmp_path / f".promotion.replaced-{pid + 1}-0123abcd"
    other.mkdir()
    record = {"pid": pid, "host": socket.gethostname(), "command": "c", "since": "s"}
    lock_path(out).write_text(json.dumps(record))
    said = _next_writer(out, capfd)
    assert [line.split(": left ")[1].split(":")[0] for line in said] == [p.name for p in asides]
    assert f"move it back over {tmp_path / 'leaderboard.md'} to keep it" in said[1]
    assert all(p.exists() for p in [*asides, other])
