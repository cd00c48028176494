"""The output lock (trainables/locks.py): one writer per output, across real processes.

Run: .venv/bin/python -m pytest -q tests/trainables/test_output_locks.py   (a few seconds)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from layerswap.trainables.lock_files import lock_path
from layerswap.trainables.locks import OutputLocked, writing
from layerswap.trainables.outputs import check_output, output_dir, write_marker
from layerswap.world import prebuilt

HOLD = textwrap.dedent(
    """
    import sys, time
    from layerswap.trainables.locks import writing
    with writing(sys.argv[1]):
        print("held", flush=True)
        time.sleep(120)
    """
)


@pytest.fixture
def holder():
    """`holder(out)`: a process that holds the lock of `out` until the test ends."""
    procs = []

    def start(out: Path) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)  # fmt: skip
        procs.append(p)
        assert p.stdout.readline() == "held\n"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_a_second_process_is_refused_naming_the_owner(tmp_path, holder):
    out = tmp_path / "out"
    p = holder(out)
    with pytest.raises(OutputLocked, match=rf"{out}: another layerswap command is writing it: pid {p.pid} on host "):  # fmt: skip
        with writing(out):
            pass
    # every spelling of the output is the same lock
    with pytest.raises(OutputLocked):
        with writing(tmp_path / "." / "out"):
            pass


def test_inside_or_around_a_locked_output_is_refused(tmp_path, holder):
    (tmp_path / "run" / "search").mkdir(parents=True)
    p = holder(tmp_path / "run" / "search")
    with pytest.raises(OutputLocked, match=rf"lies inside .*search, which .* pid {p.pid}"):
        with writing(tmp_path / "run" / "search" / "x"):
            pass
    with pytest.raises(OutputLocked, match=rf"{tmp_path / 'run'}: holds .*search, which .* pid {p.pid}"):  # fmt: skip
        with writing(tmp_path / "run"):
            pass


def test_a_dead_owners_lock_is_taken_over_and_named(tmp_path, capsys):
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)  # fmt: skip
    pid = int(dead.stdout)
    lock_path(out).write_text(json.dumps({"pid": pid, "host": "h", "command": "c", "since": "s"}))
    with writing(out):
        assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
    assert f"taking over a stale lock of pid {pid} on host h since s (`c`)" in capsys.readouterr().err  # fmt: skip
    assert not lock_path(out).exists()


@pytest.mark.parametrize("same_host", [True, False])
def test_a_dead_owners_temps_are_swept_only_on_its_own_host(tmp_path, capsys, same_host):
    """Where flocks are per node (NFS with local_lock), a writer on another host looks dead from
    here while it runs: its temp folder is named and left, not removed under it."""
    import socket

    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)  # fmt: skip
    pid = int(dead.stdout)
    host = socket.gethostname() if same_host else "another-node"
    lock_path(out).write_text(json.dumps({"pid": pid, "host": host, "command": "c", "since": "s"}))
    temp = tmp_path / f".out.tmp-{pid}-0123abcd"
    temp.mkdir()
    with writing(out):
        pass
    err = capsys.readouterr().err
    assert temp.exists() is not same_host, err
    said = "removed" if same_host else f"left {temp.name}: its writer, pid {pid}, ran on host another-node"  # fmt: skip
    assert said in err, err


def test_reentrant_in_one_process_and_released_after(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    with writing(out):
        with writing(out):
            assert lock_path(out).exists()
        assert lock_path(out).exists()
    assert not lock_path(out).exists()
    assert not (tmp_path / "a").exists()  # the folders made for the lock went with it


def test_an_interrupt_while_taking_the_lock_leaves_no_lock_file(tmp_path, monkeypatch):
    """Ctrl-C while the owner record was being written (its fsync, slow under load) left the
    lock file behind, named stale by the next command (CI caught it: a search interrupted at
    start-up)."""
    out = tmp_path / "run"

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with writing(out):
            pass
    monkeypatch.undo()
    assert not lock_path(out).exists()
    with writing(out):  # free at once, nothing said about a stale owner
        assert lock_path(out).exists()


def test_an_interrupt_just_after_the_lock_was_taken_leaves_no_lock_file(tmp_path, monkeypatch):
    """Ctrl-C in writing()'s bookkeeping once _take returned (os.environ's Python methods run
    signal handlers) left the lock file of a command that exited 130 (a test that SIGSTOPs the
    writer as soon as its owner record appears, then SIGCONT + SIGINT, saw it under load)."""
    import layerswap.trainables.locks as locks

    out = tmp_path / "run"

    class Interrupted(dict):
        def __setitem__(self, key, value):
            raise KeyboardInterrupt

    monkeypatch.setattr(locks, "_HELD", Interrupted())
    with pytest.raises(KeyboardInterrupt):
        with writing(out):
            pass
    monkeypatch.undo()
    assert not lock_path(out).exists()
    assert locks.OWNERS_ENV not in os.environ or str(os.getpid()) not in os.environ[locks.OWNERS_ENV]  # fmt: skip

    class InterruptedAtRelease(dict):  # a Ctrl-C in the release's own bookkeeping
        def pop(self, *args):
            raise KeyboardInterrupt

    monkeypatch.setattr(locks, "_HELD", InterruptedAtRelease())
    monkeypatch.setenv(
        locks.OWNERS_ENV, "1"
    )  # restored by monkeypatch: the release never got to it
    with pytest.raises(KeyboardInterrupt):
        with writing(out):
            assert lock_path(out).exists()
    monkeypatch.undo()
    assert not lock_path(out).exists()


def test_output_dir_lists_what_it_wrote_and_overwrite_refuses_the_rest(tmp_path):
    out = tmp_path / "m"
    with output_dir(out, "merge") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "w.bin").write_bytes(b"x")
        (tmp / "README.md").write_text("card")
    check_output(out, "merge", overwrite=True)  # only its own files: replaceable
    (out / "sub" / "mine.txt").write_text("notes")
    (out / "extra").mkdir()
    with pytest.raises(ValueError, match=r"did not write there \(extra/, sub/mine.txt\)"):
        check_output(out, "merge", overwrite=True)


def test_a_killed_steps_leftovers_inside_a_container_are_layerswaps(tmp_path, capsys):
    """A merge-only demo of an older version, killed while merging in place, left its merged/
    step's temporary folder and stale lock inside the demo: --overwrite called the temporary
    the user's and refused. Now they are layerswap's, and the next writer (taking over the
    demo's stale lock) removes them; a long run's set-aside copy inside is still named."""
    import socket

    out = tmp_path / "mo"
    (out / "models").mkdir(parents=True)
    (out / "models" / "w.bin").write_bytes(b"w")
    write_marker(out, "merge-demo", files=["models/w.bin"])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)  # fmt: skip
    pid = int(dead.stdout)
    owner = json.dumps({"pid": pid, "host": socket.gethostname(), "command": "c", "since": "s"})
    temp = out / f".merged.tmp-{pid}-0123abcd"
    temp.mkdir()
    (temp / "model.safetensors").write_bytes(b"half")
    (out / ".merged.layerswap.lock").write_text(owner)
    check_output(out, "merge-demo", overwrite=True)  # nothing of the user's inside
    lock_path(out).write_text(owner)
    with writing(out):
        pass
    err = capsys.readouterr().err
    assert not temp.exists() and f"removed {temp.name}" in err, err
    assert not (out / ".merged.layerswap.lock").exists(), err
    assert (out / "models" / "w.bin").read_bytes() == b"w"
    (out / f".merged.replaced-{pid}-0123abcd").mkdir()
    with pytest.raises(ValueError, match=rf"did not write there \(.merged.replaced-{pid}-0123abcd/\)"):  # fmt: skip
        check_output(out, "merge-demo", overwrite=True)


def test_outputs_do_not_nest_nor_go_into_the_package(tmp_path):
    world = tmp_path / "w"
    world.mkdir()
    write_marker(world, "world")
    with pytest.raises(ValueError, match=r"lies inside .*, which holds an embedded world"):
        check_output(world / "train" / "t", "train")
    demo = tmp_path / "d"
    demo.mkdir()
    write_marker(demo, "demo")
    check_output(demo / "world", "world")  # a demo run holds the pipeline's outputs
    shipped = Path(prebuilt.__file__).parent / "bases" / "x"
    with pytest.raises(ValueError, match=r"inside the installed layerswap package .*--maintainer"):
        check_output(shipped, "base")
    check_output(shipped, "base", maintainer=True)
