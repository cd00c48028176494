"""The start lines of a partial or simultaneous run: what each side of the partition trains,
which dataset trains which side, and a warning when that mapping looks swapped.

`side_notes(exp, depth)` returns the lines (none for full, lora and mix); rank 0 of
`run_training` (trainables/train/loop.py) prints them with the other start lines. Tests:
.venv/bin/python -m pytest -q tests/trainables/train/test_side_notes.py
"""

from __future__ import annotations

from layerswap.spaces.languages import language_key
from layerswap.spaces.recipe import COMPONENTS, Side
from layerswap.spaces.train_experiment import DatasetSpec, TrainExperiment, stated_language
from layerswap.spaces.train_modes import PartialMode, SimultaneousMode, partition_spec
from layerswap.spaces.world import sft_language
from layerswap.trainables.train.partition import owners
from layerswap.trainables.train.sft_records import DataSourceError
from layerswap.trainables.train.sources import get_source

NON_LAYER = "embeddings, final norm and lm_head"
ENGLISH = language_key("en")


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> "0-2, 5-6"."""
    out, start = [], None
    for i, n in enumerate(layers):
        start = n if start is None else start
        if i + 1 == len(layers) or layers[i + 1] != n + 1:
            out.append(str(n) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)


def _side_text(table: dict[str, list[Side]], side: Side) -> str:
    """What one side owns among the layers, e.g. "layers 6-29 (attention and MLP)"."""
    per = {c: [i for i, s in enumerate(table[c]) if s == side] for c in COMPONENTS}
    if per["attention"] == per["mlp"]:
        return f"layers {_ranges(per['mlp'])} (attention and MLP)" if per["mlp"] else "no layer"
    parts = [f"{c if c == 'attention' else 'MLP'} of layers {_ranges(v)}" for c, v in per.items() if v]  # fmt: skip
    return ", ".join(parts) or "no layer"


def evident_side(spec: DatasetSpec) -> Side | None:
    """The side a dataset's own labels point to, or None where they say nothing.

    Args:
        spec: one dataset of an experiment.
    Returns:
        "task" for an English math source or the world's math file, "language" for a language
        source, a world language file or any dataset stating a non-English language.
    """
    if spec.source is not None:
        try:
            kind = get_source(spec.source).kind
        except DataSourceError:
            kind = None
        if kind in ("math", "language"):
            return "task" if kind == "math" else "language"
    stated = stated_language(spec)
    if stated is not None and language_key(stated) != ENGLISH:
        return "language"
    return "task" if spec.path is not None and sft_language(str(spec.path)) == "en" else None


def side_notes(exp: TrainExperiment, depth: int) -> list[str]:
    """The start lines of a partial or simultaneous run ([] for the other modes).

    Args:
        exp: the experiment.
        depth: the model's number of transformer layers.
    Returns:
        lines: the partition's sides on this depth and what stays frozen, the dataset -> side
        mapping, and a warning when a dataset's labels point to the other side than it trains
        while `mode.sides` was left to its default (dataset order).
    """
    mode = exp.mode
    if not isinstance(mode, PartialMode | SimultaneousMode):
        return []
    spec = partition_spec(mode.partition)
    table = owners(spec, depth)
    name = mode.partition if isinstance(mode.partition, str) else "custom"
    trained: list[Side] = [mode.train] if isinstance(mode, PartialMode) else ["task", "language"]
    sides = [f"the {s} side trains {_side_text(table, s)}" for s in trained]
    if isinstance(mode, PartialMode):
        other: Side = "language" if mode.train == "task" else "task"
        sides.append(f"frozen: the {other} side, {_side_text(table, other)}")
    if mode.lora is not None:
        # LoRA adapters sit on attention/MLP projections: no non-layer weight ever trains.
        non_layer = f"{NON_LAYER} stay frozen (LoRA adapters only on projections)"
    elif spec.non_layer is None:
        non_layer = (
            f"{NON_LAYER} stay frozen (no side owns them; a custom partition's "
            "`non_layer: task|language` gives them to one side)"
        )
    elif spec.non_layer in trained:
        non_layer = f"{NON_LAYER} train with the {spec.non_layer} side"
    else:
        non_layer = f"{NON_LAYER} stay frozen (the {spec.non_layer} side owns them)"
    lines = [
        f"layerswap: {mode.type} training, partition {name} on {depth} layers: "
        f"{'; '.join(sides)}; {non_layer}"
    ]
    data_sides = [mode.train] * len(exp.datasets) if isinstance(mode, PartialMode) else list(mode.sides)  # fmt: skip
    pairs = list(zip(exp.datasets, data_sides, strict=False))
    lines.append(
        "layerswap: data -> side: "
        + ", ".join(f"datasets[{i}] ({d.label}) -> {s}" for i, (d, s) in enumerate(pairs))
    )
    if isinstance(mode, SimultaneousMode) and "sides" not in mode.model_fields_set:
        swapped = [
            f"datasets[{i}] ({d.label}) looks like {ev} data but trains the {s} side"
            for i, (d, s) in enumerate(pairs)
            if (ev := evident_side(d)) is not None and ev != s
        ]
        if swapped:
            lines.append(
                f"layerswap: warning: {'; '.join(swapped)}: mode.sides defaults to "
                "[task, language] in dataset order; list the math dataset first, or give "
                "mode.sides explicitly"
            )
    return lines
