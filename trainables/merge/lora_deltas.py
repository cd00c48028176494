"""The arithmetic of LoRA deltas: factors, an adapter's magnitude, and base + weighted deltas.

One definition each, shared by the disk merge (trainables/merge/lora.py) and the live model of
the search and promotion (trainables/merge/live.py), so a LoRA recipe is the same floats in both.
Plain torch, no I/O. Tests: .venv/bin/python -m pytest -q tests/trainables/merge/test_lora_live.py
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from layerswap.spaces.recipe import RecipeError
from layerswap.trainables.merge.engine import CHUNK_ELEMS
from layerswap.trainables.merge.ops import BLOCK_ELEMS
from layerswap.trainables.merge.terms import MagnitudeOracle, Terms


def rank_factor(rslora: bool, r: int) -> float:
    # PEFT (tuners/lora/layer.py: LoraLayer.update_layer): scaling = alpha / sqrt(r) or alpha / r.
    return math.sqrt(r) if rslora else r


@dataclass
class Factors:
    """One module's LoRA: delta = scaling * b @ a."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    alpha: float
    rslora: bool

    @property
    def r(self) -> int:
        return self.a.shape[0]

    @property
    def scaling(self) -> float:
        return self.alpha / rank_factor(self.rslora, self.r)


@dataclass
class Adapter:
    """A checked PEFT LoRA adapter folder (trainables.merge.lora.load_adapter reads one)."""

    root: Path
    config: dict
    modules: dict[str, Factors]  # module name in the base model, e.g. model.layers.0.mlp.up_proj


def fold_target_problem(module: str, a: torch.Tensor, b: torch.Tensor, found: Sequence[int] | None) -> str | None:  # fmt: skip
    """Why the base tensor a LoRA module folds into cannot take its delta, or None.

    One rule for the disk fold (lora._fold) and the live model (live.fold_adapter): e.g. a LoRA
    on `lm_head` of a model whose lm_head is tied to the embeddings has no tensor of its own.

    Args:
        module: the module's name in the base, e.g. `lm_head`.
        a, b: its factors ([r, in], [out, r]).
        found: the shape of the base's `{module}.weight`, None when the base has no such tensor.
    Returns:
        "tensor 'lm_head.weight' must be [out, in] for the adapters' LoRA on it, found ...".
    """
    shape = [b.shape[0], a.shape[1]]
    if found is not None and list(found) == shape:
        return None
    what = "no such tensor" if found is None else list(found)
    return (
        f"tensor {module + '.weight'!r} must be {shape} for the adapters' LoRA on it, found {what}"
    )


def mav_sum(adapter: Adapter) -> float:
    """Sum over rows of the row-wise MAV of every module's delta scaling * B @ A.

    The mean over all rows of the model divides both experts by the same row count (untargeted
    rows have zero delta), so normalised inverse means equal normalised inverse sums.
    """
    total = 0.0
    for f in adapter.modules.values():
        rows = max(1, CHUNK_ELEMS // f.a.shape[1])
        for r0 in range(0, f.b.shape[0], rows):
            d = (f.b[r0 : r0 + rows].float() @ f.a.float()) * f.scaling  # [rows, in]
            total += float(d.abs().to(torch.float64).mean(dim=1).sum())
    return total


def adapter_mav_oracle(
    adapters: Mapping[str, Adapter], sums: dict[str, float] | None = None
) -> MagnitudeOracle:
    """The magnitude oracle of a layer swap of two LoRA adapters: an adapter's summed row-wise
    MAV of its exact float32 deltas (`mav_sum`), never of weights rounded into the base.

    `merge_lora_to_disk` and the live model (trainables.merge.live) both use it, so a LoRA
    recipe's transition weights are the same floats in the search, promotion and RUN/best.

    Args:
        adapters: {expert ref: its adapter}.
        sums: per-ref results kept across calls (a process's cache); None: a fresh one.
    Returns:
        terms ((ref, 1.0),) -> the sum (in a sum's unit, not a mean's: only adapters compare).
    """
    sums = {} if sums is None else sums

    def mav(terms: Terms) -> float:
        ((ref, c),) = terms  # a LoRA swap asks about each expert alone (soups are refused)
        if c != 1.0:
            raise RecipeError(f"LoRA magnitude of {ref} with coefficient {c}: only 1.0 is defined")
        if ref not in sums:
            sums[ref] = mav_sum(adapters[ref])
        return sums[ref]

    return mav


def fold_terms(w: torch.Tensor, terms: Sequence[tuple[Factors, float]]) -> torch.Tensor:
    """w + sum_i weight_i * scaling_i * B_i @ A_i, in float32 from the factors, cast to w's dtype.

    The one rule for a tensor that LoRA deltas are added to: the disk fold, an adapter folded
    into the base in memory and the live model's transition tensors all call it, so they agree
    bit for bit (folding each adapter into a bf16 base first rounds away small deltas: a
    red-team lost 30 % of an SFT-sized adapter's entries). Whole-row chunks of ~BLOCK_ELEMS
    keep the float32 temporaries in cache (2.7x faster than 32 MiB chunks on an 8B MLP tensor,
    same bits: each entry is its own row's dot product).

    Args:
        w: the base tensor [out, in] (left unchanged).
        terms: (factors, weight) pairs, added in this order.
    Returns:
        a new tensor [out, in] in w's dtype; `w` itself when `terms` is empty.
    """
    if not terms:
        return w
    out = torch.empty(w.shape, dtype=w.dtype, device=w.device)
    rows = max(1, BLOCK_ELEMS // w.shape[1])
    factors = [(f.b, f.a.float(), weight * f.scaling) for f, weight in terms]
    for r0 in range(0, w.shape[0], rows):
        acc = w[r0 : r0 + rows].to(torch.float32, copy=True)  # a copy: w may be float32
        for b, a, c in factors:
            acc += (b[r0 : r0 + rows].float() @ a) * c
        out[r0 : r0 + rows] = acc
    return out
