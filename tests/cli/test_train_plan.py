"""`layerswap train EXP.yaml --plan`: the memory plan of every shipped real config, offline, with
no training, no weights and no Ray; the shipped 7-8B configs (the follow-up paper's four models)
fit their H100s.

Run: .venv/bin/python -m pytest tests/cli/test_train_plan.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from layerswap import spaces
from layerswap.cli import main

EXAMPLES = Path(spaces.__file__).parent / "examples"
REAL = sorted(EXAMPLES.glob("real_*_full.yaml")) + sorted(EXAMPLES.glob("real_*_lora.yaml"))
# Config file prefix -> (base, its parameter count as the plan prints it: the published
# checkpoints' counts, built from load_model_config's built-in copies offline).
MODELS = {
    "llama31_8b": ("meta-llama/Llama-3.1-8B-Instruct", "8,030,261,248"),
    "qwen25_7b": ("Qwen/Qwen2.5-7B-Instruct", "7,615,616,512"),
    "aya_expanse_8b": ("CohereForAI/aya-expanse-8b", "8,028,033,024"),
    "falcon3_7b": ("tiiuae/Falcon3-7B-Instruct", "7,455,550,464"),
}


def _model(path: Path) -> str:
    return next(m for m in MODELS if path.stem.startswith(f"real_{m}_"))


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from layerswap.trainables import train

    def no_training(*a, **k):
        raise AssertionError("--plan must not train")

    monkeypatch.setattr(train, "train_expert", no_training)


def test_every_real_config_is_planned():
    # Every model: math, sw, bn, te full (the follow-up paper's grid); Llama also math, sw lora.
    assert len(REAL) == 18
    assert sorted(_model(p) for p in REAL) == sorted(["llama31_8b"] * 6 + [m for m in MODELS if m != "llama31_8b"] * 4)  # fmt: skip


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem)
def test_real_config_plan_fits(path, capsys):
    assert main(["train", str(path), "--plan"]) == 0
    out = capsys.readouterr().out
    base, params = MODELS[_model(path)]
    assert out.startswith(f"memory plan: {_model(path)}_")
    assert base in out and params in out
    assert "FITS on H100" in out and "DOES NOT FIT" not in out
    if path.stem.endswith("_full"):
        assert "fsdp over" in out and "precision bf16-mixed" in out


def test_plan_that_does_not_fit_still_exits_0(capsys):
    assert main(["train", str(REAL[0]), "--plan", "--gpu-memory", "10"]) == 0
    assert "DOES NOT FIT on --gpu-memory (10.0 GiB)" in capsys.readouterr().out


def test_plan_starts_no_ray_and_reads_no_weights():
    code = (
        "import sys; from layerswap.cli import main; rc = main(sys.argv[1:]); "
        "print('RAY', 'ray' in sys.modules, 'RC', rc)"
    )
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    res = subprocess.run(
        [sys.executable, "-c", code, "train", str(REAL[0]), "--plan"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "RAY False RC 0" in res.stdout and "FITS on H100" in res.stdout


def test_plan_of_a_missing_local_base_exits_2(tmp_path, capsys):
    data = yaml.safe_load(REAL[0].read_text()) | {"base": str(tmp_path / "no_model")}
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(data))
    assert main(["train", str(f), "--plan"]) == 2
    assert f"base: {tmp_path / 'no_model'} is not a model folder" in capsys.readouterr().err
