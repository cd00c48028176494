"""What a training run trains: its mode (full, lora, partial, simultaneous, mix) and partitions.

The mode models of `TrainExperiment.mode` (spaces/train_experiment.py), LoRA settings and custom
partitions in layer-swap vocabulary. Pure data: no torch, no ray. Tests:
.venv/bin/python -m pytest -q tests/spaces/test_train_experiment.py
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from layerswap.spaces.base import StrictModel
from layerswap.spaces.partitions import PARTITIONS, PartitionName
from layerswap.spaces.recipe import Side, Zones

# Attention and MLP projections of the Llama/Qwen/Mistral families (rsLoRA on all of them).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class PartitionSpec(StrictModel):
    """A custom partition in layer-swap vocabulary: layers [0, bottom) and [L-top, L) are the
    language side, the middle the task side; `attention`/`mlp` override per component (zones of
    their own, or a whole side). `non_layer` (embeddings, final norm, lm_head): which side owns
    them, or None = frozen for every side."""

    bottom: int = Field(ge=0)
    """Bottom layers on the language side."""
    top: int = Field(ge=0)
    """Top layers on the language side."""
    attention: Zones | Side | None = None
    """Attention's own zones (no transitions), or a whole side; None: the layer zones."""
    mlp: Zones | Side | None = None
    """The MLP's own zones (no transitions), or a whole side; None: the layer zones."""
    non_layer: Side | None = None
    """The side that owns embeddings, final norm and lm_head (None: frozen for every side)."""

    @model_validator(mode="after")
    def _no_transitions(self) -> PartitionSpec:
        for comp in ("attention", "mlp"):
            z = getattr(self, comp)
            if isinstance(z, Zones) and (z.bottom_transition or z.top_transition):
                raise ValueError(f"{comp}: a training partition has no transition zones")
        return self


def partition_spec(p: PartitionName | PartitionSpec) -> PartitionSpec:
    """A named partition (A, B, C of docs/method.md) as a PartitionSpec (non-layer frozen)."""
    return p if isinstance(p, PartitionSpec) else PartitionSpec(**PARTITIONS[p])


class LoraSpec(StrictModel):
    """Rank-stabilised LoRA (PEFT) on attention and MLP projections."""

    rank: int = Field(16, gt=0)
    """Adapter rank r."""
    alpha: float = Field(32.0, gt=0)
    """LoRA alpha: the update is scaled by alpha / sqrt(r) (rsLoRA) or alpha / r."""
    rslora: bool = True
    """Rank-stabilised scaling alpha / sqrt(r) instead of alpha / r."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input."""
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), min_length=1)
    """Module names that get adapters (default: every attention and MLP projection)."""


class FullMode(StrictModel):
    """Fine-tune every parameter."""

    type: Literal["full"]
    """Selects this mode (`mode: full` is shorthand)."""


class LoraMode(LoraSpec):
    """Train LoRA adapters on the frozen base (the fields of LoraSpec)."""

    type: Literal["lora"]
    """Selects this mode (`mode: lora` is shorthand)."""


class PartialMode(StrictModel):
    """Train only `train`'s side of `partition`; the rest stays bit-identical to base.
    `lora`: adapters only on the allocated partition's projections instead of full weights."""

    type: Literal["partial"]
    """Selects this mode."""
    partition: PartitionName | PartitionSpec
    """A named partition (A, B, C) or one of your own."""
    train: Side
    """The side of the partition that trains: "task" or "language"."""
    lora: LoraSpec | None = None
    """Train LoRA adapters on that side's projections instead of its full weights."""


class SimultaneousMode(StrictModel):
    """Alternate datasets every `k` steps; dataset i trains only side `sides[i]` of `partition`.
    Each side has its own AdamW; the idle side's moments do not move."""

    type: Literal["simultaneous"]
    """Selects this mode."""
    partition: PartitionName | PartitionSpec
    """A named partition (A, B, C) or one of your own."""
    k: int = Field(1, ge=1)
    """Steps on one dataset before switching to the other."""
    sides: tuple[Side, Side] = ("task", "language")
    """The side each of the two datasets trains, in dataset order (default: the first trains the
    task side; the run warns when the datasets' own labels say the reverse)."""
    lora: LoraSpec | None = None
    """Train LoRA adapters on each side's projections instead of its full weights."""

    @model_validator(mode="after")
    def _distinct(self) -> SimultaneousMode:
        if self.sides[0] == self.sides[1]:
            raise ValueError(
                f"sides: the two datasets must train different sides, got {self.sides}"
            )
        return self


class MixMode(StrictModel):
    """One run on the shuffled union of the datasets (all parameters, or LoRA)."""

    type: Literal["mix"]
    """Selects this mode (`mode: mix` is shorthand)."""
    lora: LoraSpec | None = None
    """Train LoRA adapters instead of every parameter."""


Mode = Annotated[
    FullMode | LoraMode | PartialMode | SimultaneousMode | MixMode, Field(discriminator="type")
]
# The training modes, in declaration order: the one list (trainables.train.modes.MODES keys them).
MODE_NAMES: tuple[str, ...] = tuple(
    get_args(m.model_fields["type"].annotation)[0] for m in get_args(get_args(Mode)[0])
)
