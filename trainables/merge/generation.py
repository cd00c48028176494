"""The decoding a model built from a checkpoint reference gets: whose generation settings it
carries, and a short digest of them. One rule for the live model (trainables/merge/live.py),
promotion's kept results (search/promote_kept.py) and a resumed search (search/search_dir.py).

A disk merge copies its primary checkpoint's generation_config.json (a LoRA adapter's: its base's,
as merge_lora_to_disk copies it), else transformers derives the settings from the config.json
it copies; lm-eval's generate and the proxies' decoding rules read them (Qwen2.5's
repetition_penalty 1.05, extra eos ids and max_new_tokens 2048 live only there). Content ids
(trainables/model_ids.py) do not hash generation_config.json, so `decoding_digest` is what says
two evaluations of one checkpoint decoded alike: it hashes only the settings that change what
generate() returns (DECODING_FIELDS), so equal settings however written give one digest.
Run: `python -c "from layerswap.trainables.merge.generation import decoding_digest as d; print(d('DIR'))"`.
Tests: tests/trainables/merge/test_generation_digest.py tests/trainables/merge/test_live_decoding.py
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from layerswap.spaces.base import is_hub_id
from layerswap.trainables.storage import is_uri, join, local_copy

GENERATION_CONFIG = "generation_config.json"
# The GenerationConfig fields that change what generate() returns, greedy or sampled (transformers
# 5.x), each with the value generate() uses when the field is unset: the settings digest hashes
# only these, so fields that change no output (use_cache, output_attentions and the other output_*
# and cache_* flags that a config derived from config.json carries, compile and assistant
# settings), who saved the file (transformers_version, _from_model_config) and keys transformers
# does not know all leave it alone. Defaults: GenerationConfig._get_default_generation_params,
# else None or False (off).
# fmt: off
DECODING_FIELDS: dict[str, object] = {
    # special tokens: which ids end a sequence, pad the finished ones of a batch, start one
    "eos_token_id": None, "bos_token_id": None, "pad_token_id": None,
    "decoder_start_token_id": None,
    # length and stopping
    "max_length": 20, "max_new_tokens": None, "min_length": 0, "min_new_tokens": None,
    "early_stopping": False, "max_time": None, "stop_strings": None,
    # decoding strategy
    "do_sample": False, "num_beams": 1, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "penalty_alpha": None, "dola_layers": None, "num_return_sequences": 1,
    # logits processing and sampling
    "temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None, "top_h": None, "typical_p": 1.0,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "force_words_ids": None,
    "constraints": None, "sequence_bias": None, "renormalize_logits": False,
    "forced_bos_token_id": None, "forced_eos_token_id": None, "remove_invalid_values": False,
    "exponential_decay_length_penalty": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "guidance_scale": None, "token_healing": False,
    "watermarking_config": None,
}
# fmt: on
# Fields one value of which means a one-element list: generate() stops at any id of a list, so
# eos_token_id 2 and [2] decode alike (one digest); a list's order is kept (its first id pads
# finished sequences when pad_token_id is unset).
AS_LIST = frozenset({"eos_token_id", "stop_strings"})
# Fields generate() reads only when it samples (its logits warpers, transformers 5.x
# `_get_logits_processor`): with do_sample off they change no output, so they leave the digest.
SAMPLING_ONLY = frozenset(
    {"temperature", "top_h", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff"}
)

Lookup = Callable[[str, str], "str | None"]


def file_dir(ref: str, name: str) -> str | None:
    """A local folder holding `ref`'s file `name` (config.json, generation_config.json): its own
    folder, or for a URI a local copy of that file alone (no weights); None if it has none."""
    if is_uri(ref):
        try:
            return str(local_copy(join(ref, name)).parent)
        except FileNotFoundError:
            return None
    return ref if (Path(ref) / name).is_file() else None


def cached_hub_folder(repo_id: str, name: str) -> str | None:
    """The local snapshot folder holding a Hub repo's `name` if the cache has it (no network)."""
    from huggingface_hub import try_to_load_from_cache  # lazy: only for Hub-id experts

    found = try_to_load_from_cache(repo_id, name)
    return str(Path(found).parent) if isinstance(found, str) else None


def side_dir(ref: str | None, name: str, lookup: Lookup = file_dir) -> str | None:
    """A local folder holding `ref`'s file `name`: `lookup`'s (its own folder, a URI's local
    copy), else a Hub id's cached snapshot (never the network); None if there is none."""
    if ref is None:
        return None
    folder = lookup(ref, name)
    if folder is None and is_hub_id(ref):
        folder = cached_hub_folder(ref, name)
    return folder


def is_adapter(ref: str) -> bool:
    """Whether `ref` is a LoRA adapter, probed as the expert cache probes it (a local folder
    without adapter_config.json is a full checkpoint: one stat; a Hub id is one)."""
    # lazy: lora.py imports torch (1.3 s here); decoding_digest's transformers needs it anyway
    from layerswap.trainables.merge.lora import CONFIG, is_lora_adapter

    return (is_uri(ref) or Path(ref, CONFIG).exists()) and is_lora_adapter(ref)


def decoding_source(ref: str, base: str | None, adapter: bool | None = None) -> str:
    """The checkpoint whose generation settings a model built from `ref` carries: `ref`, or for
    a LoRA adapter its base (the search's), as merge_lora_to_disk copies the base's.

    Args:
        ref: the checkpoint (a recipe's primary_ref, an expert, the base).
        base: the pool's base.
        adapter: whether `ref` is a LoRA adapter, when the caller knows; None: probed.
    """
    if base is not None and (adapter if adapter is not None else is_adapter(ref)):
        return base
    return ref


def generation_file_problem(folder: str | Path) -> str | None:
    """Why `folder`'s generation_config.json cannot be read as generation settings (not UTF-8
    JSON, not a JSON object), one line naming the file; None if it can, or there is none.

    Args:
        folder: a local checkpoint folder.
    """
    path = Path(folder) / GENERATION_CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # ValueError: bad JSON, or bytes that are not UTF-8
        return f"{path}: not readable JSON ({e})"
    if not isinstance(data, dict):
        return f"{path}: not a JSON object (a {type(data).__name__})"
    return None


def generation_config(src: str, lookup: Lookup = file_dir, fallback=None, base: str | None = None):
    """The GenerationConfig a disk merge whose primary is `src` carries: `src`'s
    generation_config.json, else the settings its config.json implies, else those of `fallback`
    (a model config: the live model's own) or of `base`'s config.json, else transformers' defaults.

    Args:
        src: decoding_source's answer.
        lookup: finds a local folder holding a file of a checkpoint (file_dir, or a cached one).
        fallback: a transformers config to derive from when `src` has no config.json here.
        base: the pool's base, whose config.json is read when there is no `fallback`.
    Returns:
        a transformers GenerationConfig.
    Raises:
        ValueError naming a generation_config.json that is not a JSON object.
    """
    # lazy: transformers (0.9 s here after torch), which the study planner never needs
    from transformers import AutoConfig, GenerationConfig

    folder = side_dir(src, GENERATION_CONFIG, lookup)
    if folder is not None:
        if (problem := generation_file_problem(folder)) is not None:
            raise ValueError(problem)  # one line naming the file, not transformers' OSError
        return GenerationConfig.from_pretrained(folder)
    config_dir = side_dir(src, "config.json", lookup)
    if config_dir is None and fallback is None:
        config_dir = side_dir(base, "config.json", lookup)
    config = AutoConfig.from_pretrained(config_dir) if config_dir else fallback
    return GenerationConfig.from_model_config(config) if config is not None else GenerationConfig()


def _plain(value):
    """`value` as JSON-able data that equal settings share: tuples as lists, a float with an
    integral value as an int (1.0 and 1 are one setting), a config object as its dict."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if hasattr(value, "to_dict"):  # watermarking_config
        return _plain(value.to_dict())
    return value


def decoding_settings(generation) -> dict:
    """The DECODING_FIELDS of a GenerationConfig that differ from what generate() uses when
    unset, normalised (`_plain`; AS_LIST fields as lists; eos ids once each, first occurrence
    first: generate() stops at any of them); without do_sample, no SAMPLING_ONLY field.

    Args:
        generation: a transformers GenerationConfig.
    Returns:
        field -> value, only fields off their default.
    """
    out = {}
    # Beam sampling keeps len(eos ids) + 1 tokens through its warpers (transformers 5.x
    # generate()): there a repeated eos id changes the output, elsewhere it does not.
    beam_sampling = bool(generation.do_sample) and (generation.num_beams or 1) > 1
    for field, default in DECODING_FIELDS.items():
        value = getattr(generation, field, None)
        value = _plain(default if value is None else value)
        if field in AS_LIST and value is not None and not isinstance(value, list):
            value = [value]
        if field == "eos_token_id" and value is not None and not beam_sampling:
            value = list(dict.fromkeys(value))  # [2, 2] is [2]; the first still pads (unset pad)
        if value != _plain(default):
            out[field] = value
    if not out.get("do_sample"):  # greedy, beam or contrastive search: no warper
        # contrastive search (penalty_alpha > 0) reads top_k as its number of candidates
        unread = SAMPLING_ONLY - ({"top_k"} if out.get("penalty_alpha") else set())
        out = {k: v for k, v in out.items() if k not in unread}
    return out


def settings_digest(generation) -> str:
    """16 hex digits of a GenerationConfig's decoding settings (`decoding_settings`) as sorted
    JSON: equal settings give one digest however they were written (saved by any transformers
    version, in any key order, derived from config.json, with fields that change no output)."""
    text = json.dumps(decoding_settings(generation), sort_keys=True, separators=(",", ":"), default=str)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def decoding_digest(ref: str, base: str | None = None, *, known_only: bool = False) -> str | None:
    """The digest of the generation settings a model built from `ref` decodes with.

    Args:
        ref: a checkpoint reference (for a recipe: its primary_ref).
        base: the pool's base (a LoRA adapter decodes as it; its config.json is the last resort).
        known_only: None instead of a fallback's digest when the checkpoint whose settings
            count has neither generation_config.json nor config.json here (a Hub id not yet in
            the cache: its first trial downloads it, and the digest would change under it).
    Returns:
        16 hex digits (settings_digest), or None (known_only).
    """
    src = decoding_source(ref, base)
    if known_only and not (side_dir(src, GENERATION_CONFIG) or side_dir(src, "config.json")):
        return None
    return settings_digest(generation_config(src, base=base))
