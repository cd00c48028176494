"""The merge-method table: one entry per recipe `method`, naming what it reads and assembles.

Adding a method is one recipe model in spaces/recipe.py (added to its `Recipe` union) plus one
`MergeMethod` entry here: the checkpoint whose config and tokenizer the output carries, and its
assembler (recipe, tensor names, depth, magnitude oracle ->
assembly). The disk engine, the in-memory composer and the search all reach methods through
`method_of`. The checkpoints a recipe reads are its reference fields
(spaces.recipe.model_refs), the same list its content id hashes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from layerswap.spaces.recipe import (
    LayerSwapRecipe,
    Recipe,
    SoupRecipe,
    TaskArithmeticRecipe,
    TiesRecipe,
)
from layerswap.spaces.zones import layer_map, unused_sides
from layerswap.trainables.merge.arch import param_slot
from layerswap.trainables.merge.terms import (
    Assembly,
    DeltaMerge,
    Linear,
    MagnitudeOracle,
    combine,
    expert_terms,
    soup_terms,
    transition_weights,
)


@dataclass(frozen=True)
class MergeMethod:
    """How one recipe `method` is merged.

    recipe: its recipe model. primary: the checkpoint whose config and tokenizer the output
    carries. assemble: its assembler.
    """

    recipe: type
    primary: Callable[[Recipe], str]
    assemble: Callable[[Recipe, list[str], int, MagnitudeOracle], Assembly]


def _task_primary(recipe: LayerSwapRecipe) -> str:
    e = recipe.task_expert
    return e if isinstance(e, str) else e.soup[0]


def warn_unused_sides(recipe: Recipe, num_layers: int) -> None:
    """Say on stderr when a layer swap takes no layer from one expert (its zones cover the whole
    depth): valid, but most likely a recipe written for a deeper model (the paper's partitions
    are for 32 layers), whose merge is the other expert's layers. For the merges a user asks
    for (the disk engine, LoRA merges); the search's live model composes sampled recipes, which
    on a model of a few layers may round a zone to 0 by design, and says nothing."""
    if recipe.method != "layer_swap":
        return
    for side in unused_sides(layer_map(recipe, num_layers)):
        print(
            f"layerswap: warning: the recipe gives {side}_expert none of the model's "
            f"{num_layers} layers: every layer is the other expert's",
            file=sys.stderr,
        )


def _layer_swap_assembly(
    recipe: LayerSwapRecipe, names: Iterable[str], num_layers: int, mav: MagnitudeOracle
) -> Assembly:
    task = expert_terms(recipe.task_expert, mav, "task_expert")
    lang = expert_terms(recipe.language_expert, mav, "language_expert")
    w_task, w_lang = transition_weights(recipe, task, lang, mav)
    by_source = {
        "task": Linear(task),
        "language": Linear(lang),
        "transition": Linear(combine((task, w_task), (lang, w_lang))),
    }
    non_layer = {"average": "transition", "language": "language", "task": "task"}[recipe.non_layer]
    owner = layer_map(recipe, num_layers)
    assembly: Assembly = {}
    for name in names:
        slot = param_slot(name)
        if slot.layer is None:
            assembly[name] = by_source[non_layer]
        else:
            assembly[name] = by_source[owner[slot.component][slot.layer]]
    return assembly


def _soup_assembly(
    recipe: SoupRecipe, names: list[str], _depth: int, mav: MagnitudeOracle
) -> Assembly:
    op = Linear(soup_terms(recipe.models, recipe.weights, mav, "weights"))
    return {n: op for n in names}


def _delta_assembly(recipe: TaskArithmeticRecipe | TiesRecipe, names: list[str], _depth: int, mav: MagnitudeOracle) -> Assembly:  # fmt: skip
    density = getattr(recipe, "density", None)  # TIES trims; task arithmetic does not
    op = DeltaMerge(recipe.base, tuple(recipe.models), tuple(recipe.model_weights), recipe.scale, density)  # fmt: skip
    return {n: op for n in names}


def _first_model(recipe) -> str:
    return recipe.models[0]


METHODS: dict[str, MergeMethod] = {
    "layer_swap": MergeMethod(LayerSwapRecipe, _task_primary, _layer_swap_assembly),
    "soup": MergeMethod(SoupRecipe, _first_model, _soup_assembly),
    "task_arithmetic": MergeMethod(TaskArithmeticRecipe, _first_model, _delta_assembly),
    "ties": MergeMethod(TiesRecipe, _first_model, _delta_assembly),
}


def method_of(recipe: Recipe) -> MergeMethod:
    """The table entry of a validated recipe."""
    return METHODS[recipe.method]
