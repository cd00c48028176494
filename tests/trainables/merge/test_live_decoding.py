"""The live model decodes as the merged folder would: its generation_config.json follows the
checkpoint a disk merge copies it from, recipe after recipe (search trials and promotion both
score the live model). Run:
.venv/bin/python -m pytest -q tests/trainables/merge/test_live_decoding.py
"""

from __future__ import annotations

import json
import shutil

from transformers import GenerationConfig

from layerswap.spaces.recipe import parse_recipe
from layerswap.spaces.search_space import ExpertPool, ExpertRef
from layerswap.trainables.merge.api import merge
from layerswap.trainables.merge.live import ExpertCache, LiveModel

# Qwen2.5-7B-Instruct's own generation settings (greedy-relevant ones): a repetition penalty,
# two eos ids and a budget past lm-eval's.
QWEN_LIKE = {"repetition_penalty": 1.05, "eos_token_id": [2, 3], "max_new_tokens": 2048}


def _rules(cfg: GenerationConfig) -> tuple:
    return cfg.repetition_penalty, cfg.eos_token_id, cfg.max_new_tokens


def test_live_model_carries_the_generation_config_a_disk_merge_writes(family, tmp_path):
    task = tmp_path / "task"
    shutil.copytree(family.paths["task"], task)
    (task / "generation_config.json").write_text(json.dumps(QWEN_LIKE))
    lang = family.ref("language")  # no generation_config.json: config.json's settings
    pool = ExpertPool(
        task=[ExpertRef(path=str(task))], language=[ExpertRef(path=lang)], base=family.ref("base")
    )
    live = LiveModel(ExpertCache(family.ref("base")), pool)
    swap = parse_recipe(
        {
            "method": "layer_swap",
            "task_expert": str(task),
            "language_expert": lang,
            "bottom": 2,
            "top": 1,
        }
    )
    flipped = swap.model_copy(update={"task_expert": lang, "language_expert": str(task)})

    for recipe, out in ((swap, tmp_path / "m1"), (flipped, tmp_path / "m2"), (swap, tmp_path / "m3")):  # fmt: skip
        live.load(recipe)
        merge(recipe, out)
        # what lm-eval's HFLM loads the merged folder with (defaults from config.json if absent)
        want = GenerationConfig.from_pretrained(out) if (out / "generation_config.json").exists() else GenerationConfig.from_model_config(live.model.config)  # fmt: skip
        assert _rules(live.model.generation_config) == _rules(want)

    live.load(swap)
    assert _rules(live.model.generation_config) == (1.05, [2, 3], 2048)
    live.load_ref(lang)  # a baseline of promotion: its own (here none)
    assert live.model.generation_config.repetition_penalty in (None, 1.0)
    live.load_ref(str(task))
    assert _rules(live.model.generation_config) == (1.05, [2, 3], 2048)
