"""One optimisation step of the training loop (trainables/train/loop.py): the batch for this
rank, forward and backward over its micro-batches, gradient clipping and the active group's
AdamW update, plus the test-only per-step hooks (injected failures, the step log).

`_Run` is what the steps of one run share; `_train_step(run, step)` makes one step. Tests:
.venv/bin/python -m pytest -q tests/trainables/train/test_host_counts.py
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.trainables.train.data import TrainData, collate, derive_seed, local_batch
from layerswap.trainables.train.finite import check_step
from layerswap.trainables.train.modes import Prepared
from layerswap.trainables.train.precision import Policy
from layerswap.trainables.train.schedules import lr_at
from layerswap.trainables.train.strategies import Strategy


@dataclass
class _Run:
    """What the steps of one training run share: fixed at set-up, except tokens_local."""

    exp: TrainExperiment
    tok: Any
    data: TrainData
    prep: Prepared
    policy: Policy
    strategy: Strategy
    net: torch.nn.Module  # prep.model, its DDP wrapper, or prep.model sharded in place (FSDP)
    optimizers: dict[str, torch.optim.AdamW]
    names: dict[int, str]  # id(parameter) -> name, for the optimizer state files
    device: torch.device
    workdir: Path
    rank: int
    world: int
    pad: int
    start: int
    total: int
    step_log: Path | None  # rank 0 only
    t0: float
    tokens_local: float = 0.0  # non-padding tokens this rank has trained on since `start`
    # the dataset files' content as this run read them (data_fingerprint.py), for manifests
    fingerprint: dict = field(default_factory=dict)


@dataclass
class _StepOut:
    """One optimisation step's outcome, as logging and checkpointing read it."""

    stream: int
    group: str
    lr: float
    loss: torch.Tensor
    grad_norm: float


def _maybe_fail(exp: TrainExperiment, step: int, rank: int) -> None:
    d = exp.debug
    if d.fail_at_step is None or step != d.fail_at_step:
        return
    if d.kill_rank is not None and d.kill_rank != rank:
        return
    marker = Path(f"{d.fail_marker}.rank{rank}")
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        if d.kill_rank is not None:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected failure at step {step} (rank {rank})")


def _next_batch(run: _Run, step: int) -> tuple[int, str, list[dict[str, torch.Tensor]], int]:
    """(stream, active group, this rank's share of the batch as micro-batches on the device,
    its label tokens: `_step_items` sums them over the ranks). Everything counted here is
    counted on the host, before the copy: a count read back from the device would wait for the
    previous step's GPU work at every step."""
    stream, own, group = run.prep.active(step)
    h = run.exp.hyper
    rows = local_batch(run.data.streams[stream], own, h.batch_size, run.rank, run.world)
    micro = run.exp.micro_batch
    batches = [collate(rows[i : i + micro], run.pad) for i in range(0, len(rows), micro)]
    run.tokens_local += float(sum(b["attention_mask"].sum() for b in batches))
    n_items = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    on_device = [{k: v.to(run.device, non_blocking=True) for k, v in b.items()} for b in batches]
    return stream, group, on_device, n_items


def _step_items(run: _Run, n_items: int, passes: int) -> tuple[int | torch.Tensor | None, int]:
    """(HF's `num_items_in_batch` for every micro-batch of this rank's step, the factor its loss
    is multiplied by).

    One process: None for a single pass (HF's token mean, as before) or the step's label-token
    count, factor 1. Several workers: the step's label tokens summed over ALL ranks (one
    all-reduce of an int64 scalar on the model's device; left there, since reading it back
    would wait for the previous step's GPU work), factor the world size, because DDP and FSDP2
    average the ranks' gradients: each rank's loss is world x its summed token loss / the global
    count, and their average is the step's global token mean, however the tokens fall on the
    ranks. The count stays an integer tensor: FSDP2's MixedPrecisionPolicy casts floating
    forward inputs to the compute dtype, and a bf16 count of 4585.5 reads 4576 (loss off by 0.2 %).
    """
    if run.world == 1:
        return (n_items if passes > 1 else None), 1
    # int64: exact at any size; non_blocking, as the batches: a blocking copy to a GPU would
    # wait for the work queued before it
    count = torch.tensor(n_items, dtype=torch.int64).to(run.device, non_blocking=True)
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    return count, run.world


def _forward_backward(run: _Run, batches: list[dict[str, torch.Tensor]], n_items: int) -> torch.Tensor:  # fmt: skip
    """Accumulate gradients over the micro-batches; returns this rank's loss for the step.

    Each micro-batch's loss is its summed token loss over the label tokens of the WHOLE step
    (`_step_items`, HF's `num_items_in_batch`), so the accumulated gradient, once DDP/FSDP has
    averaged the ranks, is the one-pass gradient of the global batch's token-mean loss, the same
    for any number of workers. The returned loss is that scaled share: one worker's is the step's
    token mean, and the mean over ranks (what `_metrics` reports) is the global token mean.
    """
    items, factor = _step_items(run, n_items, len(batches))
    kw = {"num_items_in_batch": items} if items is not None else {}
    total = torch.zeros((), device=run.device)
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1  # DDP reduces gradients over workers once per step
        with run.strategy.no_sync(run.net, last), run.policy.autocast(run.device):
            loss = run.net(**batch, **kw).loss
        if factor != 1:
            loss = loss * factor
        loss.backward()
        total += loss.detach().float()
    return total


def _train_step(run: _Run, step: int) -> _StepOut:
    """One step on this rank's batch (accumulated over micro-batches); only the active group
    is updated."""
    h = run.exp.hyper
    stream, group, batches, n_items = _next_batch(run, step)
    lr = lr_at(h, step, run.total)
    for opt in run.optimizers.values():
        for g in opt.param_groups:
            g["lr"] = lr
    torch.manual_seed(derive_seed(h.seed, "step", step, run.rank))  # dropout: exact on resume
    loss = _forward_backward(run, batches, n_items)
    params = [p for _, p in run.prep.groups[group]]
    clip = h.grad_clip if h.grad_clip is not None else float("inf")
    grad_norm = run.strategy.grad_norm(params, clip)
    check_step(step + 1, run.total, loss, grad_norm)  # before the update: the weights stay finite
    run.optimizers[group].step()  # only the active group: idle moments stay as they are
    for opt in run.optimizers.values():
        opt.zero_grad(set_to_none=True)
    return _StepOut(stream, group, lr, loss, grad_norm)


def _append_step_log(run: _Run, done: int, group: str) -> None:
    """One JSON line per step in debug.step_log (rank 0, when set)."""
    if run.step_log is None:
        return
    with open(run.step_log, "a") as f:
        row = {"step": done, "start": run.start, "group": group, "time": time.time(), "tokens": run.tokens_local}  # fmt: skip
        f.write(json.dumps(row) + "\n")
