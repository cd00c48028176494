"""Parameter name -> (transformer layer, component) for the HF decoder families the papers use.

Covers Llama (and Falcon3, which is llama-arch), Qwen2/Qwen3, Mistral and Cohere/Aya, full
checkpoints and PEFT adapters alike (`base_model.model.` prefixes are fine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "cohere", "cohere2")

# `model.layers.{i}.` anywhere in the name (PEFT prefixes it with `base_model.model.`).
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")

# Why these: a layer's norms travel with the block they feed (docs/method.md). Cohere's parallel
# block has one input_layernorm feeding both attention and MLP; it travels with attention.
_ATTENTION_PREFIXES = ("self_attn.", "attention.", "input_layernorm.")
_MLP_PREFIXES = (
    "mlp.",
    "feed_forward.",
    "post_attention_layernorm.",
    "pre_feedforward_layernorm.",
    "post_feedforward_layernorm.",
)


class ArchitectureError(ValueError):
    """A parameter or config this merge cannot place."""


@dataclass(frozen=True)
class ParamSlot:
    """Where a parameter lives: a layer and component, or outside the layers (layer is None)."""

    layer: int | None
    component: Literal["attention", "mlp"] | None


NON_LAYER = ParamSlot(None, None)


def layer_index(name: str) -> int | None:
    """The decoder layer a parameter or module name belongs to (None: outside the layers)."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def param_slot(name: str) -> ParamSlot:
    """Place a parameter name.

    Args:
        name: e.g. `model.layers.3.self_attn.q_proj.weight` or `model.embed_tokens.weight`.
    Returns:
        ParamSlot(layer, component), or NON_LAYER for embeddings, final norm, lm_head.
    Raises:
        ArchitectureError for a per-layer parameter of no known component.
    """
    m = _LAYER.search(name)
    if m is None:
        return NON_LAYER
    layer, rest = int(m.group(1)), m.group(2)
    if rest.startswith(_ATTENTION_PREFIXES):
        return ParamSlot(layer, "attention")
    if rest.startswith(_MLP_PREFIXES):
        return ParamSlot(layer, "mlp")
    raise ArchitectureError(
        f"tensor {name!r}: layer {layer} parameter {rest!r} is neither attention nor MLP; "
        f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
    )


def model_type_problem(mtype: object) -> str | None:
    """Why layerswap refuses a model of this `model_type`, or None when it is supported.

    One rule for the merge and for training (cli/train.py, trainables/train/run_setup.py, the
    memory plan's note): a family whose layer naming is unverified may split a layer wrongly
    (Gemma2's post_attention_layernorm normalises attention's output, yet its name reads as the
    MLP's), so an expert of it would be trained for a merge that refuses it.
    """
    if mtype in SUPPORTED_MODEL_TYPES:
        return None
    return f"model_type {mtype!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"


def check_model_type(config: dict, source: str) -> None:
    """Refuse architectures whose layer naming we have not verified (`model_type_problem`)."""
    if (problem := model_type_problem(config.get("model_type"))) is not None:
        raise ArchitectureError(f"{source}: {problem}")


def num_layers(config: dict, source: str) -> int:
    n = config.get("num_hidden_layers")
    if not isinstance(n, int) or n <= 0:
        raise ArchitectureError(f"{source}: config.json has no valid num_hidden_layers ({n!r})")
    return n


# Config fields that must agree for two checkpoints to be merged tensor by tensor: the shapes,
# and everything else that changes what the same tensors compute (activation, norm epsilon, RoPE,
# attention windows, biases, logit scale). Not compared: dtype, _name_or_path, use_cache,
# transformers_version, token ids: a fine-tune saved by another transformers may differ there.
ARCH_FIELDS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
    "hidden_act",
    "rms_norm_eps",
    "layer_norm_eps",
    "rope_parameters",  # rope_theta and rope_scaling, in the form transformers 5 loads them
    "max_position_embeddings",
    "attention_bias",
    "mlp_bias",
    "logit_scale",
    "use_qk_norm",
    "sliding_window",
    "layer_types",
)

# What transformers fills in when config.json leaves a field out (each XConfig class's default):
# a config saved by transformers 4 (Aya leaves out tie_word_embeddings, Llama 3 mlp_bias) is
# compared as the model would be built from it. Kept here, not read from transformers, so the
# search preflight needs no torch; tests/trainables/merge/test_arch_config.py checks it against
# transformers' classes.
_COMMON = {"hidden_act": "silu", "tie_word_embeddings": False, "rope_theta": 10000.0}
_QWEN = {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "use_sliding_window": False}
_COHERE = {
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "layer_norm_eps": 1e-5,
    "attention_bias": False,
    "logit_scale": 0.0625,
}
CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": _COMMON
    | {
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "qwen2": _COMMON | _QWEN | {"sliding_window": 4096, "max_window_layers": 28},
    "qwen3": _COMMON
    | _QWEN
    | {"sliding_window": 4096, "max_window_layers": 28, "head_dim": 128, "attention_bias": False},
    "mistral": _COMMON
    | {"max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "sliding_window": 4096},
    "cohere": _COMMON | _COHERE | {"rope_theta": 500000.0, "use_qk_norm": False},
    "cohere2": _COMMON | _COHERE | {"sliding_window": 4096, "sliding_window_pattern": 4},
}


def arch_view(config: dict) -> dict[str, Any]:
    """A config.json's ARCH_FIELDS as transformers would load them: absent fields take the
    family's default, legacy rope_theta/rope_scaling fold into rope_parameters, derived fields
    (head_dim, num_key_value_heads, per-layer attention windows) are derived.

    Args:
        config: the parsed config.json of a full checkpoint.
    Returns:
        {field: value} for every field of ARCH_FIELDS (None where the family has no such field).
    """
    defaults = CONFIG_DEFAULTS.get(config.get("model_type"), {})

    def get(k: str) -> Any:  # absent: the default; an explicit null stays null, as in transformers
        return config[k] if k in config else defaults.get(k)

    view = {k: get(k) for k in ARCH_FIELDS}
    heads, hidden = view["num_attention_heads"], view["hidden_size"]
    if view["num_key_value_heads"] is None:
        view["num_key_value_heads"] = heads
    if (
        view["head_dim"] is None
        and isinstance(heads, int)
        and heads > 0
        and isinstance(hidden, int)
    ):
        view["head_dim"] = hidden // heads
    view["rope_parameters"] = _rope(config, defaults)
    view["sliding_window"], view["layer_types"] = _windows(config, get)
    return view


def _rope(config: dict, defaults: dict) -> dict[str, Any]:
    """rope_parameters as transformers 5 builds it: rope_scaling's keys (`type` read as
    `rope_type`), then rope_parameters', with rope_theta and rope_type filled in."""
    p: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(config.get(key), dict):
            p |= config[key]
    if "type" in p:
        p.setdefault("rope_type", p.pop("type"))
    if "rope_theta" not in p:
        p["rope_theta"] = config.get("rope_theta", defaults.get("rope_theta"))
    if "partial_rotary_factor" in config:
        p.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    p.setdefault("rope_type", "default")
    return p


def _windows(config: dict, get) -> tuple[Any, Any]:
    """(sliding_window, layer_types) as the family's config class derives them: Qwen slides only
    with use_sliding_window, from layer max_window_layers on; Cohere2 slides 3 layers in 4."""
    mtype, n = config.get("model_type"), get("num_hidden_layers")
    window, types = get("sliding_window"), get("layer_types")
    if mtype in ("qwen2", "qwen3"):
        window = window if get("use_sliding_window") else None
        if types is None and isinstance(n, int):
            first = get("max_window_layers")
            slides = [
                window is not None and isinstance(first, int) and i >= first for i in range(n)
            ]
            types = [("sliding" if s else "full") + "_attention" for s in slides]
    elif mtype == "cohere2" and types is None and isinstance(n, int):
        every = get("sliding_window_pattern")
        every = every if isinstance(every, int) and every > 0 else 4  # as Cohere2Config reads it
        types = [("sliding" if (i + 1) % every else "full") + "_attention" for i in range(n)]
    return window, list(types) if isinstance(types, (list, tuple)) else types


def arch_differences(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    """Where two full checkpoints' configs disagree on what their layers compute.

    Args:
        a, b: parsed config.json files.
    Returns:
        [(field, value in a, value in b)], in ARCH_FIELDS order; rope_parameters differences
        are named per key (e.g. `rope_parameters.rope_theta`). Empty: the two can be merged.
    """
    va, vb = arch_view(a), arch_view(b)
    out = []
    for k in ARCH_FIELDS:
        x, y = va[k], vb[k]
        if x == y:
            continue
        if k == "rope_parameters":
            out += [(f"{k}.{s}", x.get(s), y.get(s)) for s in sorted(x.keys() | y.keys()) if x.get(s) != y.get(s)]  # fmt: skip
        else:
            out.append((k, x, y))
    return out
