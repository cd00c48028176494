"""Recipe -> per-tensor merge plan: which checkpoints each output tensor is made of.

Pure: takes tensor names, the depth and a magnitude oracle, touches no files. The disk engine
and the in-memory composer both execute the plan this builds, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from spaces.recipe import (
    ExpertSoup,
    LayerSwapRecipe,
    ModelRef,
    Recipe,
    RecipeError,
    SoupRecipe,
    SoupWeights,
    TaskArithmeticRecipe,
    TiesRecipe,
)
from spaces.zones import layer_map, reverted
from trainables.merge.arch import param_slot

Terms = tuple[tuple[str, float], ...]  # ((checkpoint ref, coefficient), ...)


@dataclass(frozen=True)
class Linear:
    """sum of coefficient * checkpoint tensor; a single term with coefficient 1 is a plain take."""

    terms: Terms

    @property
    def take(self) -> str | None:
        """The one checkpoint this tensor is copied from unchanged, or None if it is computed."""
        if len(self.terms) == 1 and self.terms[0][1] == 1.0:
            return self.terms[0][0]
        return None


@dataclass(frozen=True)
class DeltaMerge:
    """Task arithmetic (density None) or TIES over deltas from `base`."""

    base: str
    models: tuple[str, ...]
    weights: tuple[float, ...]
    scale: float
    density: float | None


Op = Linear | DeltaMerge
Plan = dict[str, Op]
# Mean row-wise MAV of (sum of terms - base); supplied by whoever holds the tensors.
MagnitudeOracle = Callable[[Terms], float]


def recipe_refs(recipe: Recipe) -> list[str]:
    """Every checkpoint a recipe reads, in first-mention order, without duplicates."""
    refs: list[str] = []
    if isinstance(recipe, LayerSwapRecipe):
        for e in (recipe.task_expert, recipe.language_expert):
            refs += e.soup if isinstance(e, ExpertSoup) else [e]
    else:
        refs += recipe.models
    if recipe.base is not None:
        refs.append(recipe.base)
    return list(dict.fromkeys(refs))


def _combine(*parts: tuple[Terms, float]) -> Terms:
    """Scale and add term lists, merging repeated checkpoints; drops zero coefficients."""
    acc: dict[str, float] = {}
    for terms, scale in parts:
        for ref, c in terms:
            acc[ref] = acc.get(ref, 0.0) + c * scale
    return tuple((r, c) for r, c in acc.items() if c != 0.0)


def _normalise(weights: list[float], field: str) -> list[float]:
    total = sum(weights)
    if total <= 0:
        raise RecipeError(f"{field}: weights sum to {total}; need a positive sum")
    return [w / total for w in weights]


def _magnitude_weights(members: list[Terms], mav: MagnitudeOracle, field: str) -> list[float]:
    """Inverse mean row-wise MAV of each member's delta from base, normalised."""
    inv = []
    for terms in members:
        m = mav(terms)
        if m == 0.0:
            raise RecipeError(
                f"{field}: magnitude weights undefined, {[r for r, _ in terms]} equal base"
            )
        inv.append(1.0 / m)
    return _normalise(inv, field)


def _soup_terms(refs: list[str], weights: SoupWeights, mav: MagnitudeOracle, field: str) -> Terms:
    members = [((r, 1.0),) for r in refs]
    if weights == "uniform":
        w = [1.0 / len(refs)] * len(refs)
    elif weights == "magnitude":
        w = _magnitude_weights(members, mav, field)
    else:
        w = _normalise(list(weights), field)
    return _combine(*zip(members, w, strict=True))


def _expert_terms(ref: ModelRef, mav: MagnitudeOracle, field: str) -> Terms:
    if isinstance(ref, ExpertSoup):
        return _soup_terms(ref.soup, ref.weights, mav, f"{field}.weights")
    return ((ref, 1.0),)


def transition_weights(
    recipe: LayerSwapRecipe, task: Terms, language: Terms, mav: MagnitudeOracle
) -> tuple[float, float]:
    """Normalised (w_task, w_language) for transition layers and averaged non-layer tensors."""
    tw = recipe.transition_weights
    if tw == "magnitude":
        w = _magnitude_weights([task, language], mav, "transition_weights")
        return w[0], w[1]
    w = _normalise([tw.task, tw.language], "transition_weights")
    return w[0], w[1]


def _layer_swap_plan(
    recipe: LayerSwapRecipe, names: Iterable[str], num_layers: int, mav: MagnitudeOracle
) -> Plan:
    task = _expert_terms(recipe.task_expert, mav, "task_expert")
    lang = _expert_terms(recipe.language_expert, mav, "language_expert")
    w_task, w_lang = transition_weights(recipe, task, lang, mav)
    by_source = {
        "task": Linear(task),
        "language": Linear(lang),
        "transition": Linear(_combine((task, w_task), (lang, w_lang))),
    }
    non_layer = {"average": "transition", "language": "language", "task": "task"}[recipe.non_layer]
    owner = layer_map(recipe, num_layers)
    plan: Plan = {}
    for name in names:
        slot = param_slot(name)
        if slot.layer is None:
            plan[name] = by_source[non_layer]
        else:
            plan[name] = by_source[owner[slot.component][slot.layer]]
    return plan


def build_plan(
    recipe: Recipe, names: Iterable[str], num_layers: int, mav: MagnitudeOracle | None = None
) -> Plan:
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
    if isinstance(recipe, LayerSwapRecipe):
        plan = _layer_swap_plan(recipe, names, num_layers, mav)
    elif isinstance(recipe, SoupRecipe):
        op = Linear(_soup_terms(recipe.models, recipe.weights, mav, "weights"))
        plan = {n: op for n in names}
    elif isinstance(recipe, TaskArithmeticRecipe | TiesRecipe):
        density = recipe.density if isinstance(recipe, TiesRecipe) else None
        op = DeltaMerge(
            recipe.base, tuple(recipe.models), tuple(recipe.model_weights), recipe.scale, density
        )
        plan = {n: op for n in names}
    else:  # pragma: no cover - the recipe union is closed
        raise TypeError(type(recipe))

    if recipe.revert:
        cells, non_layer = reverted(recipe.revert, num_layers)
        base = Linear(((recipe.base, 1.0),))
        for name in names:
            slot = param_slot(name)
            hit = non_layer if slot.layer is None else (slot.layer, slot.component) in cells
            if hit:
                plan[name] = base
    return plan
