"""`layerswap train` on Ray prints layerswap's own progress lines on stdout, as `--no-ray` does
(trainables/train/progress.py, ray_progress.py), and keeps Ray's output to itself unless the
command runs with --verbose.

The gate's rule with a fake clock; a 12-step run on a one-node Ray cluster (`ray_cluster`,
whose driver takes no worker output: the lines come from the driver itself); the real command
in a process of its own, where Ray's forwarded worker logs and INFO notices used to fill stderr.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_train_progress_lines.py
(slow: the two Ray runs take ~40 s and ~60 s on an idle 2-core machine)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.cli.cli_process import RAY_FORWARDED, Cli
from tests.trainables.train.train_helpers import make_exp

LINE = re.compile(
    r"^step (\d+) of 12, samples (\d+) of 96: loss \d+\.\d{4}(, val \d+\.\d{4})?, "
    r"\d+\.\d samples/s( -> (\S+))?$"
)


def _exp_yaml(world: Path, tmp: Path) -> Path:
    """12 steps of 8 samples, a checkpoint every 4 steps, a report every step; seq_len 80 cuts
    some answers (one line says so before the progress lines)."""
    exp = make_exp(world, name="p", checkpoint_every_samples=32, storage_path=str(tmp / "store"), hyper={"seq_len": 80})  # fmt: skip
    f = tmp / "exp.yaml"
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json", exclude_none=True)))
    return f


def _progress(out: str) -> list[re.Match]:
    return [m for m in map(LINE.match, out.splitlines()) if m]


def _check_lines(out: str, run: Path) -> None:
    """The first report, then each checkpoint with its validation loss and its path, which
    holds the checkpoint; nothing else in a run this short (~30 s between other lines). Before
    them, once, the line on the rows cut to seq_len (a worker's: the driver prints it)."""
    notes = [ln for ln in out.splitlines() if ln.startswith("layerswap: data: datasets[0]")]
    assert len(notes) == 1 and "0 of 120 rows dropped" in notes[0], out
    assert out.index(notes[0]) < out.index("step 1 of 12"), out
    lines = _progress(out)
    assert [int(m[1]) for m in lines] == [1, 4, 8, 12], out
    assert [int(m[2]) for m in lines] == [8, 32, 64, 96], out
    assert lines[0][3] is None and lines[0][4] is None, out  # no validation, no checkpoint
    for m in lines[1:]:
        assert m[3] is not None, out
        assert Path(m[5]) == run / f"samples_{int(m[2]):09d}" and Path(m[5]).is_dir(), out


def test_a_line_at_the_first_report_each_checkpoint_and_every_30_s():
    from layerswap.trainables.train.progress import ProgressGate, progress_line

    now = [100.0]
    gate = ProgressGate(30, clock=lambda: now[0])
    seen = []
    for t, ckpt in [(0, False), (10, False), (29, False), (29, True), (40, False), (60, False)]:
        now[0] = 100.0 + t
        seen.append(gate.due({"checkpoint": ckpt}))
    assert seen == [True, False, False, True, False, True]
    m = {"step": 3, "total_steps": 9, "samples": 24, "total_samples": 72, "loss": 1.0}
    assert progress_line(m | {"samples_per_s": 2.25}) == (
        "step 3 of 9, samples 24 of 72: loss 1.0000, 2.2 samples/s"
    )
    assert progress_line(m | {"samples_per_s": 2.0, "val_loss": 0.5}, "/r/samples_24") == (
        "step 3 of 9, samples 24 of 72: loss 1.0000, val 0.5000, 2.0 samples/s -> /r/samples_24"
    )


@pytest.mark.slow
def test_ray_run_prints_progress_lines_from_the_driver(tiny_world, tmp_path, ray_cluster, capsys):  # fmt: skip
    from layerswap.cli import main

    f = _exp_yaml(tiny_world, tmp_path)
    with ray_cluster(workers=1, cpus=1):  # its driver takes no worker output (log_to_driver off)
        assert main(["train", str(f), "--out", str(tmp_path / "run")]) == 0
    _check_lines(capsys.readouterr().out, tmp_path / "run/train/p")


@pytest.mark.slow
def test_plain_train_on_ray_shows_its_lines_and_not_rays(tiny_world, tmp_path, ray_tmp):
    f = _exp_yaml(tiny_world, tmp_path)
    cwd = tmp_path / ".cwd"  # not the repository: its folders would shadow the package
    cwd.mkdir()
    c = Cli("train", f, "--out", tmp_path / "run", cwd=cwd, env=ray_tmp.env)
    try:
        assert c.finish() == 0, c.tail()
    finally:
        c.kill()
    _check_lines(c.stdout, tmp_path / "run/train/p")
    # Before: every worker's and the controller's log line ("(RayTrainWorker pid=...)
    # Reporting training result ..."), the placement group cleaner's notice every ~2 s, and
    # Ray's INFO log ("Started a local Ray instance").
    forwarded = [ln for ln in c.stderr.splitlines() if RAY_FORWARDED.match(ln)]
    assert not forwarded, c.tail()
    assert "Started a local Ray instance" not in c.stderr, c.tail()
