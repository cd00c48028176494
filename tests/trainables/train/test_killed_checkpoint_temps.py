"""`train --no-ray` SIGKILLed while it writes a checkpoint leaves that checkpoint's hidden temporary
folder (`checkpoints/.samples_*.tmp-PID-*`, a whole model at 8B); the next run of it removes the
folder, saying so, and resumes. A real process is killed inside safetensors' write of the second
checkpoint's optimizer state; what is left on disk is then read from outside.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_killed_checkpoint_temps.py   (~6 s)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from layerswap.spaces.train_experiment import parse_train_experiment
from layerswap.trainables.train.run import train_expert
from tests.trainables.train.train_helpers import make_exp

pytestmark = pytest.mark.slow  # a second interpreter loads torch and trains

# Runs the experiment (its JSON in argv[1]) into argv[2] as `train --no-ray` does, killed by
# SIGKILL when safetensors writes its second file: the second checkpoint's optimizer state (full
# mode writes one a checkpoint), inside atomic_dir's temporary folder.
KILLED_RUN = textwrap.dedent(
    """
    import json, os, signal, sys
    import torch
    torch.set_num_threads(1)
    import layerswap.trainables.train.state as state
    from layerswap.spaces.train_experiment import parse_train_experiment
    from layerswap.trainables.train.run import train_expert

    real, calls = state.save_file, []
    def save_file(*a, **k):
        calls.append(a[1])
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **k)
    state.save_file = save_file
    exp = parse_train_experiment(json.loads(sys.argv[1]), source="test")
    train_expert(exp, sys.argv[2], use_ray=False)
    """
)


def test_the_next_run_removes_a_killed_runs_half_written_checkpoint(tiny_world, tmp_path, capsys):
    exp = make_exp(tiny_world, "full", hyper={"max_steps": 4}, checkpoint_every_samples=16, name="k")  # fmt: skip
    storage = tmp_path / "train"
    cmd = [sys.executable, "-c", KILLED_RUN, exp.model_dump_json(), str(storage)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpts = storage / "k" / "checkpoints"
    left = sorted(p.name for p in ckpts.iterdir())
    assert left[1:] == ["samples_000000016"], left  # the first checkpoint is whole
    temp = ckpts / left[0]
    assert temp.name.startswith(".samples_000000032.tmp-") and any(temp.rglob("*.safetensors"))

    again = parse_train_experiment(exp.model_dump(mode="json"), source="test")
    assert train_expert(again, str(storage), use_ray=False, resume=True) == ckpts / "samples_000000032"  # fmt: skip
    err = capsys.readouterr().err
    assert f"removed {temp}, left unfinished by a killed writer" in err
    assert sorted(p.name for p in ckpts.iterdir()) == ["samples_000000016", "samples_000000032"]
    assert not list(Path(storage).rglob(".*.tmp-*"))  # nothing hidden left anywhere in the run
