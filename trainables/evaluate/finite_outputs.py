"""A model whose outputs are not finite gets no score: the logits of every forward pass an
evaluation makes are watched, and a NaN or an Inf among them fails the evaluation by name.

lm-eval scores NaN logits as if they were numbers (an argmax over NaNs picks the first choice,
so a model of NaNs scored 0.20 on a five-way task); `evaluate` (harness.py) raises
`NonFiniteOutputs` instead, before any result is written.

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_finite_outputs.py
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


class NonFiniteOutputs(ValueError):
    """The evaluated model produced NaN or Inf logits; its scores would mean nothing."""


@dataclass
class LogitWatch:
    """Forward passes seen and, on the model's device, how many had a non-finite logit."""

    passes: int = 0
    bad: torch.Tensor | None = None  # read once at the end: no device sync per pass

    def observe(self, logits: torch.Tensor) -> None:
        lo, hi = torch.aminmax(logits.detach())  # one pass; NaN shows in both, +-Inf in one
        flag = (~(torch.isfinite(lo) & torch.isfinite(hi))).int()
        self.bad = flag if self.bad is None else self.bad + flag
        self.passes += 1

    def check(self, name: str) -> None:
        """NonFiniteOutputs naming `name` when any pass so far had a non-finite logit."""
        bad = 0 if self.bad is None else int(self.bad)
        if bad:
            raise NonFiniteOutputs(
                f"{name}: the model's outputs are not finite (NaN or Inf logits in {bad} of "
                f"{self.passes} forward passes); no score is reported and nothing was written"
            )


@contextmanager
def watch_logits(model: torch.nn.Module) -> Iterator[LogitWatch]:
    """Watch the logits of every forward pass of `model` (generation steps included).

    Args:
        model: the module lm-eval calls (HFLM's `model`: a transformers or PEFT model).
    Yields:
        the LogitWatch; call its `check` after the evaluation.
    """
    watch = LogitWatch()

    def hook(module, args, output) -> None:
        logits = getattr(output, "logits", None)
        if logits is None and isinstance(output, (tuple, list)) and output:
            logits = output[0]
        if isinstance(logits, torch.Tensor) and logits.is_floating_point() and logits.numel():
            watch.observe(logits)

    handle = model.register_forward_hook(hook)
    try:
        yield watch
    finally:
        handle.remove()
