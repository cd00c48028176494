"""The sweep block: Table 4 defaults, validation, indicator tasks, define-by-run sampling.

Run: .venv/bin/python -m pytest -q tests/spaces/test_sweep_config.py
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from layerswap.spaces.sweep import TABLE4, Choice, Range, SweepConfig, indicator_tasks
from layerswap.spaces.train_experiment import parse_train_experiment


def _exp(sweep: dict | None = None, **kw) -> dict:
    data = {
        "name": "m",
        "base": "/nowhere/base",
        "kind": "math",
        "language": "en",
        "datasets": [{"path": "/nowhere/math.jsonl"}],
        "mode": "full",
        "hyper": {"lr": 1e-3, "max_steps": 4},
    }
    if sweep is not None:
        data["sweep"] = sweep
    data.update(kw)
    return data


def test_defaults_are_table4():
    cfg = SweepConfig()
    assert cfg.params == TABLE4
    assert cfg.params["hyper.lr"] == Range(low=2e-8, high=2e-7, log=True)
    assert cfg.params["hyper.batch_size"] == Choice(choices=[4, 8])
    assert cfg.params["hyper.warmup_steps"].choices == [300, 500, 1000]
    assert cfg.params["hyper.beta2"].choices == [0.99, 0.995, 0.999]
    assert (cfg.num_samples, cfg.top_k, cfg.checkpoints, cfg.backend) == (4, 3, "all", "proxy")
    assert (cfg.device, cfg.batch_size) == ("auto", 1)  # the GPU when there is one
    cfg = SweepConfig.model_validate({"device": "cuda", "batch_size": "auto"})
    assert (cfg.device, cfg.batch_size) == ("cuda", "auto")
    # Every default path is a field of a real experiment.
    exp = parse_train_experiment(_exp({}))
    assert exp.sweep.params == TABLE4


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"nmu_samples": 3}, "nmu_samples"),
        ({"params": {"hyper.lr": {"low": 1.0, "high": 0.1}}}, "low"),
        ({"params": {"hyper.lr": {"low": 0.0, "high": 0.1, "log": True}}}, "log"),
        ({"params": {"hyper.lr": {"choices": []}}}, "choices"),
        ({"params": {}}, "at least one"),
        ({"indicators": ["a"], "metric": "b"}, "metric"),
        ({"algorithm": "grid"}, "algorithm"),
        ({"device": "gpu"}, "device"),
        ({"batch_size": "big"}, "batch_size"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_invalid_blocks(bad, match):
    with pytest.raises(ValidationError, match=match):
        SweepConfig.model_validate(bad)


def test_shipped_examples_validate():
    from pathlib import Path

    from layerswap.spaces.train_experiment import load_train_experiment

    for path in sorted((Path(__file__).parents[2] / "spaces" / "examples").glob("*.yaml")):
        if path.stem.endswith(("_search", "_study")):  # merge searches and studies: not training
            continue
        exp = load_train_experiment(path)
        if exp.sweep is not None:
            exp.sweep.int_params(exp.model_dump(mode="json"))
            world = path.name.startswith("world_")
            assert exp.sweep.tasks_for(exp.kind, exp.language, world=world)


def test_experiment_rejects_unknown_param_path():
    with pytest.raises(ValueError, match=r"hyper\.learning_rate"):
        parse_train_experiment(
            _exp({"params": {"hyper.learning_rate": {"low": 1e-4, "high": 1e-3}}})
        )


def test_int_params_follow_the_experiment():
    exp = parse_train_experiment(
        _exp(
            {
                "params": {
                    "hyper.lr": {"low": 1e-4, "high": 1e-3, "log": True},
                    "hyper.warmup_steps": {"low": 0, "high": 10},
                    "hyper.beta2": {"low": 0.9, "high": 0.999},
                    "hyper.batch_size": {"choices": [4, 8]},
                }
            }
        )
    )
    assert exp.sweep.int_params(exp.model_dump(mode="json")) == {"hyper.warmup_steps"}
    bad = SweepConfig.model_validate({"params": {"hyper.warmup_steps": {"low": 0, "high": 2.5}}})
    with pytest.raises(ValueError, match="integer bounds"):
        bad.int_params(exp.model_dump(mode="json"))


class FakeTrial:
    def __init__(self):
        self.calls = []

    def suggest_float(self, name, low, high, log=False):
        self.calls.append(("float", name, low, high, log))
        return low

    def suggest_int(self, name, low, high, log=False):
        self.calls.append(("int", name, low, high, log))
        return low

    def suggest_categorical(self, name, choices):
        self.calls.append(("cat", name, tuple(choices)))
        return choices[0]


def test_suggest_define_by_run():
    cfg = SweepConfig.model_validate(
        {
            "params": {
                "hyper.lr": {"low": 1e-4, "high": 1e-3, "log": True},
                "hyper.warmup_steps": {"low": 0, "high": 10},
                "hyper.schedule": {"choices": ["linear", "wsd"]},
            }
        }
    )
    t = FakeTrial()
    cfg.suggest(t, {"hyper.warmup_steps"})
    assert t.calls == [
        ("float", "hyper.lr", 1e-4, 1e-3, True),
        ("int", "hyper.warmup_steps", 0, 10, False),
        ("cat", "hyper.schedule", ("linear", "wsd")),
    ]


def test_indicator_tasks():
    assert indicator_tasks("math", "xa", world=True) == ["world_mgsm_direct_en_dev"]
    assert indicator_tasks("language", "xb", world=True) == ["world_belebele_xb_dev"]
    assert indicator_tasks("math", "sw", world=False) == ["mgsm_direct_en"]
    assert indicator_tasks("language", "sw", world=False, global_mmlu=True) == [
        "belebele_swh_Latn",
        "global_mmlu_full_sw",
    ]
    assert indicator_tasks("language", "swh", world=False) == ["belebele_swh_Latn"]
    with pytest.raises(ValueError, match="zz"):
        indicator_tasks("language", "zz", world=False)
    with pytest.raises(ValueError, match="Global-MMLU"):
        indicator_tasks("language", "xa", world=True, global_mmlu=True)
    cfg = SweepConfig(indicators=["world_belebele_xa_dev", "world_mgsm_direct_en_dev"])
    assert cfg.metric_for("math", "en", world=True) == "world_belebele_xa_dev"
    cfg = SweepConfig(metric="world_belebele_en_dev")
    with pytest.raises(ValueError, match="not one of the indicators"):
        cfg.metric_for("math", "en", world=True)
