"""Tensor arithmetic of the merges: weighted averages, task arithmetic, TIES, row-wise MAV.

Plain torch, no I/O: the disk engine calls these per chunk or per tensor, the in-memory
composer per tensor. Everything is computed in float32 and cast back to the input dtype.
`OPS` is the one dispatch from an op of trainables/merge/terms.py to its arithmetic; both
executors reach it through `op_kind`, so an op neither knows is an error, not a missing tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from layerswap.trainables.merge.terms import DeltaMerge, Linear, Op

# Elements per step of linear_combine: its float32 work buffers (4 MiB each) stay in cache and
# are reused, instead of whole-tensor float32 temporaries that are page-faulted on every call.
BLOCK_ELEMS = 1024 * 1024
_HALF = (torch.bfloat16, torch.float16)


def linear_combine(
    tensors: Sequence[torch.Tensor],
    coeffs: Sequence[float],
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_i c_i * t_i, accumulated in float32, cast to `out_dtype`.

    Args:
        tensors: same-shape tensors [*].
        coeffs: one coefficient per tensor (the assembler normalises them to sum to 1).
        out_dtype: dtype of the result (the checkpoints' own dtype).
        out: optional contiguous tensor [*] of `out_dtype` to write the result into.
    Returns:
        `out`, or a new tensor [*].
    """
    if len(tensors) != len(coeffs):
        raise ValueError(f"linear_combine: {len(tensors)} tensors but {len(coeffs)} coefficients")
    if out is None:
        out = torch.empty(tensors[0].shape, dtype=out_dtype, device=tensors[0].device)
    if (
        len(tensors) == 2
        and out_dtype in _HALF
        and all(t.dtype == out_dtype for t in tensors)
        and abs(coeffs[0] + coeffs[1] - 1.0) < 1e-9
    ):
        # Two-expert average of bf16/f16: lerp computes a + c1 (b - a) in float32 (its opmath
        # type) and rounds once, in one fused pass (~3.5x faster than upcasting both). Since
        # b - a of two half-precision values is exact in float32, this is the same float32
        # value as c0 a + c1 b for uniform weights; other weights may differ in the last bit.
        torch.lerp(tensors[0].reshape(out.shape), tensors[1].reshape(out.shape), coeffs[1], out=out)
        return out
    flat_out = out.view(-1)
    flats = [t.reshape(-1) for t in tensors]
    n = flat_out.numel()
    acc = torch.empty(min(n, BLOCK_ELEMS), dtype=torch.float32, device=flat_out.device)
    tmp = torch.empty_like(acc) if len(tensors) > 1 else acc
    for s in range(0, n, BLOCK_ELEMS):
        e = min(n, s + BLOCK_ELEMS)
        a = acc[: e - s]
        a.copy_(flats[0][s:e]).mul_(coeffs[0])  # same float32 operations as before, blockwise
        for t, c in zip(flats[1:], coeffs[1:], strict=True):
            a.add_(tmp[: e - s].copy_(t[s:e]), alpha=c)
        flat_out[s:e].copy_(a)
    return out


def _trim(delta: torch.Tensor, density: float) -> torch.Tensor:
    """Keep the top-`density` fraction of entries by magnitude (ties at the threshold kept)."""
    if density >= 1.0:
        return delta
    k = round(density * delta.numel())
    if k <= 0:
        return torch.zeros_like(delta)
    flat = delta.abs().flatten()
    # kthvalue of the (n-k+1)-th smallest == k-th largest magnitude.
    threshold = flat.kthvalue(flat.numel() - k + 1).values
    return torch.where(delta.abs() >= threshold, delta, torch.zeros_like(delta))


def delta_merge(
    base: torch.Tensor,
    models: Sequence[torch.Tensor],
    weights: Sequence[float],
    scale: float,
    density: float | None,
) -> torch.Tensor:
    """Task arithmetic (density None) or TIES (density in (0, 1]) on one tensor.

    Task arithmetic: base + scale * sum_i w_i (m_i - base).
    TIES: trim each delta to its top-`density` magnitudes, elect the sign of sum_i w_i tau_i
    per entry, and take the disjoint weighted mean of the entries that agree with it:
    base + scale * sum_i w_i tau_i [agree] / sum_i w_i [agree and tau_i != 0].

    Returns:
        A new tensor, base's shape and dtype.
    """
    b = base.to(torch.float32)
    deltas = [m.to(torch.float32) - b for m in models]
    if density is None:
        merged = torch.zeros_like(b)
        for d, w in zip(deltas, weights, strict=True):
            merged.add_(d, alpha=w)
    else:
        taus = [_trim(d, density) for d in deltas]
        weighted = torch.stack([t * w for t, w in zip(taus, weights, strict=True)])  # [n, *]
        elected = torch.sign(weighted.sum(dim=0))  # [*]
        agree = (torch.sign(weighted) == elected) & (weighted != 0)  # [n, *]
        w = torch.tensor(weights, dtype=torch.float32, device=b.device).view(-1, *([1] * b.dim()))
        num = (weighted * agree).sum(dim=0)
        den = (w * agree).sum(dim=0)
        merged = torch.where(den > 0, num / den.clamp_min(1e-12), torch.zeros_like(num))
    return (b + scale * merged).to(base.dtype)


def row_mav_sum(delta: torch.Tensor) -> tuple[float, int]:
    """Sum of row-wise mean absolute values of a 1-D or 2-D delta, and the number of rows.

    A 1-D tensor is one row (docs/method.md). Other ranks contribute nothing.
    """
    if delta.dim() == 1:
        return float(delta.abs().to(torch.float64).mean()), 1
    if delta.dim() == 2:
        return float(delta.abs().to(torch.float64).mean(dim=1).sum()), delta.shape[0]
    return 0.0, 0


def row_chunks(shape: tuple[int, ...], max_elems: int) -> Iterator[tuple[int, int]]:
    """(element start, element count) pieces of a tensor, whole rows each, <= max_elems if possible.

    1-D and 0-D tensors are one piece: their MAV is over the whole vector.
    """
    n = math.prod(shape)
    if len(shape) < 2 or n <= max_elems:
        yield 0, n
        return
    row = math.prod(shape[1:])
    rows_per = max(1, max_elems // row)
    for r in range(0, shape[0], rows_per):
        yield r * row, min(rows_per, shape[0] - r) * row


# (checkpoint ref, tensor name, element start, count) -> flat tensor of those elements
Reader = Callable[[str, str, int, int], torch.Tensor]


def mean_row_mav(
    terms: Sequence[tuple[str, float]],
    base: str,
    shapes: Mapping[str, tuple[int, ...]],
    read: Reader,
    chunk_elems: int,
) -> float:
    """Mean row-wise MAV of (sum_i c_i * checkpoint_i - base) over the given 1-D/2-D tensors.

    The one definition behind magnitude weights, whether tensors come from disk (streamed in
    row chunks) or from loaded state dicts.

    Args:
        terms: ((checkpoint ref, coefficient), ...).
        base: ref of the base checkpoint.
        shapes: {tensor name: shape} of the float tensors to include.
        read: fetches a flat range of a tensor's elements.
        chunk_elems: largest piece read at once (whole rows).
    Returns:
        The mean over all rows (0.0 if there are none).
    """
    total, rows = 0.0, 0
    for name, shape in shapes.items():
        if len(shape) not in (1, 2):
            continue
        for start, count in row_chunks(shape, chunk_elems):
            parts = [read(ref, name, start, count) for ref, _ in terms]
            combo = linear_combine(parts, [c for _, c in terms], torch.float32)
            delta = combo - read(base, name, start, count).float()  # flat [count]
            s, r = row_mav_sum(delta.view(-1, shape[1]) if len(shape) == 2 else delta)
            total, rows = total + s, rows + r
    return total / rows if rows else 0.0


@dataclass(frozen=True)
class OpKind:
    """How one kind of op is computed from its checkpoints' tensors (op.refs, in that order).

    apply: (op, tensors, out) -> the merged tensor, in the inputs' dtype; written into `out`
        when given (a row-wise kind only). rowwise: True if `apply` on any row range of the
        inputs gives that row range of the result, so the disk engine may stream it in chunks;
        False if it needs whole tensors (TIES's top-k is over the whole tensor).
    """

    apply: Callable[[Op, Sequence[torch.Tensor], torch.Tensor | None], torch.Tensor]
    rowwise: bool


def _apply_linear(op: Linear, tensors: Sequence[torch.Tensor], out: torch.Tensor | None = None):
    dtype = out.dtype if out is not None else tensors[0].dtype
    return linear_combine(tensors, [c for _, c in op.terms], dtype, out=out)


def _apply_delta(op: DeltaMerge, tensors: Sequence[torch.Tensor], out: torch.Tensor | None = None):
    if out is not None:
        raise ValueError("a delta merge is computed whole; it does not write into `out`")
    return delta_merge(tensors[0], tensors[1:], op.weights, op.scale, op.density)


OPS: dict[type, OpKind] = {
    Linear: OpKind(_apply_linear, rowwise=True),
    DeltaMerge: OpKind(_apply_delta, rowwise=False),
}


def op_kind(op: object) -> OpKind:
    """The entry of `OPS` for an op.

    Raises:
        ValueError naming the op's type and the known ones.
    """
    kind = OPS.get(type(op))
    if kind is None:
        known = ", ".join(t.__name__ for t in OPS)
        raise ValueError(f"unknown merge op {type(op).__name__} ({op!r}); known ops: {known}")
    return kind
