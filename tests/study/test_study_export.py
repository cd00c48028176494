"""`layerswap plan STUDY --export DIR`: each experiment as the study resolves it, and the commands
that run the study (study/export.py).

Run: .venv/bin/python -m pytest -q tests/study/test_study_export.py
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from layerswap.cli import main
from layerswap.spaces.search_experiment import SearchExperiment, load_search_experiment
from layerswap.spaces.study import load_study
from layerswap.spaces.train_experiment import load_train_experiment, parse_train_experiment
from layerswap.study.export import export_files

EXAMPLES = Path(__file__).resolve().parents[2] / "spaces" / "examples"


@pytest.mark.parametrize("study", ["real_study.yaml", "real_followup_study.yaml"])
def test_every_exported_experiment_reads_back_as_the_study_resolved_it(study, tmp_path):
    loaded = load_study(EXAMPLES / study)
    files = export_files(loaded, tmp_path)
    for ex in loaded.experts:
        data = yaml.safe_load(files[f"experts/{ex.experiment.name}.yaml"])
        assert parse_train_experiment(data) == ex.experiment  # overrides and sweep included
        assert ex.experiment.sweep is not None and "sweep" in data
    for s in loaded.searches:
        data = yaml.safe_load(files[f"searches/{s.experiment.name}.yaml"])
        assert SearchExperiment.model_validate(data) == s.experiment
    cmds = files["commands.sh"].splitlines()
    # each sweep writes where the searches of its base read the registry
    trains = [c for c in cmds if c.startswith("layerswap train")]
    assert len(trains) == len(loaded.experts)
    for model in ("llama31_8b", "qwen25_7b") if study == "real_followup_study.yaml" else ("llama31_8b",):  # fmt: skip
        mine = [c for c in trains if f"/{model}_" in c]
        assert mine and all(f" --out runs/{model} " in c for c in mine), mine


def test_every_exported_command_continues_the_step_as_it_stands(tmp_path):
    """commands.sh can be run again after an interruption: each line carries --continue (train,
    search and analyze each document it), and the header says what a rerun does."""
    files = export_files(load_study(EXAMPLES / "real_followup_study.yaml"), tmp_path)
    text = files["commands.sh"]
    cmds = [c for c in text.splitlines() if c.startswith("layerswap ")]
    assert {c.split()[1] for c in cmds} == {"train", "search", "analyze"}
    assert all(c.split("  #")[0].endswith(" --continue") for c in cmds), cmds
    header = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert "Every command carries --continue, so after an interruption run this script again" in header  # fmt: skip
    assert "with --resume" not in header  # what the commands never carried
    for rel, data in files.items():  # each config's own "Run:" line is its commands.sh line
        if rel != "commands.sh":
            run = data.splitlines()[1].removeprefix("# Run: ")
            assert run in cmds, (rel, run)


def test_plan_export_writes_the_files_once(tiny_world, tmp_path, monkeypatch, capsys):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "world").symlink_to(tiny_world)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "exported"
    argv = ["plan", str(EXAMPLES / "world_study.yaml"), "--export", str(out)]
    assert main(argv) == 0
    assert f"wrote {out}: 3 experiment(s)" in capsys.readouterr().out
    exp = load_train_experiment(out / "experts" / "world_math_full.yaml")
    assert exp.sweep is not None and exp.sweep.num_samples == 1
    assert load_search_experiment(out / "searches" / "world_xa.yaml").name == "world_xa"
    commands = (out / "commands.sh").read_text()
    assert f"layerswap train {out}/experts/world_math_full.yaml --out runs/world-study" in commands
    assert f"layerswap search {out}/searches/world_xa.yaml --out runs/world_xa" in commands
    assert os.access(out / "commands.sh", os.X_OK)
    assert main(argv) == 2  # an export is not replaced without --overwrite
    assert "already exists" in capsys.readouterr().err
    (out / "commands.sh").write_text("edited\n")
    assert main([*argv, "--overwrite"]) == 0
    assert (out / "commands.sh").read_text() == commands


def test_searches_of_one_name_each_get_their_own_file(tmp_path):
    """Names a, a_2, a: three files and three run folders, none run twice."""
    loaded = load_study(EXAMPLES / "world_study.yaml")
    one = loaded.searches[0]
    named = [replace(one, experiment=one.experiment.model_copy(update={"name": n})) for n in ("a", "a_2", "a")]  # fmt: skip
    files = export_files(replace(loaded, searches=named), tmp_path)
    assert sorted(f for f in files if f.startswith("searches/")) == ["searches/a.yaml", "searches/a_2.yaml", "searches/a_3.yaml"]  # fmt: skip
    runs = [c.split(" --out ")[1].split()[0] for c in files["commands.sh"].splitlines() if c.startswith("layerswap search")]  # fmt: skip
    assert runs == ["runs/a", "runs/a_2", "runs/a_3"]


def test_exported_experts_name_their_local_inputs_absolutely(tiny_world, tmp_path, monkeypatch):
    """The red-team's case: an expert config kept `runs/world/base` as the study wrote it (while
    the searches' were absolute), so it trained only from the plan's own folder."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "world").symlink_to(tiny_world)
    monkeypatch.chdir(tmp_path)
    files = export_files(load_study(EXAMPLES / "world_study.yaml"), tmp_path / "exported")
    expert = yaml.safe_load(files["experts/world_math_full.yaml"])
    search = yaml.safe_load(files["searches/world_xa.yaml"])
    assert expert["base"] == search["base"] == str((tmp_path / "runs/world/base").resolve())
    paths = [ds["path"] for ds in expert["datasets"]]
    assert paths and all(Path(p).is_absolute() and Path(p).is_file() for p in paths), paths
    # an output stays as written: relative to the folder commands.sh runs from, as its --out are
    assert expert["storage_path"] == "runs/world-run/train"
