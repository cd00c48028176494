"""The driver of the whole pipeline (`layerswap demo`) SIGKILLed mid-training and mid-search:
`--resume` finishes the run, keeping what was done and doing the rest exactly once.

Checked from outside: the killed command's Ray processes are gone before the resume starts,
checkpoints written before a kill are kept as they were (same inode and mtime), every search
trial is in trials.parquet once, the registry has one row per checkpoint, and the leaderboard
and best model are written.
Run: .venv/bin/python -m pytest -q tests/cli/test_driver_kill.py   (slow: ~4 min on 2 cores)
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.cli.cli_process import leftovers

pytestmark = pytest.mark.slow

STEPS, TRIALS = 200, 8  # tiny-world steps take ~50 ms: a checkpoint at 100, the last at 200


def _trials(run: Path) -> list[dict]:
    from layerswap.trainables.atomic import read_parquet  # the driver may be replacing it

    table = run / "search" / "trials.parquet"
    return read_parquet(table).to_pylist() if table.exists() else []


def _checkpoints(run: Path) -> dict[str, tuple[int, int]]:
    """Every checkpoint's manifest under RUN/train: relative path -> (inode, mtime_ns)."""
    found = {}
    for m in (run / "train").glob("*/samples_*/layerswap_train.json"):
        st = m.stat()
        found[m.relative_to(run).as_posix()] = (st.st_ino, st.st_mtime_ns)
    return found


def _kill(c, ray_tmp) -> None:
    """SIGKILL the driver (no handler runs); its Ray processes must not outlive it for long."""
    os.kill(c.proc.pid, signal.SIGKILL)
    c.proc.wait(timeout=30)
    assert c.proc.returncode == -signal.SIGKILL
    # GCS and raylet end with the driver (PR_SET_PDEATHSIG); its workers (a training task still
    # holding its run's lock, the agents) wait for the GCS to come back, Ray's
    # gcs_rpc_server_reconnect_timeout_s (60 s by default), then exit: 60.2-60.3 s measured
    # after each kill here. The next run is refused while one holds a lock, so it waits too.
    left = ray_tmp.gone(timeout=150)
    assert not left, f"Ray processes outlived the killed driver by 150 s: {left}"


def test_demo_killed_twice_then_resumed(tmp_path, cli, ray_tmp):
    from layerswap.experts.registry import read_rows, registry_path

    run = tmp_path / "demo"
    args = ["demo", "--world-size", "tiny", "--trials", TRIALS, "--train-steps", STEPS, "--out", run]  # fmt: skip

    # 1. Killed while training: some expert has its mid-run checkpoint, not both their last.
    c = cli(*args, env=ray_tmp.env)
    c.wait_for(lambda: len(_checkpoints(run)) >= 1, "a first checkpoint", timeout=400)
    _kill(c, ray_tmp)
    mid_training = _checkpoints(run)
    assert 1 <= len(mid_training) < 4, mid_training

    # 2. Resumed, then killed mid-search.
    c = cli(*args, "--resume", env=ray_tmp.env)
    c.wait_for(lambda: len(_trials(run)) >= 1, "a trial row", timeout=400)
    _kill(c, ray_tmp)
    trained = _checkpoints(run)
    assert len(trained) == 4  # both experts: the mid-run and the last checkpoint
    assert {k: trained[k] for k in mid_training} == mid_training  # kept, not trained again
    before = _trials(run)
    assert 1 <= len(before) < TRIALS

    # 3. Resumed to the end.
    c = cli(*args, "--resume", env=ray_tmp.env)
    assert c.finish(timeout=600) == 0, c.tail()
    assert "every checkpoint is in experts/registry.parquet already" in c.stdout, c.tail()
    assert _checkpoints(run) == trained  # nothing trained again
    rows = _trials(run)
    assert rows[: len(before)] == before  # finished trials kept as they were
    ids = [r["trial_id"] for r in rows]
    assert len(rows) == TRIALS and len(set(ids)) == TRIALS, ids
    evaluated = [r["recipe_id"] for r in rows if r["status"] != "duplicate"]
    assert len(evaluated) == len(set(evaluated)), "a recipe was evaluated twice"
    paths = sorted(r["path"] for r in read_rows(registry_path(run)))
    assert paths == sorted(str((run / k).parent) for k in trained)  # one row per checkpoint
    assert (run / "leaderboard.md").is_file() and (run / "best" / "layerswap_recipe.yaml").is_file()
    assert not leftovers(tmp_path)
