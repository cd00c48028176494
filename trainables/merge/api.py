"""The merge engine's entry points: `merge(recipe, out)` and `export_mergekit(recipe)`.

`merge` sends layer swaps of two PEFT LoRA adapters to trainables.merge.lora (swapped as
adapters, or folded into full weights) and everything else through the disk engine
(trainables.merge.engine); `layerswap merge` and promotion's best model both call it.
`export_mergekit` reads the checkpoints' depth (and magnitudes, for magnitude weights) and
writes the equivalent mergekit config (`layerswap merge --export-mergekit`).
"""

from __future__ import annotations

from pathlib import Path

from layerswap.spaces.recipe import Recipe
from layerswap.trainables.merge.assembly import recipe_refs
from layerswap.trainables.merge.checkpoint import CheckpointError
from layerswap.trainables.merge.engine import (
    DEFAULT_SHARD_BYTES,
    disk_mav_oracle,
    merge_to_disk,
    open_refs_depth,
    resolve_ref,
)
from layerswap.trainables.merge.lora import is_lora_adapter, merge_lora_to_disk
from layerswap.trainables.merge.mergekit_export import mergekit_yaml


def is_lora_recipe(recipe: Recipe) -> bool:
    """Whether `recipe` layer-swaps LoRA adapter experts (both experts adapter folders).

    Raises:
        CheckpointError when one expert is an adapter and the other a full checkpoint; soups
        go to the disk engine, which checks their members' kinds.
    """
    experts = {f: getattr(recipe, f, None) for f in ("task_expert", "language_expert")}
    if recipe.method != "layer_swap" or not all(isinstance(e, str) for e in experts.values()):
        _refuse_adapters(recipe)
        return False
    paths = {f: resolve_ref(ref) for f, ref in experts.items()}
    lora = [f for f, path in paths.items() if is_lora_adapter(path)]
    if len(lora) == 1:
        full = next(f for f in paths if f not in lora)
        raise CheckpointError(
            f"{full} is a full checkpoint but {lora[0]} is a LoRA adapter ({paths[lora[0]]}); "
            "both must be one kind"
        )
    return bool(lora)


def _refuse_adapters(recipe: Recipe) -> None:
    """Soups, TIES and soup experts over LoRA adapters: not built on disk (the search and
    promotion compose them in memory only), so refused in one line saying what works.

    Raises:
        CheckpointError naming the method and the first adapter.
    """
    adapter = next((r for r in recipe_refs(recipe) if is_lora_adapter(r)), None)
    if adapter is None:
        return
    what = "layer_swap with a soup expert" if recipe.method == "layer_swap" else recipe.method
    raise CheckpointError(
        f"{what} over LoRA adapters ({adapter}) is not supported by `layerswap merge`, which "
        "merges adapters in layer_swap recipes of two adapter experts only; fold each adapter "
        "into a full model first (PEFT's merge_and_unload()) and merge those"
    )


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


def export_mergekit(recipe: Recipe) -> str:
    """The mergekit 0.1.5 YAML equivalent to a layer_swap recipe on its checkpoints.

    Raises:
        ValueError for other methods, RecipeError for what mergekit cannot express.
    """
    if recipe.method != "layer_swap":
        raise ValueError(f"--export-mergekit: only layer_swap recipes, not {recipe.method!r}")
    ckpts, depth = open_refs_depth(recipe)
    try:
        mav = disk_mav_oracle(ckpts, recipe.base) if recipe.base is not None else None
        return mergekit_yaml(recipe, depth, mav=mav)
    finally:
        for ck in ckpts.values():
            ck.close()
