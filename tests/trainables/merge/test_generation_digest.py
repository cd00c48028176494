"""The digest of the generation settings a checkpoint gives a model (trainables/merge/generation.py):
equal for the same settings however they were saved, another for any changed setting, a LoRA
adapter's that of its base. Run:
.venv/bin/python -m pytest -q tests/trainables/merge/test_generation_digest.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig, GenerationConfig

from layerswap.trainables.merge.generation import DECODING_FIELDS, decoding_digest

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


# Files that say what the bare config.json implies (bos 1, eos 2, pad 0), however written.
IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
SAME = {
    "a 4.x save": IDS | {"_from_model_config": True, "transformers_version": "4.40.0"},
    "eos as a list of one": IDS | {"eos_token_id": [2]},
    "defaults spelled out": IDS
    | {"do_sample": False, "temperature": 1, "top_k": 50, "num_beams": 1, "max_length": 20.0},
    "fields that change no output": IDS
    | {"use_cache": False, "output_scores": True, "my_custom": 3},
    "sampling fields of a greedy config": IDS
    | {"do_sample": False, "temperature": 0.6, "top_k": 20, "top_p": 0.9, "min_p": 0.1},
    "an eos id listed twice": IDS | {"eos_token_id": [2, 2]},
}
# ...and files that decode otherwise.
OTHER = {
    "sampling": {"do_sample": True},
    "a stop string": {"stop_strings": "\n\n"},
    "another eos order": {"eos_token_id": [3, 2]},
    "min_new_tokens": {"min_new_tokens": 4},
    "no pad": {"pad_token_id": 5},
}


@pytest.mark.parametrize("case", list(SAME))
def test_equal_decoding_settings_written_otherwise_give_one_digest(tmp_path, case):
    """A base without generation_config.json (settings derived from config.json carry use_cache
    and output_* flags) and one whose file holds the same ids gave two digests: a search
    --resume refused, kept promotion results were evaluated again."""
    bare = _checkpoint(tmp_path / "bare")
    assert decoding_digest(_checkpoint(tmp_path / "file", SAME[case])) == decoding_digest(bare)


@pytest.mark.parametrize("case", list(OTHER))
def test_a_changed_decoding_setting_gives_another_digest(tmp_path, case):
    ids = {"bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 0}
    same = _checkpoint(tmp_path / "same", ids)
    other = _checkpoint(tmp_path / "other", ids | OTHER[case])
    assert decoding_digest(other) != decoding_digest(same)


@pytest.mark.parametrize("field,value", [("temperature", 0.6), ("top_k", 5), ("top_p", 0.9), ("min_p", 0.1)])  # fmt: skip
def test_a_sampling_field_counts_only_when_sampling(tmp_path, field, value):
    """A greedy config's temperature or top_p changes no output (generate() warps logits only
    when it samples): one digest; a sampling config's changes its output: another."""
    for do_sample in (False, True):
        ids = IDS | {"do_sample": do_sample}
        same = _checkpoint(tmp_path / f"same_{do_sample}", ids)
        other = _checkpoint(tmp_path / f"other_{do_sample}", ids | {field: value})
        assert (decoding_digest(other) != decoding_digest(same)) is do_sample


@pytest.mark.parametrize(
    "kind,both,a,b",
    [
        # contrastive search does not sample, yet reads top_k: its number of candidates
        ("contrastive", {"penalty_alpha": 0.6}, {"top_k": 4}, {"top_k": 8}),
        # beam sampling keeps len(eos ids) + 1 tokens through its warpers
        (
            "beam sampling",
            {"do_sample": True, "num_beams": 2},
            {"eos_token_id": [2, 3]},
            {"eos_token_id": [2, 3, 3]},
        ),
    ],
)
def test_fields_greedy_decoding_ignores_count_where_they_are_read(tmp_path, kind, both, a, b):
    one = _checkpoint(tmp_path / "a", IDS | both | a)
    two = _checkpoint(tmp_path / "b", IDS | both | b)
    assert decoding_digest(one) != decoding_digest(two), kind


def test_the_decoding_fields_are_transformers_own_with_its_defaults():
    """Each hashed field is one GenerationConfig has, and its unset value is the one generate()
    fills in (a typo, or a default transformers changed, would split or merge digests)."""
    known = vars(GenerationConfig())
    assert not [f for f in DECODING_FIELDS if f not in known]
    defaults = GenerationConfig._get_default_generation_params()
    assert {f: d for f, d in DECODING_FIELDS.items() if f in defaults and d != defaults[f]} == {}


def test_a_generation_config_that_is_not_json_is_named(tmp_path):
    broken = _checkpoint(tmp_path / "broken", {})
    (tmp_path / "broken" / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"^{tmp_path / 'broken' / 'generation_config.json'}: not readable JSON"):  # fmt: skip
        decoding_digest(broken)
