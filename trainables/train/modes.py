"""The training modes of issue 4 as one table: mode name -> what it trains, two ways.

`MODES[name].prepare(model, exp, depth)` freezes what the mode freezes (requires_grad set ONCE,
before any DDP wrapping, never toggled afterwards: DDP registers its gradient hooks for the
parameters that need gradients when it wraps), wraps with PEFT LoRA when asked, and groups the
trainable parameters. Every group gets its own AdamW in the loop; `Prepared.active` says which
group steps at a global step, so an idle group's moments never move.
`MODES[name].trainable(exp, shape)` applies the same rules to parameter names alone (no model):
the memory plan's view (`layerswap train --plan`). The two sit side by side here so that they
cannot drift; `mode_of` is the one lookup, and a mode the table does not know is an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import nn

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.spaces.train_modes import LoraSpec, partition_spec
from layerswap.trainables.merge.arch import layer_index
from layerswap.trainables.train.data import stream_step
from layerswap.trainables.train.partition import lora_target_regex, param_sides

if TYPE_CHECKING:  # only its type: the memory plan builds shapes, the table reads their names
    from layerswap.trainables.train.model_shape import ModelShape

Named = list[tuple[str, nn.Parameter]]


@dataclass
class Prepared:
    model: nn.Module
    groups: dict[str, Named]  # group name -> trainable parameters (names as in `model`)
    frozen: list[str]  # parameter names that never train
    is_lora: bool = False
    n_streams: int = 1
    k: int = 1
    stream_groups: list[str] = field(default_factory=lambda: ["all"])  # group trained by stream i

    def active(self, step: int) -> tuple[int, int, str]:
        """(stream, the stream's own step, group) for global `step`."""
        stream, own = stream_step(step, self.n_streams, self.k)
        return stream, own, self.stream_groups[stream]


def _lora(model: nn.Module, spec: LoraSpec, targets: list[str] | str) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        use_rslora=spec.rslora,
        lora_dropout=spec.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def _split(model: nn.Module) -> tuple[Named, list[str]]:
    train = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    return train, frozen


def _full(model: nn.Module, exp: TrainExperiment, depth: int) -> Prepared:
    for p in model.parameters():
        p.requires_grad_(True)
    train, frozen = _split(model)
    return Prepared(model, {"all": train}, frozen)


def _plain_lora(model: nn.Module, spec: LoraSpec) -> Prepared:
    model = _lora(model, spec, list(spec.target_modules))
    train, frozen = _split(model)
    return Prepared(model, {"all": train}, frozen, is_lora=True)


def _lora_mode(model: nn.Module, exp: TrainExperiment, depth: int) -> Prepared:
    return _plain_lora(model, exp.mode)  # type: ignore[arg-type]


def _partial(model: nn.Module, exp: TrainExperiment, depth: int) -> Prepared:
    mode = exp.mode
    spec = partition_spec(mode.partition)  # type: ignore[union-attr]
    side = mode.train  # type: ignore[union-attr]
    if mode.lora is not None:  # type: ignore[union-attr]
        # Adapters only where the partition allocates `side`; base weights all frozen.
        regex = lora_target_regex(spec, side, depth, list(mode.lora.target_modules))  # type: ignore[union-attr]
        model = _lora(model, mode.lora, regex)  # type: ignore[union-attr]
        train, frozen = _split(model)
        return Prepared(model, {side: train}, frozen, is_lora=True, stream_groups=[side])
    sides = param_sides([n for n, _ in model.named_parameters()], spec, depth)
    for n, p in model.named_parameters():
        p.requires_grad_(sides[n] == side)
    train, frozen = _split(model)
    if not train:
        raise ValueError(f"mode.partition gives side {side!r} no parameters on {depth} layers")
    return Prepared(model, {side: train}, frozen, stream_groups=[side])


def _simultaneous(model: nn.Module, exp: TrainExperiment, depth: int) -> Prepared:
    mode = exp.mode
    spec = partition_spec(mode.partition)  # type: ignore[union-attr]
    if mode.lora is not None:  # type: ignore[union-attr]
        model = _lora(model, mode.lora, list(mode.lora.target_modules))  # type: ignore[union-attr]
    else:
        # Both sides train (each on its own dataset); parameters no side owns stay frozen.
        sides0 = param_sides([n for n, _ in model.named_parameters()], spec, depth)
        for n, p in model.named_parameters():
            p.requires_grad_(sides0[n] is not None)
    train, frozen = _split(model)
    sides = param_sides([n for n, _ in train], spec, depth)
    groups: dict[str, Named] = {"task": [], "language": []}
    for n, p in train:
        if sides[n] is None:  # LoRA adapters are created everywhere; the unowned ones idle
            p.requires_grad_(False)
            frozen.append(n)
        else:
            groups[sides[n]].append((n, p))  # type: ignore[index]
    for side, named in groups.items():
        if not named:
            raise ValueError(f"mode.partition gives side {side!r} no parameters on {depth} layers")
    return Prepared(
        model,
        groups,
        frozen,
        is_lora=mode.lora is not None,  # type: ignore[union-attr]
        n_streams=2,
        k=mode.k,  # type: ignore[union-attr]
        stream_groups=list(mode.sides),  # type: ignore[union-attr]
    )


def _mix(model: nn.Module, exp: TrainExperiment, depth: int) -> Prepared:
    lora = exp.mode.lora  # type: ignore[union-attr]
    return _plain_lora(model, lora) if lora is not None else _full(model, exp, depth)


@dataclass(frozen=True)
class Split:
    """Which parameters exist during training (LoRA adapters included) and which of them train.

    params: name -> elements, for every parameter of the trained model.
    trainable: the names that train. linear: the names that are Linear weights (autocast casts
    those). lora_rank: per layer, the summed rank of the adapters that layer carries.
    """

    params: dict[str, int]
    trainable: frozenset[str]
    linear: frozenset[str]
    lora_rank: dict[int, int]


def _matches(module: str, targets: list[str] | str) -> bool:
    """PEFT's target_modules rule: a regex fully matches, or a name is the module's last part."""
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return any(module == t or module.endswith(f".{t}") for t in targets)


def _with_lora(shape: ModelShape, spec: LoraSpec, targets: list[str] | str) -> Split:
    """The model PEFT builds: the base frozen, rank-`spec.rank` A and B on each target Linear."""
    params = dict(shape.params)
    adapters, ranks = set(), {}
    for mod, (fan_in, fan_out) in shape.linears.items():
        if not _matches(mod, targets):
            continue
        a, b = f"{mod}.lora_A.weight", f"{mod}.lora_B.weight"
        params[a], params[b] = spec.rank * fan_in, fan_out * spec.rank
        adapters |= {a, b}
        if (layer := layer_index(mod)) is not None:
            ranks[layer] = ranks.get(layer, 0) + spec.rank
    base_linear = {f"{m}.weight" for m in shape.linears}
    return Split(params, frozenset(adapters), frozenset(base_linear | adapters), ranks)


def _linear(shape: ModelShape) -> frozenset[str]:
    return frozenset(f"{m}.weight" for m in shape.linears)


def _full_split(exp: TrainExperiment, shape: ModelShape) -> Split:
    return Split(dict(shape.params), frozenset(shape.params), _linear(shape), {})


def _lora_split(exp: TrainExperiment, shape: ModelShape) -> Split:
    return _with_lora(shape, exp.mode, list(exp.mode.target_modules))  # type: ignore[union-attr]


def _partial_split(exp: TrainExperiment, shape: ModelShape) -> Split:
    mode, depth = exp.mode, shape.layers
    spec, lora = partition_spec(mode.partition), mode.lora  # type: ignore[union-attr]
    if lora is not None:  # adapters only where the partition allocates the trained side
        regex = lora_target_regex(spec, mode.train, depth, list(lora.target_modules))  # type: ignore[union-attr]
        return _with_lora(shape, lora, regex)
    sides = param_sides(shape.params, spec, depth)
    trainable = frozenset(n for n, s in sides.items() if s == mode.train)  # type: ignore[union-attr]
    return Split(dict(shape.params), trainable, _linear(shape), {})


def _simultaneous_split(exp: TrainExperiment, shape: ModelShape) -> Split:
    # Both sides train; what no side owns (unowned adapters included) is frozen.
    mode, depth = exp.mode, shape.layers
    spec, lora = partition_spec(mode.partition), mode.lora  # type: ignore[union-attr]
    split = _with_lora(shape, lora, list(lora.target_modules)) if lora is not None else None
    params = split.params if split else dict(shape.params)
    pool = split.trainable if split else frozenset(params)
    sides = param_sides(sorted(pool), spec, depth)
    trainable = frozenset(n for n, s in sides.items() if s is not None)
    return Split(params, trainable, split.linear if split else _linear(shape), split.lora_rank if split else {})  # fmt: skip


def _mix_split(exp: TrainExperiment, shape: ModelShape) -> Split:
    lora = exp.mode.lora  # type: ignore[union-attr]
    if lora is None:
        return _full_split(exp, shape)
    return _with_lora(shape, lora, list(lora.target_modules))


@dataclass(frozen=True)
class TrainingMode:
    """What one training mode trains: `prepare` on a loaded model, `trainable` on names alone.

    prepare: (model, exp, depth) -> Prepared, for training.
    trainable: (exp, ModelShape) -> Split, for the memory plan; the same parameters as prepare.
    """

    prepare: Callable[[nn.Module, TrainExperiment, int], Prepared]
    trainable: Callable[[TrainExperiment, ModelShape], Split]


# Keys: the config's modes (spaces.train_modes.MODE_NAMES), in its order.
MODES: dict[str, TrainingMode] = {
    "full": TrainingMode(_full, _full_split),
    "lora": TrainingMode(_lora_mode, _lora_split),
    "partial": TrainingMode(_partial, _partial_split),
    "simultaneous": TrainingMode(_simultaneous, _simultaneous_split),
    "mix": TrainingMode(_mix, _mix_split),
}


def mode_of(name: str) -> TrainingMode:
    """The table's entry for a mode name.

    Raises:
        ValueError naming the mode and the known ones.
    """
    mode = MODES.get(name)
    if mode is None:
        raise ValueError(f"unknown training mode {name!r}; known modes: {', '.join(MODES)}")
    return mode


def prepare(model: nn.Module, exp: TrainExperiment, depth: int) -> Prepared:
    """Apply the experiment's mode to a freshly loaded model (see MODES)."""
    return mode_of(exp.mode.type).prepare(model, exp, depth)


def trainable_split(exp: TrainExperiment, shape: ModelShape) -> Split:
    """Apply the experiment's mode to parameter names, as `prepare` does to the model.

    Args:
        exp: the experiment (its `mode`).
        shape: the model's sizes (trainables.train.model_shape.model_shape).
    Returns:
        Split.
    """
    return mode_of(exp.mode.type).trainable(exp, shape)
