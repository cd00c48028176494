"""Study files and throughput profiles (spaces/study.py): validation names the file, entry and
field; paths follow the study file; overrides and sweeps are applied; the shipped profiles say
where every figure comes from, and the H100 one claims no measurement.

Run: .venv/bin/pytest -q tests/spaces/test_study.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from layerswap import spaces
from layerswap.spaces.study import Figure, load_profiles, load_study

EXAMPLES = Path(spaces.__file__).parent / "examples"
ROOT = Path(__file__).resolve().parents[2]


def _train_yaml(folder: Path, name: str = "toy", **extra) -> Path:
    (folder / "base").mkdir(exist_ok=True)
    (folder / "base" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "data.jsonl").write_text('{"question": "q", "answer": "a"}\n' * 4)
    exp = {
        "name": name,
        "base": "base",
        "kind": "math",
        "language": "en",
        "datasets": [{"path": "data.jsonl"}],
        "mode": "full",
        "hyper": {"lr": 1e-3, "max_steps": 10, "batch_size": 2},
        **extra,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def _study(folder: Path, data: dict) -> Path:
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_unknown_key_names_file_and_field(tmp_path):
    _train_yaml(tmp_path)
    path = _study(tmp_path, {"name": "s", "experts": [{"config": "toy.yaml", "bogus": 1}]})
    with pytest.raises(ValueError) as e:
        load_study(path)
    assert str(path) in str(e.value) and "experts.0.bogus" in str(e.value)


def test_an_empty_study_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least one of `experts` or `searches`"):
        load_study(_study(tmp_path, {"name": "s"}))


def test_every_bad_entry_is_listed_with_its_file(tmp_path):
    _train_yaml(tmp_path)
    path = _study(
        tmp_path,
        {
            "name": "s",
            "experts": [
                {"config": "missing.yaml"},
                {"config": "toy.yaml", "overrides": {"hyper.nope": 1}},
            ],
            "searches": [{"config": "nosearch.yaml"}],
        },
    )
    with pytest.raises(ValueError) as e:
        load_study(path)
    msg = str(e.value)
    assert "experts[0] (missing.yaml)" in msg and "missing.yaml: cannot read" in msg
    assert "experts[1] (toy.yaml)" in msg and "hyper.nope" in msg
    assert "searches[0] (nosearch.yaml)" in msg


def test_overrides_and_sweep_are_applied_relative_to_the_study(tmp_path):
    sub = tmp_path / "configs"
    sub.mkdir()
    _train_yaml(sub)
    (tmp_path / "other.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    path = _study(
        tmp_path,
        {
            "name": "s",
            "experts": [
                {
                    "config": "configs/toy.yaml",
                    "overrides": {
                        "name": "renamed",
                        "language": "xa",
                        "datasets": [{"path": "other.jsonl"}],
                    },
                    "sweep": {"num_samples": 2, "params": {"hyper.lr": {"choices": [1e-3]}}},
                    "rows": 7,
                }
            ],
        },
    )
    ex = load_study(path).experts[0]
    assert ex.config == tmp_path / "configs" / "toy.yaml"
    assert ex.experiment.name == "renamed" and ex.experiment.language == "xa"
    assert ex.experiment.datasets[0].path == str((tmp_path / "other.jsonl").resolve())
    assert ex.experiment.base == str((sub / "base").resolve())  # the config's own path rule
    assert ex.experiment.sweep.num_samples == 2 and ex.rows == 7


def test_sweep_on_a_config_that_has_one_is_refused(tmp_path):
    _train_yaml(tmp_path, sweep={"num_samples": 2, "params": {"hyper.lr": {"choices": [1e-3]}}})
    path = _study(
        tmp_path, {"name": "s", "experts": [{"config": "toy.yaml", "sweep": {"num_samples": 3}}]}
    )
    with pytest.raises(ValueError, match=r"experts\[0\] \(toy.yaml\): sweep: toy.yaml already has"):
        load_study(path)


def test_two_experts_of_one_name_are_refused(tmp_path):
    _train_yaml(tmp_path)
    path = _study(tmp_path, {"name": "s", "experts": [{"config": "toy.yaml"}] * 2})
    with pytest.raises(ValueError, match=r"experts\[1\].*'toy' is also experts\[0\]"):
        load_study(path)


def test_search_entry_is_a_file_or_inline_not_both(tmp_path):
    path = _study(
        tmp_path,
        {"name": "s", "searches": [{"config": "a.yaml", "experiment": {"language": "xa"}}]},
    )
    with pytest.raises(ValueError, match="exactly one of `config`"):
        load_study(path)


def test_inline_search_is_validated_with_its_place(tmp_path):
    path = _study(tmp_path, {"name": "s", "searches": [{"experiment": {"language": "xa"}}]})
    with pytest.raises(ValueError, match=r"searches\[0\] \(inline\)"):
        load_study(path)


def test_figure_needs_exactly_one_provenance():
    with pytest.raises(ValueError, match="exactly one of `measured`"):
        Figure(value=1.0, unit="s")
    measured = {
        "benchmark": "b",
        "command": "c",
        "date": "d",
        "device": "x",
        "shape": "s",
        "result": "r",
        "derivation": "v",
    }
    with pytest.raises(ValueError, match="exactly one of `measured`"):
        Figure(value=1.0, unit="s", assumed="why", measured=measured)


def test_shipped_profiles_say_where_each_figure_comes_from():
    profiles = load_profiles()
    assert {"h100", "cpu"} <= set(profiles)
    # Nothing has been measured on a GPU by layerswap: the H100 profile must not claim it.
    assert all(f.measured is None and f.assumed for f in profiles["h100"].figures().values())
    cpu = profiles["cpu"].figures()
    for name in ("train_flops_per_s", "run_startup_s"):
        m = cpu[name].measured
        assert m is not None and (ROOT / m.benchmark).is_file() and m.benchmark in m.command
    assert all(f.assumed for f in cpu.values() if f.measured is None)


def test_profile_file_errors_name_the_field(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text(yaml.safe_dump({"profiles": {"x": {"kind": "tpu"}}}))
    with pytest.raises(ValueError) as e:
        load_profiles(bad)
    assert str(bad) in str(e.value) and "profiles.x.kind" in str(e.value)


def test_shipped_studies_load():
    real = load_study(EXAMPLES / "real_study.yaml")
    names = sorted(e.experiment.name for e in real.experts)
    assert len(names) == 8 and "llama31_8b_ben_lora" in names and "llama31_8b_tel_lora" in names
    assert {e.experiment.language for e in real.experts} == {"en", "swh", "ben", "tel"}
    assert all(e.experiment.sweep is not None for e in real.experts)
    assert [s.experiment.language for s in real.searches] == ["swh", "ben", "tel"]
    world = load_study(EXAMPLES / "world_study.yaml")
    assert world.study.profile == "cpu" and world.searches[0].experiment.world is not None


FAMILIES = {
    "llama31_8b": "meta-llama/Llama-3.1-8B-Instruct",
    "qwen25_7b": "Qwen/Qwen2.5-7B-Instruct",
    "aya_expanse_8b": "CohereForAI/aya-expanse-8b",
    "falcon3_7b": "tiiuae/Falcon3-7B-Instruct",
}


def test_followup_study_holds_the_whole_grid_on_the_papers_budgets():
    """real_followup_study.yaml: 4 models x (math + 3 languages) and 12 searches, every shipped
    full expert and search config, each entry on real_study.yaml's budgets for its kind, each
    search reading its own model's registry."""
    grid = load_study(EXAMPLES / "real_followup_study.yaml")
    pairs = {(e.experiment.base, e.experiment.language) for e in grid.experts}
    assert len(grid.experts) == 16
    assert pairs == {(b, lang) for b in FAMILIES.values() for lang in ("en", "swh", "ben", "tel")}
    full = {p.name for p in EXAMPLES.glob("real_*_full.yaml")}
    assert {e.config for e in grid.study.experts} == full
    assert {s.config for s in grid.study.searches} == {p.name for p in EXAMPLES.glob("real_*_search.yaml")}  # fmt: skip
    # The budgets: real_study.yaml's Llama entry of the same kind, everything but the config.
    papers = {e.config: e for e in load_study(EXAMPLES / "real_study.yaml").study.experts}
    for entry in grid.study.experts:
        kind = "math" if "_math_" in entry.config else "sw"
        same = papers[f"real_llama31_8b_{kind}_full.yaml"]
        assert entry.model_dump(exclude={"config"}) == same.model_dump(exclude={"config"}), entry.config  # fmt: skip
    for s in grid.searches:
        family = next(f for f in FAMILIES if s.config.name.startswith(f"real_{f}_"))
        assert s.experiment.base == FAMILIES[family]
        assert s.experiment.experts.registry == f"runs/{family}/experts/registry.parquet"
