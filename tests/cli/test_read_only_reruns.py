"""Reruns over a read-only output folder (an archived results mount): a finished training run
or search, re-run with `--continue` as a study's commands.sh does, writes nothing inside and says
"nothing to do" (exit 0); an unfinished one would write inside and is refused before work
(exit 2, naming it).

Run: .venv/bin/python -m pytest -q tests/cli/test_read_only_reruns.py
"""

from __future__ import annotations

from pathlib import Path

import yaml

from layerswap.cli import main
from layerswap.spaces.train_experiment import (
    absolute_local_paths,
    experiment_identity,
    load_train_experiment,
)
from layerswap.trainables.outputs import write_marker
from tests.cli.test_rerun_commands import _fake_search
from tests.trainables.train.train_helpers import make_exp


def _train_yaml(world: Path, tmp_path: Path) -> Path:
    exp = make_exp(world, "full", hyper={"max_steps": 2}, checkpoint_every_samples=8, name="ro")
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json")))
    return f


def test_train_continue_of_a_read_only_run(tiny_world, tmp_path, capsys, read_only, tree_state):
    f = _train_yaml(tiny_world, tmp_path)
    out, run = tmp_path / "run", tmp_path / "run/train/ro"
    argv = ["train", str(f), "--out", str(out), "--no-ray", "--continue"]
    assert main(argv) == 0
    before = tree_state(run)
    capsys.readouterr()
    read_only(run)
    assert main(argv) == 0, capsys.readouterr().err  # finished: nothing is written inside
    assert f"{run}: this experiment is already trained; nothing to do" in capsys.readouterr().out
    assert tree_state(run) == before
    # started, no checkpoint yet: --continue and --resume would write inside it
    other = tmp_path / "other/train/ro"
    other.mkdir(parents=True)
    write_marker(other, "train", experiment_identity(absolute_local_paths(load_train_experiment(f))))  # fmt: skip
    read_only(other)
    for flag in ("--continue", "--resume"):
        assert main(["train", str(f), "--out", str(tmp_path / "other"), "--no-ray", flag]) == 2
        assert capsys.readouterr().err == f"layerswap: error: {other}: cannot be continued, it is not writable\n"  # fmt: skip
    assert sorted(p.name for p in other.iterdir()) == [".layerswap.json"]


def test_search_continue_of_a_read_only_run(tiny_world, expert_pair, tmp_path, monkeypatch, capsys, read_only):  # fmt: skip
    from tests.search.search_fixtures import experiment

    f = tmp_path / "search.yaml"
    f.write_text(yaml.safe_dump(experiment(tiny_world, expert_pair).model_dump(mode="json")))
    calls = _fake_search(monkeypatch, [True, False])
    run = tmp_path / "run"
    argv = ["search", str(f), "--out", str(run), "--continue"]
    assert main(argv) == 1  # its promotion failed: unfinished
    read_only(run / "search")
    capsys.readouterr()
    assert main(argv) == 2  # refused before the search runs
    assert capsys.readouterr().err == f"layerswap: error: {run / 'search'}: cannot be continued, it is not writable\n"  # fmt: skip
    assert calls == [("search", True), "promote"]
    # finished (its record written while it was writable): skipped, exit 0
    (tmp_path / "rw").mkdir()
    assert main(["search", str(f), "--out", str(tmp_path / "rw"), "--continue"]) == 0
    read_only(tmp_path / "rw/search")
    capsys.readouterr()
    assert main(["search", str(f), "--out", str(tmp_path / "rw"), "--continue"]) == 0
    assert "already finished and promoted; nothing to do" in capsys.readouterr().out
    assert len(calls) == 4
