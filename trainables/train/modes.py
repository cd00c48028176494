"""The training modes of issue 4 as an explicit registry: mode name -> prepare function.

Each prepare(model, exp, depth) freezes what the mode freezes (requires_grad set ONCE, before
any DDP wrapping, never toggled afterwards: DDP registers its gradient hooks for the parameters
that need gradients when it wraps), wraps with PEFT LoRA when asked, and
groups the trainable parameters. Every group gets its own AdamW in the loop; `Prepared.active`
says which group steps at a global step, so an idle group's moments never move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from layerswap.spaces.train_experiment import LoraSpec, TrainExperiment, partition_spec
from layerswap.trainables.train.data import stream_step
from layerswap.trainables.train.partition import lora_target_regex, param_sides

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


MODES: dict[str, Callable[[nn.Module, TrainExperiment, int], Prepared]] = {
    "full": _full,
    "lora": _lora_mode,
    "partial": _partial,
    "simultaneous": _simultaneous,
    "mix": _mix,
}


def prepare(model: nn.Module, exp: TrainExperiment, depth: int) -> Prepared:
    """Apply the experiment's mode to a freshly loaded model (see MODES)."""
    return MODES[exp.mode.type](model, exp, depth)
