"""A LoRA recipe's live model (search trials, promotion) must be bit for bit what RUN/best holds.

RUN/best is `merge(recipe, out, fold=True)` (trainables/merge/lora.py); the live model is
trainables/merge/live.py. Over a bf16 base, SFT-sized adapter deltas are partly rounded away
when each adapter is folded into the base first, which moved the magnitude weights and every
transition tensor (a red-team: task weight 0.8667 live vs 0.8607 on disk, 8 of 57 tensors off).
Run: .venv/bin/python -m pytest -q tests/trainables/merge/test_lora_live.py
"""

from __future__ import annotations

import os

# No network: huggingface_hub reads this when first imported, so set it before transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from layerswap.spaces.recipe import parse_recipe
from layerswap.spaces.search_space import ExpertPool, ExpertRef
from layerswap.trainables.merge.live import ExpertCache, LiveModel, load_expert, nonfinite_names
from layerswap.trainables.merge.lora import merge_lora_to_disk
from layerswap.world.tiny import make_tiny_family

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

L = 6


def make_lora(base: Path, out: Path, seed: int, scale: float, targets: list[str]) -> str:
    """A rsLoRA adapter of `base` whose factors are seeded noise of size `scale` (small deltas,
    as SFT at the papers' learning rates leaves them)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, use_rslora=True, target_modules=targets)
    pm = peft.get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(scale * torch.randn(p.shape, generator=g))
    pm.save_pretrained(out, save_embedding_layers=False)
    return str(out)


@pytest.fixture(scope="module")
def bf16_lora(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_live")
    fam = make_tiny_family(root / "fam", num_layers=L, dtype=torch.bfloat16, with_tokenizer=False)
    base = str(fam["base"])
    # The language adapter leaves up_proj and lm_head alone: a transition tensor then holds one
    # adapter's weighted delta only.
    task = make_lora(fam["base"], root / "task", 1, 0.004, ["q_proj", "v_proj", "up_proj", "down_proj", "lm_head"])  # fmt: skip
    lang = make_lora(fam["base"], root / "lang", 2, 0.010, ["q_proj", "v_proj", "down_proj"])
    return base, task, lang


def _recipe(base: str, task: str, lang: str, weights) -> object:
    return parse_recipe(
        {
            "method": "layer_swap",
            "task_expert": task,
            "language_expert": lang,
            "base": base,
            "bottom": 1,
            "top": 1,
            "bottom_transition": 1,
            "top_transition": 1,
            "non_layer": "average",
            "transition_weights": weights,
        }
    )


def _served(base: str):
    """A loader as the search's node store serves states: folded elsewhere, no adapters."""
    states: dict = {}

    def load(ref: str):
        if ref not in states:
            states[ref] = load_expert(ref, lambda: load(base)[0])
        return states[ref], nonfinite_names(states[ref])

    return load


@pytest.mark.parametrize("weights", ["magnitude", {"task": 0.3, "language": 0.7}])
@pytest.mark.parametrize("served", [False, True], ids=["own_files", "node_store"])
def test_live_lora_swap_equals_run_best_bit_for_bit(bf16_lora, tmp_path, weights, served):
    """Every tensor the live model holds for a LoRA swap (owned, transition, averaged lm_head)
    is torch.equal to the folded disk merge, with magnitude or explicit transition weights,
    whether the trial reads the files itself or is served folded states."""
    base, task, lang = bf16_lora
    recipe = _recipe(base, task, lang, weights)
    pool = ExpertPool(
        task=[ExpertRef(path=task, kind="lora")],
        language=[ExpertRef(path=lang, kind="lora")],
        base=base,
    )
    live = LiveModel(ExpertCache(base, _served(base) if served else None), pool)
    live.load(recipe)
    disk = load_file(merge_lora_to_disk(recipe, tmp_path / "best", fold=True) / "model.safetensors")
    got = dict(live.model.named_parameters())
    assert set(got) == set(disk)
    differ = [n for n, t in disk.items() if not torch.equal(got[n].data, t)]
    assert differ == []
    # The check has teeth: the transition tensors are not the base's nor either expert's.
    layer1 = "model.layers.1.mlp.down_proj.weight"
    folded = [live.cache.get(r)[layer1] for r in (base, task, lang)]
    assert not any(torch.equal(disk[layer1], t) for t in folded)


def test_a_lora_on_a_tied_lm_head_is_refused_live_as_on_disk(tmp_path):
    """A LoRA on lm_head of a tied-embedding base has no tensor to fold into: the live model
    (every search trial) refuses naming the tensor, as the disk fold does; it raised a bare
    KeyError('lm_head.weight') (a red-team)."""
    fam = make_tiny_family(tmp_path / "fam", num_layers=2, tie=True, with_tokenizer=False)
    base = str(fam["base"])
    task = make_lora(fam["base"], tmp_path / "task", 1, 0.004, ["q_proj", "lm_head"])
    lang = make_lora(fam["base"], tmp_path / "lang", 2, 0.010, ["q_proj"])
    pool = ExpertPool(
        task=[ExpertRef(path=task, kind="lora")],
        language=[ExpertRef(path=lang, kind="lora")],
        base=base,
    )
    recipe = parse_recipe(
        {"method": "layer_swap", "task_expert": task, "language_expert": lang, "base": base,
         "bottom": 1, "top": 0}
    )  # fmt: skip
    want = r"tensor 'lm_head.weight' must be \[\d+, \d+\] for the adapters' LoRA on it, found no such tensor"  # fmt: skip
    with pytest.raises(ValueError, match=want):
        merge_lora_to_disk(recipe, tmp_path / "best", fold=True)
    with pytest.raises(ValueError, match=f"{task}: folded into base: {want}"):
        LiveModel(ExpertCache(base), pool).load(recipe)
