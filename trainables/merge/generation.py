"""The decoding a model built from a checkpoint reference gets: whose generation settings it
carries, and a short digest of them. One rule for the live model (trainables/merge/live.py),
promotion's kept results (search/promote_kept.py) and a resumed search (search/search_dir.py).

A disk merge copies its primary checkpoint's generation_config.json (a LoRA adapter's: its base's,
as merge_lora_to_disk copies it), else transformers derives the settings from the config.json
it copies; lm-eval's generate and the proxies' decoding rules read them (Qwen2.5's
repetition_penalty 1.05, extra eos ids and max_new_tokens 2048 live only there). Content ids
(trainables/model_ids.py) do not hash generation_config.json, so `decoding_digest` is what says
two evaluations of one checkpoint decoded alike.
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
# Fields a saved generation config carries that say who wrote it, not how it decodes: a re-save
# by another transformers version (or one derived from config.json, then saved) differs only here.
BOOKKEEPING = frozenset({"transformers_version", "_from_model_config", "_commit_hash", "_original_object_hash"})  # fmt: skip

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


def _cached_hub_folder(repo_id: str, name: str) -> str | None:
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
        folder = _cached_hub_folder(ref, name)
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
    """
    # lazy: transformers (0.9 s here after torch), which the study planner never needs
    from transformers import AutoConfig, GenerationConfig

    folder = side_dir(src, GENERATION_CONFIG, lookup)
    if folder is not None:
        return GenerationConfig.from_pretrained(folder)
    config_dir = side_dir(src, "config.json", lookup)
    if config_dir is None and fallback is None:
        config_dir = side_dir(base, "config.json", lookup)
    config = AutoConfig.from_pretrained(config_dir) if config_dir else fallback
    return GenerationConfig.from_model_config(config) if config is not None else GenerationConfig()


def settings_digest(generation) -> str:
    """16 hex digits of a GenerationConfig's settings: its fields that differ from transformers'
    defaults, less BOOKKEEPING, as sorted JSON (equal settings saved by any version, in any key
    order, or derived from config.json, give one digest)."""
    fields = {k: v for k, v in generation.to_diff_dict().items() if k not in BOOKKEEPING}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
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
