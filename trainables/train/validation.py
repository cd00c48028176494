"""Validation loss of a model under training, per dataset, split over the ranks.

`validation_losses(model, data, exp, rank, world, device, pad)` is what the loop reports at each
checkpoint and what trainables/train/revert.py scores finished experts with.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.trainables.train.data import TrainData, collate

if TYPE_CHECKING:
    from layerswap.trainables.train.precision import Policy


def sum_over_ranks(values: list[float], world: int, device) -> list[float]:
    """`values` summed element-wise over the ranks (a collective when world > 1)."""
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _summed_loss(model, rows: list, pad: int, device) -> tuple[float, float]:
    """(summed token cross-entropy, label tokens) of one batch of encoded rows."""
    b = {k: v.to(device) for k, v in collate(rows, pad).items()}
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    lab = b["labels"][:, 1:]
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),  # [rows * (T-1), vocab]
        lab.reshape(-1),
        ignore_index=-100,
        reduction="sum",
    )
    return ce.item(), float((lab != -100).sum())


def validation_losses(model, data: TrainData, exp: TrainExperiment, rank: int, world: int, device, pad: int, policy: Policy | None = None) -> list[float]:  # fmt: skip
    """Token-weighted validation loss per dataset (each rank scores a strided share).

    Every rank makes the same number of forward passes (a rank whose share has run out scores
    a row again and drops it): FSDP gathers each layer's weights in a collective per pass.
    Args:
        policy: compute under its autocast (as training does); None: the weights' own dtype.
    Returns:
        One mean token loss per validation set of `data`.
    """
    device = torch.device(device)
    autocast = policy.autocast(device) if policy is not None else nullcontext()
    per = max(1, exp.micro_batch)
    sums = []
    model.eval()
    with torch.no_grad(), autocast:
        for val in data.val:
            mine = val[rank::world]
            passes = math.ceil(math.ceil(len(val) / world) / per)  # the busiest rank's count
            loss_sum, n_tok = 0.0, 0.0
            for i in range(passes):
                rows = mine[i * per : (i + 1) * per]
                if not rows:  # keep in step with the other ranks; the result is dropped
                    _summed_loss(model, val[:1], pad, device)
                    continue
                ce, n = _summed_loss(model, rows, pad, device)
                loss_sum, n_tok = loss_sum + ce, n_tok + n
            sums += [loss_sum, n_tok]
    model.train()
    sums = sum_over_ranks(sums, world, device) if sums else sums
    return [sums[i] / max(1.0, sums[i + 1]) for i in range(0, len(sums), 2)]
