"""search/preflight_device.py: a pool too large for the CPU its trials or promotion would run on is
refused by the search preflight, before Ray starts, with check_cpu_size's line.

The world's models are tiny, so the tests lower trainables.devices.LARGE_ON_CPU to 1000 parameters
(as the red-team's sitecustomize did). Run:
.venv/bin/python -m pytest -q tests/search/test_preflight_device.py
"""

from __future__ import annotations

import pytest
import yaml
from search_fixtures import experiment, make_experts

from layerswap.cli import main
from layerswap.search.preflight_device import cpu_size_problems
from layerswap.trainables import devices


@pytest.fixture(scope="module")
def paths(tiny_world, tmp_path_factory):
    return make_experts(tiny_world, tmp_path_factory.mktemp("size_experts"))


@pytest.fixture
def large(monkeypatch):
    """Every world model counts as large; the CPU is not allowed."""
    monkeypatch.setattr(devices, "LARGE_ON_CPU", 1000)
    monkeypatch.delenv(devices.ALLOW_CPU, raising=False)


def test_trials_and_promotion_on_the_cpu_are_each_refused(tiny_world, paths, large, monkeypatch):
    exp = experiment(tiny_world, paths, search={"gpus_per_trial": 0})
    problems = cpu_size_problems(exp, "cpu")
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"search.gpus_per_trial 0: each search trial of {paths['task']}: a ")  # fmt: skip
    assert problems[1].startswith(f"promote.device auto (cpu here): promotion of {paths['task']}: a ")  # fmt: skip
    assert all("LAYERSWAP_ALLOW_CPU=1" in p for p in problems)
    # On GPUs (trials given one, promotion on cuda) or with no promotion: nothing to refuse.
    on_gpus = experiment(tiny_world, paths, search={"gpus_per_trial": 0.5})
    assert cpu_size_problems(on_gpus, "cuda") == []
    assert cpu_size_problems(on_gpus, None) == []
    assert len(cpu_size_problems(exp, None)) == 1  # --no-promote: the trials alone
    monkeypatch.setenv(devices.ALLOW_CPU, "1")  # the opt-in, read where the rule is
    assert cpu_size_problems(exp, "cpu") == []


def test_a_small_pool_and_an_unreadable_config_pass_to_the_other_checks(tiny_world, paths, tmp_path, monkeypatch):  # fmt: skip
    monkeypatch.delenv(devices.ALLOW_CPU, raising=False)
    exp = experiment(tiny_world, paths, search={"gpus_per_trial": 0})
    assert cpu_size_problems(exp, "cpu") == []  # the world's models are under the real 1 B
    monkeypatch.setattr(devices, "LARGE_ON_CPU", 1000)
    gone = dict(paths, task=tmp_path / "missing", base=tmp_path / "missing_base")
    assert cpu_size_problems(experiment(tiny_world, gone), "cpu") == []  # preflight names them


def test_search_exits_2_before_ray_when_promotion_would_run_a_large_model_on_the_cpu(
    tiny_world, paths, large, tmp_path, monkeypatch, capsys
):
    """The red-team's 8B search with promote.device auto on a CPU-only driver: every trial ran
    (hours at 8B), then promotion exited 2. Now the command exits 2 before any trial."""
    from layerswap.search import search as search_mod

    def run_search(*a, **kw):
        raise AssertionError("the search started")

    monkeypatch.setattr(search_mod, "run_search", run_search)
    f = tmp_path / "search.yaml"
    exp = experiment(tiny_world, paths, search={"gpus_per_trial": 1})
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json")))
    assert main(["search", str(f), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "promote.device auto (cpu here): promotion of" in err
    assert "would run on the CPU" in err and "LAYERSWAP_ALLOW_CPU=1" in err
    assert "gpus_per_trial" not in err  # trials given a GPU are not refused here
    assert not (tmp_path / "run").exists()
