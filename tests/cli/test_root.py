"""The root command: every subcommand is registered, and building the parser stays light
(`layerswap --help` must not pay for torch, ray, lm-eval, optuna or pandas), and a signal decides
the exit code even where a library swallowed its KeyboardInterrupt."""

from __future__ import annotations

import subprocess
import sys
import time

from layerswap.cli import SUBCOMMANDS, build_parser

HEAVY = ("torch", "ray", "lm_eval", "optuna", "pandas", "transformers", "matplotlib")
# Runs `command(args)`, defined by a test's script, as the only layerswap subcommand, through
# cli.main, in a fresh process (real signals; exit code and streams seen from outside).
AS_THE_COMMAND = """
import argparse

def parser():
    p = argparse.ArgumentParser(prog="layerswap")
    p.set_defaults(func=command, command="test")  # as the real parser sets it
    return p

cli.build_parser = parser
sys.exit(cli.main([]))
"""


def run_as_the_command(script: str) -> subprocess.CompletedProcess:
    code = script + AS_THE_COMMAND
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_every_subcommand_is_registered():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == list(SUBCOMMANDS)


def test_building_the_parser_imports_nothing_heavy():
    code = (
        "import sys; from layerswap import cli; cli.build_parser(); "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_interrupt_a_library_swallowed_still_exits_130():
    """SIGINT raised KeyboardInterrupt inside code that ignored it; the command then finished."""
    code = """
import os, signal, sys, time
from layerswap import cli

def command(args):
    try:
        os.kill(os.getpid(), signal.SIGINT)  # a real signal: cli's handler raises here
        time.sleep(5)
    except KeyboardInterrupt:
        pass  # as a C callback that reports the error as ignored and goes on
    print("finished")
    return 0
"""
    out = run_as_the_command(code)
    assert out.returncode == 130, out.stderr
    assert out.stdout == "finished\n"
    assert "layerswap: interrupted (SIGINT)" in out.stderr and "Traceback" not in out.stderr


def test_an_interrupt_in_a_weakref_callback_prints_no_traceback():
    """SIGINT landed in a weakref callback (as in Ray's teardown after a search's last trial),
    where Python cannot raise it and prints "Exception ignored ... Traceback" unless told not to;
    the exit code and the one-line message still follow the signal. A foreign exception in such
    a callback is still reported."""
    code = """
import os, signal, sys, time, weakref
from layerswap import cli

class Thing:
    pass

def interrupted_in_callback(ref):
    os.kill(os.getpid(), signal.SIGINT)  # a real signal: cli's handler raises in this callback
    time.sleep(5)

def failing_callback(ref):
    raise RuntimeError("a library's own bug")

def command(args):
    a, b = Thing(), Thing()
    keep = [weakref.ref(a, interrupted_in_callback), weakref.ref(b, failing_callback)]
    del a  # the callback runs now; its KeyboardInterrupt goes to sys.unraisablehook
    del b
    print("finished")
    return 0
"""
    out = run_as_the_command(code)
    assert out.returncode == 130, out.stderr
    assert out.stdout == "finished\n"
    assert "layerswap: interrupted (SIGINT)" in out.stderr
    assert "KeyboardInterrupt" not in out.stderr
    assert "RuntimeError: a library's own bug" in out.stderr  # other unraisables still shown


# A command's script prefix: `ctrl_c_in_a_callback()` sends a real SIGINT that lands in a weakref
# callback (`interrupted_in_callback`).
SIGINT_IN_A_CALLBACK = """
import os, signal, sys, time, weakref
from layerswap import cli

class Thing:
    pass

def interrupted_in_callback(ref):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)

def ctrl_c_in_a_callback():  # Python drops the KeyboardInterrupt raised in there
    a = Thing()
    keep = weakref.ref(a, interrupted_in_callback)
    del a
"""


def test_an_interrupt_a_weakref_callback_swallowed_still_stops_the_command():
    """Python drops an exception raised in a weakref callback: the SIGINT that landed there
    (seen: SQLAlchemy's class registry, collected mid-search) must still stop the command, not
    let it run on to its end (a Ctrl-C mid-search ran every remaining trial)."""
    code = (
        SIGINT_IN_A_CALLBACK
        + """
def command(args):
    ctrl_c_in_a_callback()
    for _ in range(300):  # 3 s of the command's own work
        time.sleep(0.01)
    print("finished")
    return 0
"""
    )
    t0 = time.monotonic()
    out = run_as_the_command(code)
    assert out.returncode == 130, out.stderr
    assert out.stdout == "", "the command ran on to its end"
    assert time.monotonic() - t0 < 2.5
    assert "layerswap: interrupted (SIGINT)" in out.stderr and "Traceback" not in out.stderr


def test_a_second_signal_swallowed_during_cleanup_does_not_cut_it_short():
    """While one interrupt unwinds the command, a second one dropped in a weakref callback is not
    sent again: it would end the cleanup the first one started."""
    code = (
        SIGINT_IN_A_CALLBACK
        + """
def command(args):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    finally:
        ctrl_c_in_a_callback()
        for _ in range(30):  # the cleanup's own work
            time.sleep(0.01)
        print("cleaned up")
"""
    )
    out = run_as_the_command(code)
    assert out.returncode == 130, out.stderr
    assert out.stdout == "cleaned up\n"
    assert "Traceback" not in out.stderr


def test_a_swallowed_interrupt_wakes_a_command_blocked_in_a_wait():
    """The re-send is a real signal: a main thread blocked in one long sleep (or a lock, a child
    process) is woken as by the user's own Ctrl-C, not left to finish its wait."""
    code = (
        SIGINT_IN_A_CALLBACK
        + """
def command(args):
    ctrl_c_in_a_callback()
    time.sleep(4)
    print("finished")
    return 0
"""
    )
    t0 = time.monotonic()
    out = run_as_the_command(code)
    assert (out.returncode, out.stdout) == (130, ""), out.stderr
    assert time.monotonic() - t0 < 3


def test_a_re_send_after_the_command_raised_stays_out_of_the_outcome():
    """The command swallowed a Ctrl-C and then failed: the re-send must not land while main
    reports the outcome (a traceback and exit -2 before the fix), nor in the next command an
    in-process caller runs."""
    code = (
        SIGINT_IN_A_CALLBACK
        + """
import argparse

def failing(args):
    ctrl_c_in_a_callback()
    raise ValueError("the command's own failure")

def working(args):
    time.sleep(0.5)
    return 0

def runs(func):
    p = argparse.ArgumentParser(prog="layerswap")
    p.set_defaults(func=func, command="test")
    cli.build_parser = lambda: p
    return cli.main([])

print(runs(failing), runs(working))
"""
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "130 0\n"), out.stderr
    assert "Traceback" not in out.stderr


def test_markers_written_for_a_command_name_it_even_from_its_workers():
    """A Ray worker's argv is Ray's default_worker.py: what it writes for a command (a training
    run's marker, a lock) names the command, which the CLI hands down in LAYERSWAP_COMMAND."""
    code = """
import argparse, json, subprocess, sys
from layerswap import cli

def command(args):
    # a child process stands for a Ray worker: it inherits the driver's environment
    child = "from layerswap.trainables.outputs import marker; import json; print(json.dumps(marker('train')))"
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    print(json.loads(out.stdout)["command"])
    return 0

p = argparse.ArgumentParser(prog="layerswap")
p.add_argument("words", nargs="*")
p.set_defaults(func=command, command="test")
cli.build_parser = lambda: p
sys.exit(cli.main(["train", "my config.yaml"]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "layerswap train 'my config.yaml'\n"
