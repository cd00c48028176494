"""Ctrl-C at random moments of start-up: `merge`, `train` and `search` each get SIGINT at 20
seeded moments from 0 to 3 s after they were started (issue 41 kind 5).

Every run must exit 130 (or 0, had it finished) with one line, no traceback and no abort (the
reported 134 from torch's C++ import), and leave nothing half-visible where it writes: no
temporary sibling, no lock, no output that is not whole. A moment that falls before layerswap's
CLI has begun loading (CPython's own start-up: its site module, runpy, ~0.05-0.1 s, where no
program's code runs; cli/startup.py) waits for it; how many did is printed.

The 20 runs of a command go in batches of BATCH processes at once (2 cores).

Run: .venv/bin/python -m pytest -q tests/cli/test_early_interrupts.py   (about 2-3 min)
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.cli.cli_process import LEFTOVER, RAY_FORWARDED, RayTmp

pytestmark = pytest.mark.slow

SEED = 41
RUNS = 20  # per command
BATCH = 4  # processes at once
WINDOW_S = 3.0
ROOT = Path(__file__).resolve().parents[2]


# `python -X importtime` reports each module as its import ends, on stderr. argparse is the
# first module the CLI package imports, before and after the fix alike (nothing in CPython's own
# start-up imports it): its line marks the end of the start-up no program's code can reach, and
# the test's moments are measured against something the fix does not move.
IMPORT_LINE = "import time:"
CLI_BEGUN = re.compile(r"\|\s+argparse\s*$")


@dataclass
class Run:
    """One command started, signalled at `at` seconds, and what it did."""

    argv: list[str]
    out: Path
    at: float
    waited: bool = False  # the moment fell before layerswap's CLI began loading
    sent: float | None = None  # seconds after the start (None: it ended first)
    code: int | None = None
    stderr: str = ""
    problems: list[str] = field(default_factory=list)


def _read(stream, run: Run, begun: threading.Event) -> None:
    lines = []
    for line in stream:
        if line.startswith(IMPORT_LINE):
            if CLI_BEGUN.search(line):
                begun.set()
        else:
            lines.append(line)
    run.stderr = "".join(lines)
    begun.set()  # ended


def _one(run: Run, env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "layerswap.cli", *run.argv],
        cwd=run.out.parent,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    t0 = time.monotonic()
    begun = threading.Event()
    reader = threading.Thread(target=_read, args=(proc.stderr, run, begun))
    reader.start()
    time.sleep(run.at)
    run.waited = not begun.is_set()
    begun.wait(timeout=120)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGINT)
        run.sent = time.monotonic() - t0
    try:
        run.code = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        run.code = proc.wait()
        run.problems.append("still running 90 s after the signal")
    reader.join(timeout=10)


def _check(run: Run) -> None:
    own = "".join(line for line in run.stderr.splitlines(True) if not RAY_FORWARDED.match(line))
    if run.code not in (0, 130):
        run.problems.append(f"exit {run.code}")
    if "Traceback" in own or "terminate" in own:
        run.problems.append("a traceback or C++ terminate on stderr")
    if run.code == 130 and "layerswap: interrupted (SIGINT)" not in own:
        run.problems.append("no interrupt line")
    left = [p.name for p in run.out.parent.rglob(".*") if LEFTOVER.match(p.name) or p.name.endswith(".layerswap.lock")]  # fmt: skip
    if left:
        run.problems.append(f"left {left}")
    if run.code == 130 and run.out.exists() and not _whole(run.out):
        run.problems.append(f"{run.out} is there but not whole: {sorted(os.listdir(run.out))}")


def _whole(out: Path) -> bool:
    """An output left by an interrupted run is a marked run folder (train/search continue it
    with --resume); a merged model is never left by an interrupted merge."""
    return (out / ".layerswap.json").is_file() or any(out.rglob(".layerswap.json"))


def _batches(runs: list[Run], env: dict[str, str]) -> None:
    for i in range(0, len(runs), BATCH):
        threads = [threading.Thread(target=_one, args=(r, env)) for r in runs[i : i + BATCH]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _runs(name: str, make, tmp: Path, rng: random.Random) -> list[Run]:
    runs = []
    for i in range(RUNS):
        folder = tmp / name / f"{i:02d}"
        folder.mkdir(parents=True)
        argv, out = make(folder)
        runs.append(Run(argv, out, rng.uniform(0.0, WINDOW_S)))
    return runs


def test_ctrl_c_at_random_moments_of_start_up(tmp_path, tiny_world, family, expert_pair):
    from tests.search.search_fixtures import experiment

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"method": "layer_swap", "task_expert": family.ref("task"), "language_expert": family.ref("language"), "bottom": 2, "top": 2}))  # fmt: skip
    train = tmp_path / "exp.yaml"
    train.write_text(yaml.safe_dump({"name": "t", "base": str(tiny_world / "base"), "kind": "math", "language": "en", "datasets": [{"path": str(tiny_world / "data/sft/math_en.jsonl")}], "mode": "full", "hyper": {"lr": 3e-3, "batch_size": 8, "max_steps": 2, "seq_len": 96, "seed": 0}}))  # fmt: skip
    search = tmp_path / "search.yaml"
    search.write_text(yaml.safe_dump(experiment(tiny_world, expert_pair).model_dump(mode="json")))
    commands = {
        "merge": lambda d: (["merge", str(recipe), "--out", str(d / "m"), "-q"], d / "m"),
        "train": lambda d: (["train", str(train), "--out", str(d / "run"), "--no-ray"], d / "run"),
        "search": lambda d: (["search", str(search), "--out", str(d / "run")], d / "run"),
    }
    rng = random.Random(SEED)
    ray = RayTmp()
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        **ray.env,
    }
    problems = []
    try:
        for name, make in commands.items():
            runs = _runs(name, make, tmp_path, rng)
            _batches(runs, env)
            for r in runs:
                _check(r)
                problems += [f"{name} signalled at {r.sent}: {p}\n{r.stderr[-2000:]}" for p in r.problems]  # fmt: skip
            codes = sorted(str(r.code) for r in runs)
            print(f"{name}: exits {codes}; {sum(r.waited for r in runs)} moments waited for layerswap's CLI to begin")  # fmt: skip
    finally:
        for pid in ray.gone(timeout=20):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    assert not problems, "\n".join(problems)
