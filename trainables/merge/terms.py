"""The vocabulary of merge assemblies: ops over checkpoint terms, and the arithmetic of term lists.

An assembly maps every output tensor to an op: `Linear` (a weighted sum of checkpoint tensors; one
term with coefficient 1 is a plain take) or `DeltaMerge` (task arithmetic / TIES over deltas
from a base). Term lists are the checkpoints and coefficients an op reads; soups, magnitude
weights and transition weights are computed on them here, before any tensor is touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from layerswap.spaces.recipe import ExpertSoup, LayerSwapRecipe, ModelRef, RecipeError, SoupWeights

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

    @property
    def refs(self) -> tuple[str, ...]:
        """The checkpoints it reads, in the order its tensors are combined."""
        return tuple(r for r, _ in self.terms)


@dataclass(frozen=True)
class DeltaMerge:
    """Task arithmetic (density None) or TIES over deltas from `base`."""

    base: str
    models: tuple[str, ...]
    weights: tuple[float, ...]
    scale: float
    density: float | None

    @property
    def take(self) -> None:
        """Never copied whole: a delta merge always computes."""
        return None

    @property
    def refs(self) -> tuple[str, ...]:
        """The checkpoints it reads: the base, then the models."""
        return (self.base, *self.models)


Op = Linear | DeltaMerge
Assembly = dict[str, Op]
# Mean row-wise MAV of (sum of terms - base); supplied by whoever holds the tensors.
MagnitudeOracle = Callable[[Terms], float]


def combine(*parts: tuple[Terms, float]) -> Terms:
    """Scale and add term lists, merging repeated checkpoints; drops zero coefficients."""
    acc: dict[str, float] = {}
    for terms, scale in parts:
        for ref, c in terms:
            acc[ref] = acc.get(ref, 0.0) + c * scale
    return tuple((r, c) for r, c in acc.items() if c != 0.0)


def normalise(weights: list[float], field: str) -> list[float]:
    total = sum(weights)
    if total <= 0:
        raise RecipeError(f"{field}: weights sum to {total}; need a positive sum")
    return [w / total for w in weights]


def magnitude_weights(members: list[Terms], mav: MagnitudeOracle, field: str) -> list[float]:
    """Inverse mean row-wise MAV of each member's delta from base, normalised."""
    inv = []
    for terms in members:
        m = mav(terms)
        if m == 0.0:
            raise RecipeError(
                f"{field}: magnitude weights undefined, {[r for r, _ in terms]} equal base"
            )
        inv.append(1.0 / m)
    return normalise(inv, field)


def soup_terms(refs: list[str], weights: SoupWeights, mav: MagnitudeOracle, field: str) -> Terms:
    members = [((r, 1.0),) for r in refs]
    if weights == "uniform":
        w = [1.0 / len(refs)] * len(refs)
    elif weights == "magnitude":
        w = magnitude_weights(members, mav, field)
    else:
        w = normalise(list(weights), field)
    return combine(*zip(members, w, strict=True))


def expert_terms(ref: ModelRef, mav: MagnitudeOracle, field: str) -> Terms:
    if isinstance(ref, ExpertSoup):
        return soup_terms(ref.soup, ref.weights, mav, f"{field}.weights")
    return ((ref, 1.0),)


def transition_weights(
    recipe: LayerSwapRecipe, task: Terms, language: Terms, mav: MagnitudeOracle
) -> tuple[float, float]:
    """Normalised (w_task, w_language) for transition layers and averaged non-layer tensors."""
    tw = recipe.transition_weights
    if tw == "magnitude":
        w = magnitude_weights([task, language], mav, "transition_weights")
        return w[0], w[1]
    w = normalise([tw.task, tw.language], "transition_weights")
    return w[0], w[1]
