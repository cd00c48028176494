"""Training stays finite, or stops saying where: the checks the loop (trainables/train/loop.py)
makes on its weights, steps and checkpoints.

- the weights it starts from (the base, or a resumed checkpoint) are checked once loaded, with
  the merge engine's own check (`trainables.merge.engine.check_finite`): a NaN in the base is
  named by tensor before the first step;
- each step's gradient norm is checked before the update: a non-finite one (a NaN or Inf loss
  makes one) stops the run with `NonFiniteTraining` naming the step, before the weights change;
- before a checkpoint is written, its loss, validation losses and weights are checked too (an
  update can overflow the weights with a finite gradient), so no checkpoint holds a NaN.

Every decision here is the same on every rank (the gradient norm is all-reduced, the reported
losses are summed over ranks, a sharded model's weight check is summed), so all ranks stop at
one step and none waits in a collective for a rank that stopped.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_train_finite.py
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from layerswap.spaces.errors import RunFailed
from layerswap.trainables.merge.engine import all_finite, check_finite

_ADVICE = "lower hyper.lr (or set hyper.grad_clip), or check the base and the data"


class NonFiniteTraining(RunFailed):
    """Training turned non-finite (NaN or Inf); nothing of that step was saved."""


def check_loaded_weights(model: torch.nn.Module, source: object) -> None:
    """CheckpointError naming `source` and the first parameter or buffer holding a NaN or Inf.

    Args:
        model: the model just loaded (before any sharding or wrapping).
        source: where its weights came from (the base or a checkpoint), for the message.
    """
    with torch.no_grad():
        for name, t in _tensors(model):
            check_finite(t, str(source), name)


def check_step(step: int, total: int, loss: torch.Tensor | float, grad_norm: float) -> None:
    """NonFiniteTraining when step `step` (1-based) has a non-finite gradient norm.

    Args:
        step: the step just computed (not yet applied).
        total: the run's steps.
        loss: this rank's loss of the step (read only for the message: no extra device sync).
        grad_norm: the global gradient norm (the same on every rank).
    """
    if math.isfinite(grad_norm):
        return
    raise NonFiniteTraining(
        f"training turned non-finite at step {step} of {total} (loss {float(loss):.4g}, "
        f"gradient norm {grad_norm}); stopped before the update, no checkpoint of it was saved: "
        f"{_ADVICE}"
    )


def check_checkpoint(
    step: int, losses: dict[str, float], model: torch.nn.Module, bad_on_ranks: float
) -> None:
    """NonFiniteTraining when the checkpoint of step `step` would hold a non-finite number.

    Args:
        step: the step about to be checkpointed.
        losses: the reported losses (summed over ranks), by name ("loss", "val_loss", ...).
        model: the model to save (for the tensor's name in the message).
        bad_on_ranks: how many ranks hold a non-finite weight (`nonfinite_weight` summed).
    """
    bad = {k: v for k, v in losses.items() if not math.isfinite(v)}
    if not bad and not bad_on_ranks:
        return
    what = ", ".join(f"{k} {v}" for k, v in bad.items())
    if bad_on_ranks:
        name = nonfinite_weight(model)
        what = ", ".join(filter(None, [what, f"weight {name or 'on another rank'} non-finite"]))
    raise NonFiniteTraining(
        f"training turned non-finite at step {step} ({what}); no checkpoint of it was saved: "
        f"{_ADVICE}"
    )


def nonfinite_weight(model: torch.nn.Module) -> str | None:
    """The name of this rank's first parameter holding a NaN or an Inf (its shard, under FSDP)."""
    with torch.no_grad():
        for name, t in _tensors(model, buffers=False):
            if not all_finite(t):
                return name
    return None


def _tensors(model: torch.nn.Module, buffers: bool = True) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, local tensor) of the parameters (and buffers); a DTensor gives its local shard."""
    named = list(model.named_parameters())
    if buffers:
        named += list(model.named_buffers())
    for name, t in named:
        local = t.to_local() if hasattr(t, "to_local") else t
        yield name, local.detach()
