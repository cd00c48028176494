"""`layerswap train EXP --out RUN --continue` resumes an expert sweep cut from outside: a real
command SIGKILLed with all its Ray processes (a lost head node) once a trial's registry row is
there, then run again with --continue. Checked from outside: the finished trial's checkpoint
files are the same files (inode and mtime), every model written before the cut is kept (a cut
trial resumes from its newest checkpoint), no registry row twice, num_samples trials in the
end, SWEEP_FINISHED written, exit 0; the first run names RUN relative to its folder and the
resume absolutely, and every row lands in RUN's registry.

Run: .venv/bin/python -m pytest -q tests/cli/test_sweep_continue.py   (slow: two sweep commands)
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml

from layerswap.cli.train_sweep import SWEEP_FINISHED
from layerswap.experts.registry import read_rows, registry_path
from tests.trainables.train.train_helpers import make_exp

pytestmark = pytest.mark.slow

TRIALS, STEPS = 3, 400


def _checkpoints(trial: Path) -> list[Path]:
    return sorted((trial / "checkpoints").glob("samples_*"))


def _cut_trial(run: Path) -> Path | None:
    """A trial folder with 3-4 of its 5 checkpoints once a trial is registered: cut now, it is
    in Tune's saved state (saved every second, and it has trained for about two) and has
    checkpoints to resume from."""
    done = {r["trial_id"] for r in _rows(run)}
    folder = run / "train" / "sw"
    if not done or not folder.is_dir():
        return None
    for trial in folder.iterdir():
        if trial.name not in done and 3 <= len(_checkpoints(trial)) < 5:
            return trial
    return None


def _sweep_yaml(world: Path, tmp: Path) -> Path:
    # One trial at a time: the first finishes while the others wait (or train) when it is cut.
    sweep = {
        "num_samples": TRIALS,
        "max_concurrent": 1,
        "params": {"hyper.lr": {"low": 1e-4, "high": 3e-3, "log": True}},
        "checkpoints": "last",
        "indicators": ["world_belebele_en_dev"],
        "limit": 2,
        "max_gen_toks": 4,
    }
    # ~4 s of training a trial, 5 checkpoints: time to cut the second trial between two of them
    hyper = {"lr": 1e-3, "max_steps": STEPS, "batch_size": 4, "seq_len": 64, "warmup_steps": 0}
    exp = make_exp(
        world, name="sw", hyper=hyper, checkpoint_every_samples=4 * STEPS // 5, sweep=sweep
    )
    f = tmp / "sweep.yaml"
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json", exclude_none=True)))
    return f


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder`: (inode, mtime in ns), which a retrained checkpoint changes."""
    return {
        str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _rows(run: Path) -> list[dict]:
    try:
        return read_rows(registry_path(run))
    except ValueError:  # being replaced this very moment
        return []


def test_continue_resumes_a_sweep_killed_after_a_trial_finished(tiny_world, tmp_path, cli, ray_tmp):  # fmt: skip
    f, run = _sweep_yaml(tiny_world, tmp_path), tmp_path / "run"
    folder = run / "train" / "sw"
    # The first run names RUN relative to its folder, the resume absolutely: Tune's pickled
    # state keeps the first spelling, the rows must still go to RUN's registry (sweep_tuner).
    first = cli("train", f, "--out", os.path.relpath(run, tmp_path / ".cwd"), env=ray_tmp.env)
    seen: list[Path] = []
    first.wait_for(lambda: seen.append(_cut_trial(run)) or seen[-1] is not None, "a trial to cut")
    # The driver, its Ray and its trials, at once: Ray's processes run in a session of their
    # own (trainables/ray_session.py), so they are killed by pid right after the driver's group.
    ray_pids = ray_tmp.pids()
    os.killpg(first.proc.pid, signal.SIGKILL)
    for pid in ray_pids + ray_tmp.pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    first.finish(timeout=60)
    assert not ray_tmp.gone(), ray_tmp.pids()
    done = _rows(run)
    assert 1 <= len(done) < TRIALS, first.tail()
    assert not (folder / SWEEP_FINISHED).exists()
    kept = {r["trial_id"]: _files(Path(r["path"])) for r in done}
    # Every model written before the cut, the cut trial's too: resumed from, never rewritten
    # (a trial started over would write each of its checkpoints again).
    models = {p: _files(p.parent)["model.safetensors"] for p in folder.glob("*/checkpoints/*/model.safetensors")}  # fmt: skip

    again = cli("train", f, "--out", run, "--continue", env=ray_tmp.env)
    assert again.finish() == 0, again.tail()
    assert "resuming this unfinished expert sweep" in again.stdout, again.tail()
    record = json.loads((folder / SWEEP_FINISHED).read_text())
    assert len(record["trials"]) == TRIALS and set(record["trials"].values()) == {"ok"}, record
    rows = read_rows(registry_path(run))
    assert len(rows) == TRIALS == len({r["expert_id"] for r in rows}), rows  # one row per trial
    assert {r["trial_id"] for r in rows} == set(record["trials"]), (rows, record)
    by_trial = {r["trial_id"]: r for r in rows}
    for trial, files in kept.items():  # not trained (nor written) again: the same files
        assert _files(Path(by_trial[trial]["path"])) == files, trial
    assert all(Path(r["path"]).is_dir() for r in rows)
    assert {p: _files(p.parent)["model.safetensors"] for p in models} == models
    cut = seen[-1]  # resumed under its id, from its newest checkpoint, to its last
    assert cut.name in record["trials"] and len(_checkpoints(cut)) == 5, (cut, record)
    assert f"expert sweep sw: {TRIALS} trials, {TRIALS} checkpoints" in again.stdout, again.tail()
    assert not any((tmp_path / ".cwd").iterdir())  # nothing written where the commands ran
    ray_tmp.assert_gone()
