"""Which side (language / task) of a training partition owns each parameter.

`param_sides(names, spec, depth)` places every parameter name with trainables/merge/arch.py and the
layer-swap zone table (spaces/zones.py), so freezing and merging read partitions the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from layerswap.spaces.recipe import LayerSwapRecipe, Side
from layerswap.spaces.train_modes import PartitionSpec
from layerswap.spaces.zones import layer_map
from layerswap.trainables.merge.arch import param_slot


def owners(spec: PartitionSpec, depth: int) -> dict[str, list[Side]]:
    """Per component, the side that owns each layer (ValueError if the zones do not fit)."""
    recipe = LayerSwapRecipe(
        method="layer_swap",
        task_expert="-",
        language_expert="-",
        bottom=spec.bottom,
        top=spec.top,
        attention=spec.attention,
        mlp=spec.mlp,
    )
    return layer_map(recipe, depth)  # type: ignore[return-value]  # no transitions by construction


def param_sides(names: Iterable[str], spec: PartitionSpec, depth: int) -> dict[str, Side | None]:
    """Map parameter names to the side that trains them (None: no side, i.e. frozen).

    Args:
        names: parameter names (plain HF or PEFT-prefixed).
        spec: the partition.
        depth: the model's number of transformer layers.
    Returns:
        {name: "language" | "task" | None}; non-layer parameters get `spec.non_layer`.
    """
    table = owners(spec, depth)
    out: dict[str, Side | None] = {}
    for name in names:
        slot = param_slot(name)
        if slot.layer is None:
            out[name] = spec.non_layer
        else:
            out[name] = table[slot.component][slot.layer]  # type: ignore[index]
    return out


# Projection modules that live in the attention block (everything else is MLP).
ATTENTION_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "query_key_value"}


def lora_target_regex(spec: PartitionSpec, side: Side, depth: int, modules: list[str]) -> str:
    """A PEFT `target_modules` regex: `modules` only in the layers/components `side` owns."""
    table = owners(spec, depth)
    alts = []
    for mod in modules:
        comp = "attention" if mod in ATTENTION_MODULES else "mlp"
        layers = [i for i, s in enumerate(table[comp]) if s == side]
        if layers:
            alts.append(rf"layers\.({'|'.join(map(str, layers))})\.[a-z_]+\.{mod}")
    if not alts:
        raise ValueError(f"partition gives side {side!r} no LoRA target among {modules}")
    return r".*(?:" + "|".join(alts) + r")$"
