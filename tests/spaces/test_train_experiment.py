"""TrainExperiment configs: the shipped examples validate (real ones without downloading), errors
name the file and field, modes/datasets/scaling constraints hold.

Run: .venv/bin/python -m pytest tests/spaces/test_train_experiment.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from layerswap import spaces
from layerswap.spaces.train_experiment import (
    load_train_experiment,
    parse_train_experiment,
    with_overrides,
)
from layerswap.spaces.train_modes import MODE_NAMES, PartitionSpec, partition_spec

EXAMPLES = Path(spaces.__file__).parent / "examples"


def _base(**over) -> dict:
    cfg = {
        "name": "x",
        "base": "some/model",
        "kind": "math",
        "language": "en",
        "datasets": [{"path": "a.jsonl"}],
        "mode": "full",
        "hyper": {"lr": 1e-4, "max_steps": 10},
    }
    return cfg | over


def test_every_example_validates():
    # *_search.yaml are merge-search experiments (tests/spaces/test_real_search_configs.py),
    # *_study.yaml whole studies (tests/spaces/test_study.py).
    files = sorted(f for f in EXAMPLES.glob("*.yaml") if not f.stem.endswith(("_search", "_study")))  # fmt: skip
    names = {f.stem for f in files}
    assert {"world_math_full", "world_lang_xa_full", "world_math_lora", "world_lang_xa_lora"} <= names  # fmt: skip
    assert {"real_llama31_8b_sw_full", "real_llama31_8b_sw_lora"} <= names
    modes = set()
    for f in files:
        exp = load_train_experiment(f)
        modes.add(exp.mode.type)
    assert modes == set(MODE_NAMES)


@pytest.mark.parametrize("lang", ["sw", "bn", "te"])
def test_real_llama_configs_match_the_papers_setting(lang):
    exp = load_train_experiment(EXAMPLES / f"real_llama31_8b_{lang}_full.yaml")
    assert exp.base == "meta-llama/Llama-3.1-8B-Instruct"
    assert exp.kind == "language" and exp.language == {"sw": "swh", "bn": "ben", "te": "tel"}[lang]
    h = exp.hyper
    # ICLR 2025 Table 4 ranges: lr 2e-8..2e-7, batch 4-8, WSD/linear, beta2 0.99-0.999
    assert 1e-8 <= h.lr <= 3e-7 and h.batch_size in (4, 8) and h.beta2 in (0.99, 0.995, 0.999)
    assert h.schedule == "wsd" and exp.checkpoint_every_samples == 5000
    assert exp.scaling.use_gpu and exp.datasets[0].source == "aya"
    lora = load_train_experiment(EXAMPLES / "real_llama31_8b_sw_lora.yaml")
    assert lora.mode.type == "lora" and lora.mode.rslora and len(lora.mode.target_modules) == 7
    math = load_train_experiment(EXAMPLES / "real_llama31_8b_math_full.yaml")
    assert math.kind == "math" and math.datasets[0].source == "orca_math"


@pytest.mark.parametrize(
    ("model", "base"),
    [
        ("qwen25_7b", "Qwen/Qwen2.5-7B-Instruct"),
        ("aya_expanse_8b", "CohereForAI/aya-expanse-8b"),
        ("falcon3_7b", "tiiuae/Falcon3-7B-Instruct"),
    ],
)
def test_the_other_models_configs_mirror_the_llama_ones(model, base):
    """The follow-up paper's other three models: the Llama files' settings on another base (the
    paper gives no per-model hyperparameters, and the files say so)."""
    for kind in ("math", "sw", "bn", "te"):
        path = EXAMPLES / f"real_{model}_{kind}_full.yaml"
        exp = load_train_experiment(path)
        llama = load_train_experiment(EXAMPLES / f"real_llama31_8b_{kind}_full.yaml")
        assert exp.base == base and exp.name.startswith(f"{model}_")
        assert exp.model_dump(exclude={"name", "base"}) == llama.model_dump(exclude={"name", "base"})  # fmt: skip
        assert "no per-model hyperparameters" in path.read_text()


def test_errors_name_file_and_field(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(_base(hyper={"lr": 1e-4, "max_steps": 10, "lrr": 1})))
    with pytest.raises(ValueError, match=r"bad\.yaml.*\n.*hyper\.lrr"):
        load_train_experiment(f)
    with pytest.raises(ValueError, match="cannot read"):
        load_train_experiment(tmp_path / "missing.yaml")
    f.write_text("name: [unclosed")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_train_experiment(f)


@pytest.mark.parametrize(
    "over, msg",
    [
        ({"mode": "simultaneous"}, "partition"),
        ({"mode": {"type": "simultaneous", "partition": "A"}}, "needs exactly 2 datasets"),
        ({"mode": "mix"}, "needs exactly 2 datasets"),
        ({"datasets": [{"path": "a"}, {"path": "b"}]}, "takes 1 dataset"),
        ({"mode": "sgd"}, "mode"),
        ({"hyper": {"lr": 1e-4}}, "exactly one of max_steps or epochs"),
        (
            {"hyper": {"lr": 1e-4, "max_steps": 1, "batch_size": 5}, "scaling": {"num_workers": 2}},
            "divisible",
        ),
        ({"datasets": [{"path": "a", "source": "aya"}]}, "exactly one of"),
        ({"sweep": {"params": {"hyper.nope": {"low": 1, "high": 2}}}}, "hyper.nope"),
        ({"sweep": {"params": {"hyper.lr": {"low": 2, "high": 1}}}}, "low"),
        ({"debug": {"fail_at_step": 3}}, "fail_marker"),
        ({"mode": {"type": "partial", "partition": "D", "train": "task"}}, "partition"),
        (
            {
                "mode": {
                    "type": "partial",
                    "partition": {
                        "bottom": 1,
                        "top": 1,
                        "mlp": {"bottom": 1, "top": 0, "bottom_transition": 1},
                    },
                    "train": "task",
                }
            },
            "transition",
        ),
        (
            {
                "mode": {"type": "simultaneous", "partition": "A", "sides": ["task", "task"]},
                "datasets": [{"path": "a"}, {"path": "b"}],
            },
            "different sides",
        ),
        ({"name": "has space"}, "name"),
    ],
)
def test_invalid(over, msg):
    with pytest.raises(ValueError, match=msg):
        parse_train_experiment(_base(**over))


def test_language_on_a_path_is_refused_pointing_to_a_source(tmp_path):
    # A `path` is read whole: `language` there filtered nothing, so a multilingual Aya export
    # trained every language while the expert was registered under the one named.
    cfg = tmp_path / "exp.yaml"
    data = _base(kind="language", language="swh", datasets=[{"path": "aya.jsonl", "language": "swh"}])  # fmt: skip
    cfg.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError) as e:
        load_train_experiment(cfg)
    msg = str(e.value)
    assert str(cfg) in msg and "datasets.0" in msg and "language: swh" in msg
    assert "source: aya" in msg and "data_files: [aya.jsonl]" in msg
    # what the message points to is accepted: the source filters its rows by language
    fixed = _base(kind="language", language="swh", datasets=[{"source": "aya", "data_files": ["aya.jsonl"], "language": "swh"}])  # fmt: skip
    assert parse_train_experiment(fixed).datasets[0].language == "swh"


def test_modes_and_overrides():
    exp = parse_train_experiment(_base(mode={"type": "lora", "rank": 8}))
    assert exp.is_lora and exp.mode.alpha == 32 and exp.mode.rslora
    exp2 = with_overrides(exp, {"hyper.lr": 3e-4, "mode.rank": 4})
    assert exp2.hyper.lr == 3e-4 and exp2.mode.rank == 4 and exp.hyper.lr == 1e-4
    with pytest.raises(ValueError, match="no field"):
        with_overrides(exp, {"hyper.nope": 1})
    part = parse_train_experiment(_base(mode={"type": "partial", "partition": "A", "train": "language", "lora": {"rank": 4}}))  # fmt: skip
    assert part.is_lora and partition_spec(part.mode.partition).attention == "language"
    assert partition_spec("B") == PartitionSpec(bottom=8, top=4)
    s = parse_train_experiment(_base(sweep={"num_samples": 4, "params": {"hyper.lr": {"low": 1e-5, "high": 1e-3, "log": True}, "hyper.weight_decay": {"choices": [0.0, 0.1]}}}))  # fmt: skip
    assert s.sweep.num_samples == 4 and s.sweep.params["hyper.lr"].log


def test_relative_paths_resolve_against_the_file(tmp_path):
    (tmp_path / "data.jsonl").write_text("{}\n")
    (tmp_path / "base").mkdir()
    f = tmp_path / "e.yaml"
    f.write_text(yaml.safe_dump(_base(base="base", datasets=[{"path": "data.jsonl"}])))
    exp = load_train_experiment(f)
    assert exp.base == str(tmp_path / "base") and exp.datasets[0].path == str(tmp_path / "data.jsonl")  # fmt: skip


def test_absolute_local_paths(tmp_path):
    from layerswap.spaces.train_experiment import absolute_local_paths

    (tmp_path / "runs/world/base").mkdir(parents=True)
    (tmp_path / "runs/world/d.jsonl").write_text("{}\n")
    exp = parse_train_experiment(_base(base="runs/world/base", datasets=[{"path": "runs/world/d.jsonl"}], storage_path="out"))  # fmt: skip
    fixed = absolute_local_paths(exp, cwd=tmp_path)
    assert fixed.base == str(tmp_path / "runs/world/base")
    assert fixed.datasets[0].path == str(tmp_path / "runs/world/d.jsonl")
    assert fixed.storage_path == str(tmp_path / "out")
    hub = parse_train_experiment(
        _base(base="meta-llama/Llama-3.1-8B-Instruct", storage_path="s3://b/x")
    )
    assert absolute_local_paths(hub, cwd=tmp_path).base == "meta-llama/Llama-3.1-8B-Instruct"
    assert absolute_local_paths(hub, cwd=tmp_path).storage_path == "s3://b/x"


def test_the_old_search_key_says_it_is_now_sweep(tmp_path):
    """`search:` was the expert sweep's key; an old file gets the new name, not 'extra field'."""
    old = _base(search={"num_samples": 2})
    with pytest.raises(ValueError, match=r"search: the expert-sweep block is now called `sweep:`") as e:  # fmt: skip
        parse_train_experiment(old, source="old.yaml")
    assert "old.yaml" in str(e.value) and "Extra inputs" not in str(e.value)
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    with pytest.raises(
        ValueError, match=rf"(?s){path}: invalid experiment.*rename the key `search:` to `sweep:`"
    ):
        load_train_experiment(path)
    assert parse_train_experiment(_base(sweep={"num_samples": 2})).sweep.num_samples == 2


def test_gpu_workers_reserve_several_cpus_unless_told():
    from layerswap.spaces.train_settings import GPU_WORKER_CPUS, Scaling

    assert Scaling().cpus_per_worker == 1.0
    assert Scaling(use_gpu=True).cpus_per_worker == GPU_WORKER_CPUS == 8.0
    assert Scaling(use_gpu=True, cpus_per_worker=2).cpus_per_worker == 2.0
