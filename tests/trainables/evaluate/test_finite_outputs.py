"""A model whose logits are not finite is flagged by name, never scored
(trainables/evaluate/finite_outputs.py; `layerswap eval` end to end is in
tests/cli/test_bad_input_numbers.py).

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_finite_outputs.py
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from layerswap.trainables.evaluate.finite_outputs import NonFiniteOutputs, watch_logits


class _Toy(torch.nn.Module):
    """Logits as transformers returns them (an object with .logits); `poison` spoils one."""

    def __init__(self) -> None:
        super().__init__()
        self.poison: float | None = None

    def forward(self, x: torch.Tensor) -> SimpleNamespace:
        logits = x.float().unsqueeze(-1).repeat(1, 1, 5)
        if self.poison is not None:
            logits[0, 0, 2] = self.poison
        return SimpleNamespace(logits=logits)


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logits_fail_the_evaluation_by_name(poison):
    model = _Toy()
    with watch_logits(model) as watch:
        model(torch.ones(2, 3))
        model.poison = poison
        model(torch.ones(2, 3))
        model.poison = None
        model(torch.ones(2, 3))
    with pytest.raises(NonFiniteOutputs, match=r"^m: .*not finite \(NaN or Inf logits in 1 of 3"):
        watch.check("m")
    assert not model._forward_hooks  # the watch is gone with the evaluation


def test_finite_logits_pass():
    model = _Toy()
    with watch_logits(model) as watch:
        model(torch.ones(2, 3))
    watch.check("m")
    assert watch.passes == 1
