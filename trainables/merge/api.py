"""`merge(recipe, out)`: the one entry point that merges a recipe to disk, LoRA or full.

Layer swaps of two PEFT LoRA adapters go to trainables.merge.lora (swapped as adapters, or
folded into full weights); everything else streams through the disk engine
(trainables.merge.engine). `layerswap merge` and promotion's best model both call this.
"""

from __future__ import annotations

from pathlib import Path

from spaces.recipe import Recipe
from trainables.merge.engine import DEFAULT_SHARD_BYTES, merge_to_disk, resolve_ref
from trainables.merge.lora import is_lora_adapter, merge_lora_to_disk


def is_lora_recipe(recipe: Recipe) -> bool:
    """Whether `recipe` layer-swaps LoRA adapter experts (its task expert is an adapter folder)."""
    expert = getattr(recipe, "task_expert", None)
    return recipe.method == "layer_swap" and isinstance(expert, str) and is_lora_adapter(resolve_ref(expert))  # fmt: skip


def merge(
    recipe: Recipe,
    out: str | Path,
    *,
    overwrite: bool = False,
    fold: bool = False,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: bool = False,
) -> Path:
    """Merge `recipe` into the folder `out`; the arguments are the disk engine's
    (trainables.merge.engine.merge_to_disk), plus `fold`: LoRA experts only, write full weights
    (base + merged deltas) instead of an adapter. Returns the output folder."""
    if is_lora_recipe(recipe):
        return merge_lora_to_disk(recipe, out, overwrite=overwrite, fold=fold, progress=progress)
    return merge_to_disk(
        recipe, out, overwrite=overwrite, max_shard_bytes=max_shard_bytes, progress=progress
    )
