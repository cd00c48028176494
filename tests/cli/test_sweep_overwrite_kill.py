"""`train EXP --out RUN --overwrite` of an expert sweep SIGKILLed mid-sweep keeps the old sweep's
registry rows: with the old sweep folder it set aside (`.NAME.replaced-PID-*`). Moved back as
the stale lock's line says, the next `train --continue` finds it finished and the registry lists
its experts again, not the killed sweep's. A real process enters the sweep's folder as
`layerswap train` does (cli/train_sweep.sweep_folder), registers a new trial's row and is
SIGKILLed there; no Ray, no training: the old sweep is laid out by hand.

Run: .venv/bin/python -m pytest -q tests/cli/test_sweep_overwrite_kill.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import yaml

from layerswap.cli import main
from layerswap.cli.train_sweep import SWEEP_FINISHED
from layerswap.experts.registry import append_rows, read_rows, registry_path
from layerswap.spaces.train_experiment import experiment_identity
from layerswap.trainables.outputs import write_marker, writing
from tests.trainables.train.train_helpers import make_exp

SWEEP = {"num_samples": 2, "params": {"hyper.lr": {"low": 1e-4, "high": 3e-3, "log": True}}}

# argv: the experiment as JSON, RUN, the new trial's registry row as JSON.
KILLED_OVERWRITE = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path
    from layerswap.cli.train_sweep import sweep_folder
    from layerswap.experts.registry import append_rows, registry_path
    from layerswap.spaces.train_experiment import parse_train_experiment

    exp = parse_train_experiment(json.loads(sys.argv[1]), source="test")
    run = Path(sys.argv[2])
    where, resume = sweep_folder(exp, run, overwrite=True)
    with where:
        append_rows(registry_path(run), [json.loads(sys.argv[3])])  # a new trial scored
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _row(folder, trial: str, expert_id: str) -> dict:
    ck = folder / trial / "checkpoints" / "samples_000000016"
    return {"expert_id": expert_id, "kind": "math", "language": "en", "mode": "full", "path": str(ck), "base": "b", "trial_id": trial, "step": 2, "samples": 16, "seed": 0, "hparams": "{}", "ind__x": 0.5, "n_items__x": 10}  # fmt: skip


def _names(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_killed_overwrite_keeps_the_old_sweeps_registry_rows(tiny_world, tmp_path, capsys):
    exp = make_exp(tiny_world, name="sw", sweep=SWEEP)
    (f := tmp_path / "sweep.yaml").write_text(yaml.safe_dump(exp.model_dump(mode="json", exclude_none=True)))  # fmt: skip
    run = tmp_path / "run"
    folder, reg = run / "train" / "sw", registry_path(run)
    old = _row(folder, "trial_a", "aaaaaaaaaaaa")  # a finished sweep of one registered trial
    os.makedirs(old["path"])
    write_marker(folder, "train", experiment_identity(exp))
    record = {"identity": experiment_identity(exp), "trials": {"trial_a": "ok"}, "rows": 1}
    (folder / SWEEP_FINISHED).write_text(json.dumps(record))
    append_rows(reg, [old])
    files = _names(folder)

    new = _row(folder, "trial_b", "bbbbbbbbbbbb")
    cmd = [sys.executable, "-c", KILLED_OVERWRITE, exp.model_dump_json(), str(run), json.dumps(new)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert [r["expert_id"] for r in read_rows(reg)] == ["bbbbbbbbbbbb"]  # the killed sweep's

    with writing(folder):  # the next writer takes the dead one's lock and names the old sweep
        pass
    said = capsys.readouterr().err
    hint = re.search(r"left (\S+): it holds the sw that pid \d+ was replacing when it stopped; move it back over (\S+) to keep it", said)  # fmt: skip
    assert hint is not None and hint.group(2) == str(folder), said
    aside = folder.parent / hint.group(1)
    assert (aside / SWEEP_FINISHED).is_file()
    shutil.rmtree(folder)  # follow the line: the old sweep moved back over the killed one
    os.rename(aside, folder)

    assert main(["train", str(f), "--out", str(run), "--continue"]) == 0
    out = capsys.readouterr().out
    assert "this expert sweep is already finished (1 trials); nothing to do" in out
    assert f"{folder}: put back its 1 registry rows" in out
    assert read_rows(reg) == [old]  # the old sweep's experts, and none of the killed one's
    assert _names(folder) == files  # as it was, nothing of the killed run's left in it
    assert main(["train", str(f), "--out", str(run), "--continue"]) == 0  # settled once
    assert "put back" not in capsys.readouterr().out and read_rows(reg) == [old]
