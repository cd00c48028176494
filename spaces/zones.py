"""Which expert owns each layer of a layer swap: the zone table of docs/method.md, as pure functions.

Used by the merge assembly (trainables/merge/methods.py) and by anything (search, training) that reasons about swap boundaries.
"""

from __future__ import annotations

from typing import Literal

from layerswap.spaces.recipe import (
    COMPONENTS,
    Component,
    LayerSwapRecipe,
    RecipeError,
    RevertSpec,
    Side,
    Zones,
)

LayerSource = Literal["language", "task", "transition"]


def check_fits(zones: Zones, num_layers: int, field: str = "recipe") -> None:
    """Raise RecipeError unless b + t_b + t_u + u <= L."""
    if zones.min_depth > num_layers:
        raise RecipeError(
            f"{field}: bottom ({zones.bottom}) + bottom_transition ({zones.bottom_transition}) + "
            f"top_transition ({zones.top_transition}) + top ({zones.top}) = {zones.min_depth} "
            f"exceeds the model's {num_layers} layers"
        )


def layer_source(zones: Zones, num_layers: int, layer: int) -> LayerSource:
    """Source of transformer layer `layer` (0-based) in a model of `num_layers` layers.

    [0, b) language | [b, b+t_b) transition | [b+t_b, L-u-t_u) task |
    [L-u-t_u, L-u) transition | [L-u, L) language.
    """
    b, u, tb, tu, n = (
        zones.bottom,
        zones.top,
        zones.bottom_transition,
        zones.top_transition,
        num_layers,
    )
    if not 0 <= layer < n:
        raise IndexError(f"layer {layer} outside [0, {n})")
    if layer < b or layer >= n - u:
        return "language"
    if layer < b + tb or layer >= n - u - tu:
        return "transition"
    return "task"


def layer_map(recipe: LayerSwapRecipe, num_layers: int) -> dict[Component, list[LayerSource]]:
    """Per component, the source of every layer. Validates the boundaries against the depth."""
    # The layer-level zones too when both components override them: they are unused then, but
    # they are in the recipe stored with the model (and in its id), so `bottom: 100` on 6
    # layers must not pass as a valid recipe.
    check_fits(recipe.zones, num_layers, "recipe")
    out: dict[Component, list[LayerSource]] = {}
    for comp in COMPONENTS:
        spec = recipe.component_zones(comp)
        if isinstance(spec, str):  # a whole side
            out[comp] = [spec] * num_layers
        else:
            field = "recipe" if getattr(recipe, comp) is None else f"recipe.{comp}"
            check_fits(spec, num_layers, field)
            out[comp] = [layer_source(spec, num_layers, i) for i in range(num_layers)]
    return out


def unused_sides(owner: dict[Component, list[LayerSource]]) -> list[Side]:
    """The sides whose expert owns no layer of any component in `owner` (a layer_map); a
    transition layer counts for both. E.g. partition B (first 8 + last 4 layers) on 12 layers
    gives the task expert none."""
    used = {source for sources in owner.values() for source in sources}
    return [] if "transition" in used else [s for s in ("task", "language") if s not in used]


def reverted(specs: list[RevertSpec], num_layers: int) -> tuple[set[tuple[int, Component]], bool]:
    """The (layer, component) pairs the revert specs reset to base, and whether non-layer is reset."""

    cells: set[tuple[int, Component]] = set()
    non_layer = False
    for spec in specs:
        non_layer |= spec.non_layer
        if spec.layers is not None:
            bad = [i for i in spec.layers if i >= num_layers]
            if bad:
                raise RecipeError(f"revert.layers {bad} outside the model's {num_layers} layers")
            cells |= {(i, c) for i in spec.layers for c in spec.components}
        if spec.partition is not None:
            part = LayerSwapRecipe.model_validate(
                {
                    "method": "layer_swap",
                    "task_expert": "-",
                    "language_expert": "-",
                    "partition": spec.partition,
                }
            )
            owner = layer_map(part, num_layers)
            side: Side = spec.side  # type: ignore[assignment]
            cells |= {(i, c) for c in spec.components for i, s in enumerate(owner[c]) if s == side}
    return cells, non_layer


def paper_default(num_layers: int) -> Zones:
    """The ICLR paper's default swap (b=5, u=2, no transitions on 32 layers), scaled to depth.

    Rounds half up so 16 layers -> b=3, u=1; never fewer than one bottom language layer.
    """
    if num_layers < 2:
        raise RecipeError(f"layer swapping needs at least 2 layers, got {num_layers}")
    bottom = max(1, int(5 * num_layers / 32 + 0.5))
    top = int(2 * num_layers / 32 + 0.5)
    return Zones(bottom=min(bottom, num_layers - 1), top=top)
