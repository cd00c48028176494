"""Parameter-name mapping on the real module names of each supported HF decoder family."""

from __future__ import annotations

import re

import pytest
import torch
import transformers

from layerswap.trainables.merge.arch import (
    NON_LAYER,
    ArchitectureError,
    check_model_type,
    param_slot,
)

SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {"use_qk_norm": False}),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_parameter_of_a_family_is_placed(family):
    cfg_cls, model_cls, extra = FAMILIES[family]
    config = getattr(transformers, cfg_cls)(**SMALL, **extra)
    check_model_type(config.to_dict(), family)
    torch.manual_seed(0)
    names = list(getattr(transformers, model_cls)(config).state_dict())
    slots = {n: param_slot(n) for n in names}
    layers = {s.layer for s in slots.values() if s.layer is not None}
    assert layers == {0, 1, 2}
    for i in range(3):
        comps = {s.component for n, s in slots.items() if s.layer == i}
        assert comps == {"attention", "mlp"}, (family, i, comps)
    non_layer = sorted(n for n, s in slots.items() if s is NON_LAYER)
    assert "model.embed_tokens.weight" in non_layer
    assert "model.norm.weight" in non_layer
    if "lm_head.weight" in names:  # state_dict lists it even when tied (Cohere's default)
        assert slots["lm_head.weight"] is NON_LAYER


@pytest.mark.parametrize(
    ("name", "layer", "component"),
    [
        ("model.layers.7.self_attn.q_proj.weight", 7, "attention"),
        ("model.layers.7.self_attn.q_proj.bias", 7, "attention"),  # Qwen2 biases
        ("model.layers.0.input_layernorm.weight", 0, "attention"),
        ("model.layers.0.post_attention_layernorm.weight", 0, "mlp"),
        ("model.layers.12.mlp.down_proj.weight", 12, "mlp"),
        ("base_model.model.model.layers.3.self_attn.v_proj.lora_A.weight", 3, "attention"),
        ("base_model.model.model.layers.3.mlp.up_proj.lora_B.weight", 3, "mlp"),
        ("lm_head.weight", None, None),
        ("model.embed_tokens.weight", None, None),
        ("model.norm.weight", None, None),
    ],
)
def test_param_slot(name, layer, component):
    slot = param_slot(name)
    assert (slot.layer, slot.component) == (layer, component)


def test_unknown_layer_parameter_is_an_error():
    with pytest.raises(ArchitectureError, match=re.escape("model.layers.2.router.weight")):
        param_slot("model.layers.2.router.weight")


def test_unsupported_model_type_named():
    with pytest.raises(ArchitectureError, match="'gpt2'"):
        check_model_type({"model_type": "gpt2"}, "x/config.json")
