"""What the memory plan knows about a model: its config (never its weights) and, from the config,
every parameter's size.

`load_model_config(base)` reads config.json (a local folder, the HF cache, the Hub), or for a
few known Hub ids a built-in copy when the config is not at hand offline; `model_shape(config)`
builds the model on torch's meta device (shapes only, no memory). Which of the parameters an
experiment's mode trains is the mode table's to say (trainables.train.modes.trainable_split).
Used by trainables/train/memory_plan.py (`layerswap train EXP.yaml --plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from layerswap.trainables.train.precision import config_dtype

_LLAMA31_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}
# The follow-up paper's other three models, copied from each Hub repo's config.json (the repo id
# is the key below). Memory reads the shape fields; the rest (rope theta, norm eps, Cohere's
# logit_scale) is there so the built-in copy builds the same modules as the published config.
_QWEN25_7B = {  # Qwen/Qwen2.5-7B-Instruct: q/k/v biases (Qwen2's own), untied at 7B
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}
_AYA_EXPANSE_8B = {  # CohereForAI/aya-expanse-8b: parallel block, LayerNorm, tied embeddings
    "model_type": "cohere",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
    "layer_norm_eps": 1e-5,
    "logit_scale": 0.125,
    "rope_theta": 10000.0,
    "use_qk_norm": False,
    "tie_word_embeddings": True,  # config.json leaves it out: CohereConfig's default
    "dtype": "float16",
}
_FALCON3_7B = {  # tiiuae/Falcon3-7B-Instruct: a Llama architecture with 256-wide heads
    "model_type": "llama",
    "hidden_size": 3072,
    "intermediate_size": 23040,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "vocab_size": 131072,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000042.0,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}
# The architectures of the shipped real configs (spaces/examples/real_*.yaml), so that a plan
# needs no network. Memory depends only on the shape fields; Llama 3.1's rope scaling is left out.
KNOWN_CONFIGS: dict[str, dict] = {
    "meta-llama/Llama-3.1-8B": _LLAMA31_8B,
    "meta-llama/Llama-3.1-8B-Instruct": _LLAMA31_8B,
    "Qwen/Qwen2.5-7B-Instruct": _QWEN25_7B,
    "CohereForAI/aya-expanse-8b": _AYA_EXPANSE_8B,
    "tiiuae/Falcon3-7B-Instruct": _FALCON3_7B,
}


def load_model_config(base: str, trust_remote_code: bool = False):
    """The base model's config, and where it came from.

    Args:
        base: a local model folder or a Hub id.
        trust_remote_code: passed to AutoConfig.
    Returns:
        (transformers PretrainedConfig, a phrase naming its origin).
    Raises:
        ValueError when there is no config.json to read and `base` is not in KNOWN_CONFIGS.
    """
    from transformers import AutoConfig

    folder = Path(base).expanduser()
    if (folder / "config.json").is_file():
        cfg = AutoConfig.from_pretrained(base, trust_remote_code=trust_remote_code)
        return cfg, f"config.json in {base}"
    if base.startswith(("/", ".", "~")) or folder.exists():  # cli/train.check_inputs' rule
        raise ValueError(f"base: {base} is not a model folder (no config.json)")
    try:  # the HF cache first: no network wait when offline
        cfg = AutoConfig.from_pretrained(base, trust_remote_code=trust_remote_code, local_files_only=True)  # fmt: skip
        return cfg, f"config.json of {base} (HF cache)"
    except OSError:
        pass
    if base in KNOWN_CONFIGS:
        return _known(
            KNOWN_CONFIGS[base]
        ), f"built-in copy of {base}'s config (its config.json is not in the HF cache)"
    try:
        cfg = AutoConfig.from_pretrained(base, trust_remote_code=trust_remote_code)
    except OSError as e:
        raise ValueError(
            f"base {base!r}: no config.json to plan from (not a local folder, not in the HF "
            f"cache, Hub unreachable: {str(e).splitlines()[0]}); known offline: "
            f"{', '.join(KNOWN_CONFIGS)}"
        ) from e
    return cfg, f"config.json of {base} (Hub)"


def _known(fields: dict):
    """A config object from a KNOWN_CONFIGS entry."""
    from transformers import AutoConfig

    fields = dict(fields)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


@dataclass(frozen=True)
class ModelShape:
    """Sizes read off a config: parameters by name, Linear modules by name, the block shape."""

    model_type: str
    params: dict[str, int]  # parameter name -> number of elements
    linears: dict[str, tuple[int, int]]  # Linear module name -> (in_features, out_features)
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    attention: str  # attn implementation ("sdpa" unless the config asks otherwise)
    dtype: torch.dtype


def model_shape(config) -> ModelShape:
    """Every parameter's size, from `config` alone (the model is built on the meta device).

    Args:
        config: a transformers PretrainedConfig of a causal LM.
    Returns:
        ModelShape.
    """
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = {n: p.numel() for n, p in model.named_parameters()}  # tied weights appear once
    linears = {
        n: (m.in_features, m.out_features)
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    }
    missing = [
        k
        for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
        if getattr(config, k, None) is None
    ]
    if missing:
        raise ValueError(f"model_type {config.model_type!r}: config lacks {missing}; plans cover Llama-family decoders")  # fmt: skip
    heads = config.num_attention_heads
    return ModelShape(
        model_type=config.model_type,
        params=params,
        linears=linears,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab=config.vocab_size,
        attention=getattr(config, "_attn_implementation", None) or "sdpa",
        dtype=config_dtype(config),
    )
