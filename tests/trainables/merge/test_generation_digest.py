"""The digest of the generation settings a checkpoint gives a model (trainables/merge/generation.py):
equal for the same settings however they were saved, another for any changed setting, a LoRA
adapter's that of its base. Run:
.venv/bin/python -m pytest -q tests/trainables/merge/test_generation_digest.py
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoConfig, GenerationConfig

from layerswap.trainables.merge.generation import decoding_digest

# A config.json transformers can read, with the generation fields it derives settings from.
CONFIG = {"model_type": "llama", "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _checkpoint(folder: Path, generation: dict | None = None) -> str:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    return str(folder)


def test_the_same_settings_saved_any_way_give_one_digest(tmp_path):
    bare = _checkpoint(tmp_path / "bare")  # settings derived from config.json
    derived = GenerationConfig.from_model_config(AutoConfig.from_pretrained(bare))
    derived.save_pretrained(tmp_path / "saved")  # what save_pretrained writes beside it
    saved = json.loads((tmp_path / "saved" / "generation_config.json").read_text())
    resaved = dict(reversed(list(saved.items()))) | {"transformers_version": "4.38.0"}
    other = _checkpoint(tmp_path / "resaved", resaved)
    assert decoding_digest(bare) == decoding_digest(str(tmp_path / "saved")) == decoding_digest(other)  # fmt: skip
    penalty = _checkpoint(tmp_path / "penalty", saved | {"repetition_penalty": 1.05})
    eos = _checkpoint(tmp_path / "eos", saved | {"eos_token_id": [2, 3]})
    assert len({decoding_digest(bare), decoding_digest(penalty), decoding_digest(eos)}) == 3


def test_a_lora_adapter_decodes_as_its_base(tmp_path):
    base = _checkpoint(tmp_path / "base", {"repetition_penalty": 1.05, "eos_token_id": 2})
    adapter = tmp_path / "adapter"  # merge_lora_to_disk copies the base's generation settings
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    (adapter / "generation_config.json").write_text(json.dumps({"max_new_tokens": 9}))
    assert decoding_digest(str(adapter), base) == decoding_digest(base)
    assert decoding_digest(str(adapter), base) != decoding_digest(str(adapter))  # no base: its own


def test_a_hub_id_not_in_the_cache_has_no_known_digest(tmp_path):
    """Never the network: a Hub id whose files the cache lacks decodes as the fallback (the
    base's config.json) and, asked for what is known only, has no digest."""
    base = _checkpoint(tmp_path / "base")
    hub = "layerswap-tests/never-downloaded"
    assert decoding_digest(hub, known_only=True) is None
    assert decoding_digest(hub, base) == decoding_digest(base)
