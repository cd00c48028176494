"""What the memory plan knows about a model: its config (never its weights) and, from the config,
every parameter's size and which of them an experiment's mode trains.

`load_model_config(base)` reads config.json (a local folder, the HF cache, the Hub), or for a
few known Hub ids a built-in copy when the config is not at hand offline; `model_shape(config)`
builds the model on torch's meta device (shapes only, no memory) and `trainable_split(exp,
shape)` applies the mode's freezing rules (trainables/train/modes.py) to the names. Used by
trainables/train/plan.py (`layerswap train EXP.yaml --plan`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from layerswap.spaces.train_experiment import LoraSpec, TrainExperiment, partition_spec
from layerswap.trainables.merge.arch import layer_index as layer_of
from layerswap.trainables.train.partition import lora_target_regex, param_sides
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
# The architectures of the shipped real configs (spaces/examples/real_*.yaml), so that a plan
# needs no network. Memory depends only on these shape fields; rope scaling is left out.
KNOWN_CONFIGS: dict[str, dict] = {
    "meta-llama/Llama-3.1-8B": _LLAMA31_8B,
    "meta-llama/Llama-3.1-8B-Instruct": _LLAMA31_8B,
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


@dataclass(frozen=True)
class Split:
    """Which parameters exist during training (LoRA adapters included) and which of them train.

    params: name -> elements, for every parameter of the trained model.
    trainable: the names that train. linear: the names that are Linear weights (autocast casts
    those). lora_rank: per layer, the summed rank of the adapters that layer carries.
    """

    params: dict[str, int]
    trainable: frozenset[str]
    linear: frozenset[str]
    lora_rank: dict[int, int]


def _matches(module: str, targets: list[str] | str) -> bool:
    """PEFT's target_modules rule: a regex fully matches, or a name is the module's last part."""
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return any(module == t or module.endswith(f".{t}") for t in targets)


def _with_lora(shape: ModelShape, spec: LoraSpec, targets: list[str] | str) -> Split:
    """The model PEFT builds: the base frozen, rank-`spec.rank` A and B on each target Linear."""
    params = dict(shape.params)
    adapters, ranks = set(), {}
    for mod, (fan_in, fan_out) in shape.linears.items():
        if not _matches(mod, targets):
            continue
        a, b = f"{mod}.lora_A.weight", f"{mod}.lora_B.weight"
        params[a], params[b] = spec.rank * fan_in, fan_out * spec.rank
        adapters |= {a, b}
        if (layer := layer_of(mod)) is not None:
            ranks[layer] = ranks.get(layer, 0) + spec.rank
    base_linear = {f"{m}.weight" for m in shape.linears}
    return Split(params, frozenset(adapters), frozenset(base_linear | adapters), ranks)


def trainable_split(exp: TrainExperiment, shape: ModelShape) -> Split:
    """Apply the experiment's mode to the parameter names, as trainables/train/modes.py does.

    Args:
        exp: the experiment (its `mode`).
        shape: the model's sizes.
    Returns:
        Split.
    """
    mode, depth = exp.mode, shape.layers
    lora = mode if mode.type == "lora" else getattr(mode, "lora", None)
    linear = frozenset(f"{m}.weight" for m in shape.linears)
    if mode.type in ("full", "mix") and lora is None:
        return Split(dict(shape.params), frozenset(shape.params), linear, {})
    if mode.type in ("lora", "mix"):
        return _with_lora(shape, lora, list(lora.target_modules))
    spec = partition_spec(mode.partition)
    if mode.type == "partial":
        if lora is not None:  # adapters only where the partition allocates the trained side
            regex = lora_target_regex(spec, mode.train, depth, list(lora.target_modules))
            return _with_lora(shape, lora, regex)
        sides = param_sides(shape.params, spec, depth)
        return Split(dict(shape.params), frozenset(n for n, s in sides.items() if s == mode.train), linear, {})  # fmt: skip
    # simultaneous: both sides train; what no side owns (unowned adapters included) is frozen
    split = _with_lora(shape, lora, list(lora.target_modules)) if lora is not None else None
    params = split.params if split else dict(shape.params)
    pool = split.trainable if split else frozenset(params)
    sides = param_sides(sorted(pool), spec, depth)
    trainable = frozenset(n for n, s in sides.items() if s is not None)
    return Split(params, trainable, split.linear if split else linear, split.lora_rank if split else {})  # fmt: skip
