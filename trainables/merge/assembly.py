"""Recipe -> per-tensor merge assembly: which checkpoints each output tensor is assembled from.

(An assembly, not a plan: in layerswap a plan is an offline forecast of what a run needs,
`layerswap plan` and `layerswap train --plan`.) Pure: takes tensor names, the depth and a
magnitude oracle, touches no files. The disk engine and the in-memory composer both execute the
assembly this builds, so they cannot disagree. Each method's own assembler is in
trainables/merge/methods.py; revert applies to every method here.
"""

from __future__ import annotations

from collections.abc import Iterable

from layerswap.spaces.recipe import Recipe, RecipeError, model_refs
from layerswap.spaces.zones import reverted
from layerswap.trainables.merge.arch import param_slot
from layerswap.trainables.merge.methods import method_of
from layerswap.trainables.merge.terms import Assembly, Linear, MagnitudeOracle, Terms


def recipe_refs(recipe: Recipe) -> list[str]:
    """Every checkpoint a recipe reads, in first-mention order, without duplicates (the
    references its content id hashes: spaces.recipe.model_refs)."""
    return model_refs(recipe)


def primary_ref(recipe: Recipe) -> str:
    """The checkpoint whose config and tokenizer the merged output carries."""
    return method_of(recipe).primary(recipe)


def build_assembly(
    recipe: Recipe, names: Iterable[str], num_layers: int, mav: MagnitudeOracle | None = None
) -> Assembly:
    """Decide, for every tensor name, how the merged tensor is made.

    Args:
        recipe: a validated recipe.
        names: tensor names of the checkpoints (identical across them; checked by the caller).
        num_layers: the models' num_hidden_layers.
        mav: magnitude oracle; needed only for magnitude weights.
    Returns:
        {tensor name: Linear | DeltaMerge}, in the order of `names`.
    """
    names = list(names)
    for name in names:
        slot = param_slot(name)
        if slot.layer is not None and slot.layer >= num_layers:
            raise RecipeError(
                f"tensor {name!r}: layer {slot.layer} but the config has {num_layers}"
            )

    def no_oracle(_terms: Terms) -> float:
        raise RecipeError("magnitude weights need `base`")

    mav = mav or no_oracle
    assembly = method_of(recipe).assemble(recipe, names, num_layers, mav)

    if recipe.revert:
        cells, non_layer = reverted(recipe.revert, num_layers)
        base = Linear(((recipe.base, 1.0),))
        for name in names:
            slot = param_slot(name)
            hit = non_layer if slot.layer is None else (slot.layer, slot.component) in cells
            if hit:
                assembly[name] = base
    return assembly
