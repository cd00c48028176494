"""Declarative merge-search spaces, their Optuna define-by-run sampler and the params -> recipe decoder.

`suggest(trial, space, depth, pool)` only calls `trial.suggest_*`; `decode(params, space, depth,
pool)` is pure and returns a validated layer-swap recipe. Pure data: no torch, no ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from layerswap.spaces.base import StrictModel
from layerswap.spaces.recipe import ExpertSoup, LayerSwapRecipe, SideWeights, Zones
from layerswap.spaces.zones import check_fits, paper_default

MergeRecipe = LayerSwapRecipe
Weighting = Literal["uniform", "explicit", "magnitude"]
NonLayer = Literal["average", "language", "task"]
Granularity = Literal["layer", "component"]
ExpertFormat = Literal["full", "lora"]  # full weights or a PEFT LoRA adapter
SOUP = "soup"  # expert choice value: the soup of every expert on that side


class Span(StrictModel):
    """An integer range of layers, absolute (ints) or as fractions of depth (floats in [0, 1]).

    Fractions are rounded half up, so `{low: 0.09375, high: 0.15625}` (3/32..5/32) is 3..5 on
    32 layers and 1..2 on 12. The resolved upper bound is further capped by the depth budget.
    """

    low: int | float = 0
    """Smallest value: layers, or a fraction of depth."""
    high: int | float = 0
    """Largest value: layers, or a fraction of depth (at most 1)."""
    unit: Literal["layers", "fraction"] = "layers"
    """Whether `low`/`high` count "layers" or are a "fraction" of the model's depth."""

    @model_validator(mode="after")
    def _ordered(self) -> Span:
        if self.low < 0 or self.high < self.low:
            raise ValueError(f"span: need 0 <= low <= high, got low={self.low}, high={self.high}")
        if self.unit == "fraction" and self.high > 1:
            raise ValueError(f"span: fractions must be <= 1, got high={self.high}")
        if self.unit == "layers" and not (
            float(self.low).is_integer() and float(self.high).is_integer()
        ):
            raise ValueError(f"span: unit layers needs integers, got {self.low}..{self.high}")
        return self

    def resolve(self, depth: int) -> tuple[int, int]:
        """(low, high) in layers for a model of `depth` layers (clamped to [0, depth])."""
        if self.unit == "layers":
            lo, hi = int(self.low), int(self.high)
        else:
            lo, hi = int(self.low * depth + 0.5), int(self.high * depth + 0.5)
        return min(lo, depth), min(hi, depth)


def _frac(a: int, b: int = 32) -> Span:
    return Span(low=a / b, high=a / b, unit="fraction")


class SearchSpace(StrictModel):
    """What the merge search may vary. The defaults are the papers' ranges scaled to depth.

    ICLR paper, 32 layers: b in {3,4,5}, u in {0,1,2}, t_b, t_u in {0,1,2}; weights uniform or
    magnitude; non-layer parameters averaged. Component granularity is partition A's form:
    attention from one side, the zones applied to the MLP.
    """

    bottom: Span = Span(low=3 / 32, high=5 / 32, unit="fraction")
    """Range of the bottom language layers b (default 3..5 of 32 layers)."""
    top: Span = Span(low=0, high=2 / 32, unit="fraction")
    """Range of the top language layers u (default 0..2 of 32 layers)."""
    bottom_transition: Span = Span(low=0, high=2 / 32, unit="fraction")
    """Range of the bottom transition layers t_b (default 0..2 of 32 layers)."""
    top_transition: Span = Span(low=0, high=2 / 32, unit="fraction")
    """Range of the top transition layers t_u (default 0..2 of 32 layers)."""
    min_task_layers: int = Field(1, ge=0)
    """Layers every candidate keeps from the task expert: b + t_b + t_u + u <= depth - this."""
    weighting: list[Weighting] = Field(
        default_factory=lambda: ["uniform", "magnitude"], min_length=1
    )
    """Transition weightings to choose among: "uniform", "explicit" (a sampled task weight),
    "magnitude" (needs `base`)."""
    explicit_task_weight: tuple[float, float] = (0.2, 0.8)
    """Range (low, high) of the task expert's weight under "explicit" weighting."""
    non_layer: list[NonLayer] = Field(default_factory=lambda: ["average"], min_length=1)
    """Sources of embeddings, final norm and lm_head to choose among: average, language, task."""
    granularity: list[Granularity] = Field(default_factory=lambda: ["layer"], min_length=1)
    """"layer" swaps whole layers; "component" takes attention from one side and applies the
    zones to the MLP (partition A's form)."""
    attention: list[Literal["language", "task"]] = Field(
        default_factory=lambda: ["language"], min_length=1
    )
    """With component granularity: the sides attention may come from."""
    soups: bool = False
    """Also offer the soup of every expert on a side as that side's expert."""
    expert_kinds: list[ExpertFormat] = Field(default_factory=lambda: ["full", "lora"], min_length=1)
    """Expert formats the search may use: full weights and/or LoRA adapters."""

    @model_validator(mode="after")
    def _valid(self) -> SearchSpace:
        lo, hi = self.explicit_task_weight
        if not 0 < lo <= hi < 1:
            raise ValueError(f"explicit_task_weight: need 0 < low <= high < 1, got {lo}, {hi}")
        for name in ("weighting", "non_layer", "granularity", "attention", "expert_kinds"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name}: duplicate choices {values}")
        return self


class ExpertRef(StrictModel):
    """One expert checkpoint the search may use."""

    path: str
    """The checkpoint: a folder, Hub id or URI."""
    expert_id: str | None = None
    """Its id in the expert registry, when it came from there."""
    kind: ExpertFormat = "full"
    """Full weights or a LoRA adapter."""


class ExpertPool(StrictModel):
    """The experts a search draws pairs from (explicit paths or the expert registry)."""

    task: list[ExpertRef] = Field(min_length=1)
    """The task (math) experts."""
    language: list[ExpertRef] = Field(min_length=1)
    """The language experts."""
    base: str | None = None
    """The base checkpoint they were fine-tuned from."""

    @classmethod
    def from_paths(cls, task: list[str], language: list[str], base: str | None = None):
        return cls(
            task=[ExpertRef(path=p) for p in task],
            language=[ExpertRef(path=p) for p in language],
            base=base,
        )


def _choices(pool: ExpertPool | None, side: str, space: SearchSpace) -> list[str]:
    """Categorical values for one side: expert indices (as strings) and maybe "soup"."""
    if pool is None:
        return ["0"]
    refs = getattr(pool, side)
    idx = [str(i) for i, r in enumerate(refs) if r.kind in space.expert_kinds]
    if not idx:
        raise ValueError(f"space.expert_kinds {space.expert_kinds}: no {side} expert of that kind")
    if space.soups and len(idx) > 1:
        idx.append(SOUP)
    return idx


def _weight_matters(space: SearchSpace, transitions: int, non_layer: str) -> bool:
    # Weights are used by transition layers and by averaged non-layer tensors only; not asking
    # otherwise keeps equivalent recipes identical (same recipe id, served once).
    return len(space.weighting) > 1 and (transitions > 0 or non_layer == "average")


def _budget(depth: int, space: SearchSpace) -> int:
    return max(0, depth - space.min_task_layers)


def suggest(trial: Any, space: SearchSpace, depth: int, pool: ExpertPool | None = None) -> dict:
    """Define-by-run sampler: asks `trial` for every parameter, later bounds conditioned on earlier.

    Only calls `trial.suggest_*` (no computation), so it is safe inside Optuna and OptunaSearch.
    b + t_b + t_u + u <= depth - min_task_layers holds by construction.

    Args:
        trial: an optuna Trial (or FixedTrial / Tune's captor).
        space: the search space.
        depth: the experts' num_hidden_layers.
        pool: the experts (None: one pair).
    Returns:
        {} (OptunaSearch reads the params it captured; decode them with `decode`).
    """
    for side in ("task", "language"):
        choices = _choices(pool, side, space)
        if len(choices) > 1:
            trial.suggest_categorical(f"{side}_expert", choices)
    if len(space.granularity) > 1:
        gran = trial.suggest_categorical("granularity", list(space.granularity))
    else:
        gran = space.granularity[0]
    if gran == "component" and len(space.attention) > 1:
        trial.suggest_categorical("attention", list(space.attention))
    room = _budget(depth, space)
    values = {}
    for name in ("bottom", "top", "bottom_transition", "top_transition"):
        lo, hi = getattr(space, name).resolve(depth)
        hi = min(hi, room)
        lo = min(lo, hi)  # the budget wins over a lower bound that no longer fits
        values[name] = trial.suggest_int(name, lo, hi) if hi > lo else lo
        room -= values[name]
    if len(space.non_layer) > 1:
        non_layer = trial.suggest_categorical("non_layer", list(space.non_layer))
    else:
        non_layer = space.non_layer[0]
    transitions = values["bottom_transition"] + values["top_transition"]
    if _weight_matters(space, transitions, non_layer):
        w = trial.suggest_categorical("weights", list(space.weighting))
    else:
        w = space.weighting[0] if (transitions > 0 or non_layer == "average") else "uniform"
    if w == "explicit":
        lo, hi = space.explicit_task_weight
        if hi > lo:
            trial.suggest_float("task_weight", lo, hi)
    return {}


def _expert(pool: ExpertPool | None, side: str, choice: str, space: SearchSpace):
    if pool is None:
        return f"<{side}>"
    refs = getattr(pool, side)
    if choice == SOUP:
        return ExpertSoup(soup=[r.path for r in refs if r.kind in space.expert_kinds])
    i = int(choice)
    if not 0 <= i < len(refs):
        raise ValueError(f"{side}_expert: index {i} outside the {len(refs)} {side} experts")
    return refs[i].path


def _pick(params: dict, pool: ExpertPool | None, side: str, space: SearchSpace) -> str:
    choices = _choices(pool, side, space)
    value = str(params.get(f"{side}_expert", choices[0]))
    if pool is not None and value not in choices and value != SOUP:
        if value.isdigit() and int(value) < len(getattr(pool, side)):
            raise ValueError(f"decode: {side}_expert {value} is not of kind {space.expert_kinds}")
    return value


def decode(
    params: dict, space: SearchSpace, depth: int, pool: ExpertPool | None = None
) -> MergeRecipe:
    """Turn sampled parameters into a layer-swap recipe. Pure; missing keys take the space default.

    Args:
        params: what `suggest` asked for (flat Optuna params).
        space, depth, pool: as given to `suggest`.
    Returns:
        The validated LayerSwapRecipe.
    Raises:
        ValueError naming the parameter that is out of the space or breaks the depth budget.
    """
    known = {"task_expert", "language_expert", "granularity", "attention", "bottom", "top"}
    known |= {"bottom_transition", "top_transition", "non_layer", "weights", "task_weight"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"decode: unknown parameter(s) {unknown}")
    zones = {}
    for name in ("bottom", "top", "bottom_transition", "top_transition"):
        lo, _hi = getattr(space, name).resolve(depth)
        value = int(params.get(name, lo))
        if value < 0:
            raise ValueError(f"decode: {name} must be >= 0, got {value}")
        zones[name] = value
    z = Zones(**zones)
    check_fits(
        z, _budget(depth, space), f"decode (depth {depth}, min_task_layers {space.min_task_layers})"
    )
    gran = params.get("granularity", space.granularity[0])
    if gran not in space.granularity:
        raise ValueError(f"decode: granularity {gran!r} not in {space.granularity}")
    non_layer = params.get("non_layer", space.non_layer[0])
    if non_layer not in space.non_layer:
        raise ValueError(f"decode: non_layer {non_layer!r} not in {space.non_layer}")
    transitions = z.bottom_transition + z.top_transition
    default_w = space.weighting[0] if (transitions > 0 or non_layer == "average") else "uniform"
    w = params.get("weights", default_w)
    if w not in (*space.weighting, "uniform"):
        raise ValueError(f"decode: weights {w!r} not in {space.weighting}")
    if w == "magnitude":
        weights: Any = "magnitude"
    elif w == "explicit":
        t = float(params.get("task_weight", space.explicit_task_weight[0]))
        weights = SideWeights(task=round(t, 6), language=round(1 - t, 6))
    else:
        weights = SideWeights()
    data: dict[str, Any] = {
        "method": "layer_swap",
        "task_expert": _expert(pool, "task", _pick(params, pool, "task", space), space),
        "language_expert": _expert(pool, "language", _pick(params, pool, "language", space), space),
        "base": pool.base if pool is not None else None,
        **zones,
        "transition_weights": weights,
        "non_layer": non_layer,
    }
    if gran == "component":
        data["attention"] = params.get("attention", space.attention[0])
        data["mlp"] = z
    return LayerSwapRecipe.model_validate(data)


def warm_start(space: SearchSpace, depth: int, pool: ExpertPool | None = None) -> dict:
    """The ICLR paper's default swap scaled to depth, as params of this space (for enqueueing).

    Only keys the space asks for are set; values are clamped into the space's ranges, the
    first expert of each side, uniform weights and averaged non-layer parameters when allowed.
    """

    class _Rec:  # replays `suggest`, answering with the paper's values clamped to each range
        def __init__(self):
            self.params: dict = {}
            pd = paper_default(depth)
            self.want = {"bottom": pd.bottom, "top": pd.top, "bottom_transition": 0}
            self.want |= {"top_transition": 0, "granularity": "layer", "non_layer": "average"}
            self.want |= {"weights": "uniform", "task_expert": "0", "language_expert": "0"}

        def suggest_int(self, name, low, high):
            self.params[name] = max(low, min(high, self.want.get(name, low)))
            return self.params[name]

        def suggest_categorical(self, name, choices):
            want = self.want.get(name)
            self.params[name] = want if want in choices else choices[0]
            return self.params[name]

        def suggest_float(self, name, low, high):
            self.params[name] = (low + high) / 2
            return self.params[name]

    rec = _Rec()
    suggest(rec, space, depth, pool)
    return rec.params


def recipe_fields(recipe: MergeRecipe) -> dict:
    """The trials.parquet columns describing a layer-swap recipe (search/results.py COLUMNS)."""
    w = recipe.transition_weights
    weights = w if isinstance(w, str) else f"task={w.task:g},language={w.language:g}"
    gran = "layer" if recipe.attention is None and recipe.mlp is None else "component"
    return {
        "bottom": recipe.bottom,
        "top": recipe.top,
        "bottom_transition": recipe.bottom_transition,
        "top_transition": recipe.top_transition,
        "weights": weights,
        "non_layer": recipe.non_layer,
        "granularity": gran,
    }


def expert_id(pool: ExpertPool, ref) -> str:
    """The id trials.parquet records for an expert (or soup) of the pool: its registry or
    explicit id (explicit_ids); a pool.json written before explicit ids: the folder's name."""
    if isinstance(ref, ExpertSoup):
        return "soup(" + "+".join(expert_id(pool, r) for r in ref.soup) + ")"
    for r in (*pool.task, *pool.language):
        if r.path == ref:
            return r.expert_id or Path(r.path).name
    return Path(str(ref)).name
