"""`layerswap train` refuses a Hub training source (`source: orca_math`) that is not in the local
datasets cache while downloads are off, before the run folder or Ray: the workers found it a
minute in, with datasets' bare ConnectionError. An expert sweep is checked under the offline
default its trials get, also when the user set no HF_* variable. Online, nothing is read.

Run: .venv/bin/python -m pytest -q tests/cli/test_train_hub_sources.py
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import datasets.config
import huggingface_hub.constants as hub_constants
import pytest
import yaml

from layerswap.cli import main
from layerswap.cli import train_inputs as cli_train
from layerswap.spaces.train_experiment import load_train_experiment
from layerswap.trainables import prefetch
from tests.trainables.train.train_helpers import make_exp

SWEEP = {"num_samples": 2, "params": {"hyper.lr": {"low": 1e-4, "high": 1e-2, "log": True}}}


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """Empty Hub and datasets caches (the session's may hold anything)."""
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", Path(tmp_path / "datasets"))


def _exp_file(tmp_path: Path, world: Path, **kw) -> Path:
    exp = make_exp(world, "full", name="hub", **kw).model_dump(mode="json")
    exp["datasets"] = [{"source": "orca_math"}]
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(exp))
    return f


def test_an_uncached_hub_source_offline_is_refused_at_the_edge(tiny_world, tmp_path, empty_cache, monkeypatch, capsys):  # fmt: skip
    # the tests run with HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 (tests/conftest.py)
    run, f = tmp_path / "run", _exp_file(tmp_path, tiny_world)
    assert main(["train", str(f), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "datasets[0].source" in ln)
    assert "orca_math is not in the local Hugging Face datasets cache" in line
    assert "`layerswap prefetch CONFIG`" in line and "HF_HUB_OFFLINE=0" in line
    assert "Traceback" not in err and not run.exists()
    # online, nothing is read at the edge (the trainer downloads it)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    monkeypatch.setattr(prefetch, "load_sft", lambda *a, **k: pytest.fail("read at the edge"))
    cli_train.check_inputs(load_train_experiment(f))  # no ValueError


def test_a_sweep_checks_its_sources_under_its_offline_default(tiny_world, tmp_path, empty_cache, monkeypatch, capsys):  # fmt: skip
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # no HF_* set, as on a cluster
        monkeypatch.setenv(var, "x")  # recorded, so the sweep's offline default is undone after
        monkeypatch.delenv(var)
    started = []
    fake = types.ModuleType("layerswap.experts.sweep")
    fake.start_sweep_ray = lambda exp, verbose=0: started.append(exp.name)
    fake.run_sweep = lambda *a, **k: pytest.fail("the sweep ran")
    monkeypatch.setitem(sys.modules, "layerswap.experts.sweep", fake)
    f = _exp_file(tmp_path, tiny_world, sweep=SWEEP)
    assert main(["train", str(f), "--out", str(tmp_path / "run")]) == 2
    assert "`layerswap prefetch CONFIG`" in capsys.readouterr().err
    assert started == [] and not (tmp_path / "run").exists()
