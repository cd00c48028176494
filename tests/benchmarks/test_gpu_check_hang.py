"""The GPU check's hang watchdog: a stage blocked inside one C call (as a hung CUDA sync or NCCL
wait is) runs no Python signal handler, so neither the check's alarm nor an outer `timeout`'s
SIGTERM ends it. Here a real subprocess runs a stage that blocks with its signals held back; the
watchdog (faulthandler) must end it with the stack it was blocked in written under --out, the
finished stage kept and the blocked one recorded "running" in its JSON and the report.

Run: .venv/bin/python -m pytest -q -p no:cacheprovider tests/benchmarks/test_gpu_check_hang.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_check.report import HANG_FILE, RUNNING  # noqa: E402

# Two fake stages: one that ends, then one whose main thread never returns to Python: SIGALRM and
# SIGTERM held back in it, so the check's alarm raises nothing there (a CUDA sync that never
# returns leaves the handler as unrun), and a sleep far past the watchdog.
DRIVER = """
import signal, sys, time, types
sys.path.insert(0, {benchmarks!r})
from gpu_check import run

def blocked_in_c(ctx):
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGALRM, signal.SIGTERM, signal.SIGINT}})
    time.sleep(120)
    return {{"figures": []}}

for name, fn in (("fake_done", lambda ctx: {{"figures": []}}), ("fake_hung", blocked_in_c)):
    mod = types.ModuleType("gpu_check." + name)
    mod.TITLE, mod.run = "fake " + name, fn
    sys.modules["gpu_check." + name] = mod
run.STAGES = [("fake_done", 0), ("fake_hung", 0)]
run.GRACE_S, run.HANG_MARGIN_S = 0.5, 1.0
sys.exit(run.main(["--smoke", "--budget-s", "1", "--out", {out!r}, "--world", {world!r}]))
"""


@pytest.mark.slow  # ~8 s on 2 cores: torch's import in the subprocess
def test_a_stage_blocked_in_a_c_call_is_ended_by_the_watchdog_with_its_stack(tmp_path):
    out = tmp_path / "o"
    script = tmp_path / "hang.py"
    script.write_text(DRIVER.format(benchmarks=str(ROOT / "benchmarks"), out=str(out), world=str(tmp_path)))  # fmt: skip
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    wall = time.monotonic() - t0
    output = run.stdout[-3000:] + run.stderr[-3000:]
    assert run.returncode == 1, output  # faulthandler's exit, long before the 120 s sleep
    assert wall < 30, f"{wall:.0f} s: the watchdog did not end the blocked stage"
    traceback = (out / HANG_FILE).read_text()
    assert "Timeout (" in traceback and "in blocked_in_c" in traceback, traceback
    assert json.loads((out / "01_fake_done.json").read_text())["status"] == "ok"
    hung = json.loads((out / "02_fake_hung.json").read_text())
    assert hung["status"] == "running", hung
    report = (out / "report.md").read_text()
    assert "2 stage(s) run, 1 finished" in report
    assert f"**fake_hung** running: {RUNNING}" in report
