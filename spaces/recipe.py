"""Merge recipes as validated data: layer swap, soups, TIES, task arithmetic, revert.

A recipe is loaded once from YAML (`load_recipe`) into typed, frozen pydantic models and carries
a stable hash id (`recipe_id`), which hashes the checkpoints it names by their content ids when
the caller gives them (trainables.model_ids computes them: this module does no I/O beyond
reading/writing the YAML). Pure data: no torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import ConfigDict, Field, TypeAdapter, model_validator

from layerswap.spaces.base import StrictModel, load_yaml, resolve_local, validate
from layerswap.spaces.partitions import PARTITIONS, PartitionName

Side = Literal["task", "language"]
Component = Literal["attention", "mlp"]
COMPONENTS: tuple[Component, ...] = ("attention", "mlp")


class RecipeError(ValueError):
    """A recipe that cannot be loaded or does not fit the models it names."""


class Zones(StrictModel):
    """Layer-swap boundaries (docs/method.md): bottom `b`, top `u`, transitions `t_b`, `t_u`."""

    bottom: int = Field(ge=0)
    """Layers at the bottom taken from the language expert (b)."""
    top: int = Field(ge=0)
    """Layers at the top taken from the language expert (u)."""
    bottom_transition: int = Field(0, ge=0)
    """Layers above the bottom zone that average the two experts (t_b)."""
    top_transition: int = Field(0, ge=0)
    """Layers below the top zone that average the two experts (t_u)."""

    @property
    def min_depth(self) -> int:
        return self.bottom + self.bottom_transition + self.top_transition + self.top


class SideWeights(StrictModel):
    """Explicit transition/average weights of the two experts."""

    task: float = Field(1.0, ge=0)
    """Weight of the task (math) expert; the two weights are normalised to sum to 1."""
    language: float = Field(1.0, ge=0)
    """Weight of the language expert; the two weights are normalised to sum to 1."""

    @model_validator(mode="after")
    def _not_both_zero(self) -> SideWeights:
        if self.task + self.language <= 0:
            raise ValueError(
                f"transition_weights must not both be zero (task={self.task}, "
                f"language={self.language})"
            )
        return self


SoupWeights = Literal["uniform", "magnitude"] | list[float]


def _check_soup_weights(weights: SoupWeights, n: int, field: str) -> None:
    if isinstance(weights, list):
        if len(weights) != n:
            raise ValueError(f"{field}: {len(weights)} weights given for {n} models")
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"{field}: weights must be >= 0 with a positive sum, got {weights}")


class ExpertSoup(StrictModel):
    """An expert given as a soup of checkpoints (e.g. three language experts averaged)."""

    soup: list[str] = Field(min_length=1)
    """Checkpoints averaged into this expert (paths, Hub ids or URIs)."""
    weights: SoupWeights = "uniform"
    """"uniform", "magnitude" (each checkpoint by 1 / the mean absolute size of its change from
    `base`) or one weight per checkpoint."""

    @model_validator(mode="after")
    def _weights_fit(self) -> ExpertSoup:
        _check_soup_weights(self.weights, len(self.soup), "soup.weights")
        return self


ModelRef = str | ExpertSoup


class RevertSpec(StrictModel):
    """Reset parameters to the base model after merging (train-then-revert).

    Either explicit `layers` (with `components`), or everything a `partition` allocates to
    `side`; `non_layer` also resets embeddings, final norm and lm_head.
    """

    layers: list[int] | None = None
    """Decoder layers (0-based) to reset; or give `partition` and `side` instead."""
    components: list[Component] = Field(default_factory=lambda: list(COMPONENTS), min_length=1)
    """Which parts of the selected layers are reset: attention, MLP or both."""
    partition: PartitionName | None = None
    """A named partition (A, B, C) whose `side` is reset; needs `side`."""
    side: Side | None = None
    """The side of `partition` that is reset: "task" or "language"."""
    non_layer: bool = False
    """Also reset embeddings, final norm and lm_head to the base."""

    @model_validator(mode="after")
    def _one_selector(self) -> RevertSpec:
        if self.partition is not None and self.side is None:
            raise ValueError(f"revert: partition {self.partition!r} needs side: task|language")
        if self.side is not None and self.partition is None:
            raise ValueError(f"revert: side {self.side!r} needs a partition")
        if self.partition is not None and self.layers is not None:
            raise ValueError("revert: give either layers or partition, not both")
        if self.partition is None and self.layers is None and not self.non_layer:
            raise ValueError("revert: selects nothing; give layers, partition+side or non_layer")
        if self.layers is not None and any(i < 0 for i in self.layers):
            raise ValueError(f"revert.layers must be >= 0, got {self.layers}")
        return self


class _RecipeBase(StrictModel):
    base: str | None = None
    """The base checkpoint the experts were fine-tuned from; needed by magnitude weights, revert
    and LoRA adapter experts."""
    revert: list[RevertSpec] = Field(default_factory=list)
    """Parameters reset to `base` after merging (train-then-revert), one selector per entry."""

    @model_validator(mode="after")
    def _revert_needs_base(self):
        if self.revert and self.base is None:
            raise ValueError("revert needs `base` (the checkpoint to reset parameters to)")
        return self


def _partition_schema(schema: dict) -> None:
    """The JSON Schema also accepts `partition: A` (what `LayerSwapRecipe._expand_partition`
    expands) in place of the zone keys it sets."""
    set_by = sorted(set().union(*PARTITIONS.values()))
    schema["properties"]["partition"] = {
        "enum": sorted(PARTITIONS),
        "description": f"A named partition standing for the keys it sets ({', '.join(set_by)}).",
    }
    needed = [k for k in schema.get("required", []) if k in set_by]
    schema["required"] = [k for k in schema.get("required", []) if k not in set_by]
    schema["anyOf"] = [{"required": needed}, {"required": ["partition"]}]


class LayerSwapRecipe(_RecipeBase):
    """Layer swapping of a task (math) expert and a language expert (ICLR 2025, Alg. 1).

    Layers outside [b, L-u) come from the language expert, the middle from the task expert,
    transition zones are weighted averages. `attention`/`mlp` override the layer-level zones per
    component (a whole side, or zones of their own), which is how partitions A/B/C are written;
    `partition: A` (or B, C) is shorthand for the keys that partition sets.
    """

    model_config = ConfigDict(json_schema_extra=_partition_schema)

    method: Literal["layer_swap"]
    """Selects this method."""
    task_expert: ModelRef
    """The task (math) expert, which gives the middle layers: a checkpoint, or a soup of them."""
    language_expert: ModelRef
    """The language expert, which gives the bottom and top layers: a checkpoint, or a soup."""
    bottom: int = Field(ge=0)
    """Bottom layers taken from the language expert (b); `partition:` may set it."""
    top: int = Field(ge=0)
    """Top layers taken from the language expert (u); `partition:` may set it."""
    bottom_transition: int = Field(0, ge=0)
    """Layers above the bottom zone that average the two experts (t_b)."""
    top_transition: int = Field(0, ge=0)
    """Layers below the top zone that average the two experts (t_u)."""
    attention: Zones | Side | None = None
    """Attention's own zones, or a whole side ("task"/"language"); None: the layer zones."""
    mlp: Zones | Side | None = None
    """The MLP's own zones, or a whole side ("task"/"language"); None: the layer zones."""
    transition_weights: SideWeights | Literal["magnitude"] = SideWeights()
    """Weights of the experts in transition layers and averaged non-layer tensors, or
    "magnitude" (each expert by 1 / the size of its change from `base`; needs `base`)."""
    non_layer: Literal["average", "language", "task"] = "average"
    """Where embeddings, final norm and lm_head come from: averaged, or one expert's."""

    @model_validator(mode="before")
    @classmethod
    def _expand_partition(cls, data):
        # `partition: A` is shorthand for the component zones it stands for; the stored recipe
        # is the expanded form, so its hash equals that of the same recipe written out by hand.
        if isinstance(data, dict) and "partition" in data:
            data = dict(data)
            name = data.pop("partition")
            if name not in PARTITIONS:
                raise ValueError(f"partition: unknown {name!r}; known: {sorted(PARTITIONS)}")
            for key, value in PARTITIONS[name].items():
                if key in data and data[key] != value:
                    raise ValueError(f"partition {name} sets {key}; do not also give {key}")
                data[key] = value
        return data

    @model_validator(mode="after")
    def _transitions_used(self) -> LayerSwapRecipe:
        # Both components with their own spec: the layer-level zones merge nothing, yet are
        # stored and hashed; a transition there (partition A + bottom_transition: 2) would claim
        # a swap not made, unless they repeat a component's (the search's form: the MLP's).
        # bottom/top stay unchecked: training partitions build recipes with any.
        if self.attention is None or self.mlp is None or self.zones in (self.attention, self.mlp):
            return self
        for name in ("bottom_transition", "top_transition"):
            if value := getattr(self, name):
                raise ValueError(
                    f"{name} {value} is used by no component: attention and mlp both have their "
                    "own spec (a partition such as A sets both); give the transition in mlp or "
                    "attention (with a partition: write out its keys instead of `partition:`)"
                )
        return self

    @model_validator(mode="after")
    def _magnitude_needs_base(self) -> LayerSwapRecipe:
        needs = self.transition_weights == "magnitude" or any(
            isinstance(e, ExpertSoup) and e.weights == "magnitude"
            for e in (self.task_expert, self.language_expert)
        )
        if needs and self.base is None:
            raise ValueError("magnitude weights need `base` (deltas are measured from it)")
        return self

    @property
    def zones(self) -> Zones:
        return Zones(
            bottom=self.bottom,
            top=self.top,
            bottom_transition=self.bottom_transition,
            top_transition=self.top_transition,
        )

    def component_zones(self, component: Component) -> Zones | Side:
        override = getattr(self, component)
        return self.zones if override is None else override


class SoupRecipe(_RecipeBase):
    """Model soup: a (uniform, magnitude-adjusted or explicit) weighted average of N models."""

    method: Literal["soup"]
    """Selects this method."""
    models: list[str] = Field(min_length=2)
    """The checkpoints averaged (paths, Hub ids or URIs)."""
    weights: SoupWeights = "uniform"
    """"uniform", "magnitude" (each model by 1 / the mean absolute size of its change from
    `base`; needs `base`) or one weight per model."""

    @model_validator(mode="after")
    def _weights_fit(self) -> SoupRecipe:
        _check_soup_weights(self.weights, len(self.models), "weights")
        if self.weights == "magnitude" and self.base is None:
            raise ValueError("magnitude weights need `base` (deltas are measured from it)")
        return self


class _DeltaRecipe(_RecipeBase):
    base: str
    """The base checkpoint; each model enters as its difference (delta) from it."""
    models: list[str] = Field(min_length=1)
    """The fine-tuned checkpoints whose deltas are combined."""
    weights: list[float] | None = None
    """One weight per model (None: all 1)."""
    scale: float = 1.0
    """Factor on the combined delta before it is added to `base`."""

    @model_validator(mode="after")
    def _weights_fit(self):
        if self.weights is not None and len(self.weights) != len(self.models):
            raise ValueError(f"weights: {len(self.weights)} given for {len(self.models)} models")
        return self

    @property
    def model_weights(self) -> list[float]:
        return self.weights if self.weights is not None else [1.0] * len(self.models)


class TaskArithmeticRecipe(_DeltaRecipe):
    """base + scale * sum_i w_i (theta_i - base)  (Ilharco et al., 2023)."""

    method: Literal["task_arithmetic"]
    """Selects this method."""


class TiesRecipe(_DeltaRecipe):
    """TIES (Yadav et al., 2023): trim deltas to `density`, elect signs, disjoint weighted mean."""

    method: Literal["ties"]
    """Selects this method."""
    density: float = Field(0.2, gt=0, le=1)
    """Share of each delta's entries kept (the largest by magnitude) before the sign election."""

    @model_validator(mode="after")
    def _weights_non_negative(self) -> TiesRecipe:
        # The disjoint mean divides by the sum of agreeing weights: a negative weight would
        # make that sum <= 0 and silently zero the entry. Negation is task arithmetic's job.
        if self.weights is not None and any(w < 0 for w in self.weights):
            raise ValueError(f"ties: weights must be >= 0, got {self.weights}")
        return self


Recipe = Annotated[
    LayerSwapRecipe | SoupRecipe | TaskArithmeticRecipe | TiesRecipe,
    Field(discriminator="method"),
]
_RECIPE = TypeAdapter(Recipe)


def parse_recipe(data: object, source: str = "recipe") -> Recipe:
    """Validate a mapping into a recipe; errors name `source` and every offending field."""
    return validate(
        _RECIPE,
        data,
        source=source,
        what="recipe",
        top="<recipe>",
        error=RecipeError,
        not_a_mapping=f"{source}: expected a mapping with a `method` key, got {data!r}",
    )


def _resolve_paths(data: dict, root: Path) -> dict:
    """Checkpoint paths by the one path rule (spaces.base.resolve_local), soups member by member."""

    def fix(ref):
        if isinstance(ref, dict) and isinstance(ref.get("soup"), list):
            return {**ref, "soup": [fix(r) for r in ref["soup"]]}
        return resolve_local(ref, root)

    out = dict(data)
    for key in ("task_expert", "language_expert", "base"):
        if key in out:
            out[key] = fix(out[key])
    if isinstance(out.get("models"), list):
        out["models"] = [fix(r) for r in out["models"]]
    return out


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe YAML file.

    Args:
        path: the YAML file.
    Returns:
        The typed recipe (relative checkpoint paths resolved against the file's folder).
    """
    path = Path(path)
    data = load_yaml(path, "recipe", RecipeError)
    if isinstance(data, dict):
        data = _resolve_paths(data, path.parent)
    return parse_recipe(data, source=str(path))


def recipe_dict(recipe: Recipe) -> dict:
    """The recipe as plain data (what goes to YAML and into the hash)."""
    return recipe.model_dump(mode="json", exclude_defaults=False)


# The fields that name checkpoints, in the order a merge first mentions them (experts, then the
# models of soups and delta methods, then base).
_REF_FIELDS = ("task_expert", "language_expert", "models", "base")


def _map_refs(data: dict, fix) -> dict:
    """`data` (a recipe_dict) with every checkpoint reference replaced by `fix(ref)`."""

    def one(ref):
        if isinstance(ref, dict):  # an expert soup
            return {**ref, "soup": [fix(r) for r in ref["soup"]]}
        return None if ref is None else fix(ref)

    out = dict(data)
    for key in _REF_FIELDS:
        if key in out:
            value = out[key]
            out[key] = [one(r) for r in value] if isinstance(value, list) else one(value)
    return out


def model_refs(recipe: Recipe) -> list[str]:
    """Every checkpoint reference a recipe names (experts and their soup members, models, base).

    Args:
        recipe: a validated recipe.
    Returns:
        The references as written (paths, Hub ids, URIs), first mention first, no duplicates.
    """
    refs: list[str] = []
    _map_refs(recipe_dict(recipe), refs.append)
    return list(dict.fromkeys(refs))


def recipe_id(recipe: Recipe, model_ids: Mapping[str, str] | None = None) -> str:
    """Stable 12-hex-digit id: sha256 of the canonical JSON of the recipe's fields.

    Args:
        recipe: a validated recipe.
        model_ids: {reference: content id} for every reference in `model_refs(recipe)`; each
            reference is replaced by its content id before hashing, so the id names what the
            recipe computes wherever its checkpoints are stored. None: the references as
            written (an id that changes with the checkpoints' paths).
    Returns:
        12 hex digits.
    """
    data = recipe_dict(recipe)
    if model_ids is not None:
        missing = [r for r in model_refs(recipe) if r not in model_ids]
        if missing:
            raise ValueError(f"recipe_id: no content id given for {missing}")
        data = _map_refs(data, model_ids.__getitem__)
    canon = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


def dump_recipe(recipe: Recipe, rid: str | None = None) -> str:
    """YAML text that `load_recipe` reads back into an equal recipe.

    Args:
        recipe: a validated recipe.
        rid: the id to name in the header comment (the content id,
            trainables.model_ids.content_recipe_id); None: the header names none.
    Returns:
        The YAML text, checkpoint references as written.
    """
    header = "# layerswap recipe" + (f" {rid}" if rid else "") + "\n"
    return header + yaml.safe_dump(recipe_dict(recipe), sort_keys=False)
