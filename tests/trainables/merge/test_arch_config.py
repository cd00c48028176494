"""Experts whose configs differ in what their layers compute are refused before a merge; configs
that differ only in how they were saved (transformers 4 vs 5 spelling, omitted defaults, dtype,
version) still merge. arch.CONFIG_DEFAULTS is checked against transformers' own config classes.

Run: .venv/bin/python -m pytest -q tests/trainables/merge/test_arch_config.py
"""

from __future__ import annotations

import json
import shutil

import pytest
import transformers
from merge_expect import merge, swap_fields
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from layerswap.trainables.merge.arch import SUPPORTED_MODEL_TYPES, arch_differences, arch_view
from layerswap.trainables.train import model_shape

SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
)
# Llama 3 and 3.1 8B as their Hub config.json spell them (transformers 4): same shapes, other RoPE.
LLAMA3 = {"model_type": "llama", "rope_theta": 500000.0, "rope_scaling": None, "max_position_embeddings": 8192}  # fmt: skip
LLAMA31_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
LLAMA31 = LLAMA3 | {"rope_scaling": LLAMA31_SCALING, "max_position_embeddings": 131072}


def _loaded(raw: dict) -> dict:
    """`raw` as transformers loads it and save_pretrained would write it (every field filled)."""
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    return CONFIG_MAPPING[raw["model_type"]](**fields).to_dict()


@pytest.mark.parametrize("mtype", SUPPORTED_MODEL_TYPES)
def test_defaults_table_matches_transformers(mtype):
    raw = {"model_type": mtype, **SMALL}
    assert arch_differences(raw, _loaded(raw)) == []


@pytest.mark.parametrize(
    "raw",
    [
        LLAMA3 | SMALL,
        LLAMA31 | SMALL,
        {"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 4, **SMALL},
        {"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}, **SMALL},
        *(
            dict(getattr(model_shape, n))
            for n in ("_LLAMA31_8B", "_QWEN25_7B", "_AYA_EXPANSE_8B", "_FALCON3_7B")
        ),
    ],
    ids=[
        "llama3",
        "llama3.1",
        "qwen2-window",
        "legacy-type",
        "llama3.1-8b",
        "qwen2.5",
        "aya",
        "falcon3",
    ],
)
def test_a_config_equals_itself_as_transformers_loads_it(raw):
    assert arch_differences(raw, _loaded(raw)) == []


def test_llama3_and_llama31_differ_in_rope():
    diffs = {f for f, _, _ in arch_differences(LLAMA3 | SMALL, LLAMA31 | SMALL)}
    assert {
        "rope_parameters.rope_type",
        "rope_parameters.factor",
        "max_position_embeddings",
    } <= diffs


def _expert_with_config(family, tmp_path, edit) -> str:
    """A copy of the family's language expert whose config.json is `edit(config)`."""
    dst = tmp_path / "language"
    shutil.copytree(family.paths["language"], dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(edit(cfg)))
    return str(dst)


def _llama31(cfg: dict) -> dict:
    """The expert as a Llama 3.1 would spell it in transformers 4: top-level rope_theta plus
    llama3 rope_scaling (the task expert stays a plain-RoPE Llama 3 in transformers 5 form)."""
    return _as_transformers4_saved_it(cfg) | {"rope_scaling": LLAMA31_SCALING}


@pytest.mark.parametrize(
    ("edit", "field", "lang_value"),
    [
        (lambda c: c | {"hidden_act": "gelu"}, "hidden_act", "'gelu'"),
        (lambda c: c | {"rms_norm_eps": 1e-2}, "rms_norm_eps", "0.01"),
        (
            lambda c: c | {"rope_parameters": {"rope_theta": 1e6}},
            "rope_parameters.rope_theta",
            "1000000.0",
        ),
        (_llama31, "rope_parameters.factor", "8.0"),
        (lambda c: c | {"max_position_embeddings": 4096}, "max_position_embeddings", "4096"),
    ],
    ids=["hidden_act", "rms_norm_eps", "rope_theta", "llama3.1-rope-scaling", "max_positions"],
)
def test_experts_that_compute_differently_are_refused(
    family, tmp_path, nothing_written, edit, field, lang_value
):
    lang = _expert_with_config(family, tmp_path, edit)
    task = json.loads((family.paths["task"] / "config.json").read_text())
    task_value = arch_view(task)[field] if "." not in field else arch_view(task)["rope_parameters"].get(field.split(".")[1])  # fmt: skip
    out = tmp_path / "out"
    with pytest.raises(ValueError) as e:
        merge(swap_fields(family, language_expert=lang, bottom=3, top=2), out)
    msg = str(e.value)
    want = f"config.json field {field!r} is {task_value!r} in {family.paths['task']} but {lang_value} in {lang}"  # fmt: skip
    assert want in msg and "\n" not in msg, msg
    nothing_written(out)


def _as_transformers4_saved_it(cfg: dict) -> dict:
    """The same model as a transformers 4 config.json: rope_theta at the top, defaults left out
    (tie_word_embeddings, mlp_bias, head_dim), torch_dtype, another version and use_cache."""
    cfg = dict(cfg)
    theta = cfg.pop("rope_parameters")["rope_theta"]
    for k in ("tie_word_embeddings", "mlp_bias", "head_dim", "dtype"):
        cfg.pop(k, None)
    return cfg | {
        "rope_theta": theta,
        "rope_scaling": None,
        "torch_dtype": "float32",
        "transformers_version": "4.44.2",
        "use_cache": False,
        "_name_or_path": "someone/else",
    }


def test_the_same_architecture_saved_another_way_merges(family, tmp_path):
    lang = _expert_with_config(family, tmp_path, _as_transformers4_saved_it)
    out = tmp_path / "out"
    assert merge(swap_fields(family, language_expert=lang, bottom=3, top=2), out)
    # and transformers builds the same model from both spellings, so accepting them is right
    built = [transformers.AutoConfig.from_pretrained(p) for p in (family.paths["task"], lang)]
    assert arch_differences(built[0].to_dict(), built[1].to_dict()) == []
