"""The live model decodes as the merged folder would: its generation_config.json follows the
checkpoint a disk merge copies it from, recipe after recipe (search trials and promotion both
score the live model). Run:
.venv/bin/python -m pytest -q tests/trainables/merge/test_live_decoding.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from transformers import AutoConfig, GenerationConfig

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
    lang = str(tmp_path / "language")  # no generation_config.json: its config.json's settings
    shutil.copytree(family.paths["language"], lang)
    config = json.loads((Path(lang) / "config.json").read_text())
    (Path(lang) / "config.json").write_text(json.dumps({**config, "eos_token_id": 7}))
    (Path(lang) / "generation_config.json").unlink()
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
        own = (out / "generation_config.json").exists()
        want = GenerationConfig.from_pretrained(out) if own else GenerationConfig.from_model_config(AutoConfig.from_pretrained(out))  # fmt: skip
        assert _rules(live.model.generation_config) == _rules(want)

    live.load(swap)
    assert _rules(live.model.generation_config) == (1.05, [2, 3], 2048)
    live.load_ref(lang)  # a baseline of promotion: its own config.json's (eos 7)
    assert live.model.generation_config.repetition_penalty in (None, 1.0)
    assert live.model.generation_config.eos_token_id == 7
    live.load_ref(str(task))
    assert _rules(live.model.generation_config) == (1.05, [2, 3], 2048)


def test_a_merge_that_takes_no_layer_from_an_expert_is_warned_of_a_trial_is_not(family, tmp_path, capsys):  # fmt: skip
    """`partition: B` (first 8 + last 4 layers) on the 12-layer family gives the task expert no
    layer: the disk merge says so; the search's live model, which composes sampled recipes (on
    a few layers a zone may round to 0 by design), stays silent."""
    experts = {"task_expert": family.ref("task"), "language_expert": family.ref("language")}
    recipe = parse_recipe({"method": "layer_swap", **experts, "partition": "B"})
    merge(recipe, tmp_path / "b")
    assert "gives task_expert none of the model's 12 layers" in capsys.readouterr().err
    task, lang = ExpertRef(path=family.ref("task")), ExpertRef(path=family.ref("language"))
    pool = ExpertPool(task=[task], language=[lang], base=family.ref("base"))
    LiveModel(ExpertCache(family.ref("base")), pool).load(recipe)
    assert capsys.readouterr().err == ""
