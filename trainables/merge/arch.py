"""Parameter name -> (transformer layer, component) for the HF decoder families the papers use.

Covers Llama (and Falcon3, which is llama-arch), Qwen2/Qwen3, Mistral and Cohere/Aya, full
checkpoints and PEFT adapters alike (`base_model.model.` prefixes are fine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

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


def check_model_type(config: dict, source: str) -> None:
    """Refuse architectures whose layer naming we have not verified."""
    mtype = config.get("model_type")
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise ArchitectureError(
            f"{source}: model_type {mtype!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


def num_layers(config: dict, source: str) -> int:
    n = config.get("num_hidden_layers")
    if not isinstance(n, int) or n <= 0:
        raise ArchitectureError(f"{source}: config.json has no valid num_hidden_layers ({n!r})")
    return n


# Config fields that must agree for two checkpoints to be merged tensor by tensor.
ARCH_FIELDS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "tie_word_embeddings",
)
