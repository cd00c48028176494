"""The training loop's log and checkpoint steps (trainables/train/loop.py): whether a checkpoint
is due, the step's reported metrics, validation losses, the finite check before saving, and
writing `workdir/checkpoints/samples_*`.

`checkpoint_due(exp, done, samples, total)` is the one rule of when a run checkpoints (the study
planner counts checkpoints by it too). Tests:
.venv/bin/python -m pytest -q tests/trainables/train/test_checkpoint_policy.py
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.trainables.train.finite import check_checkpoint, nonfinite_weight
from layerswap.trainables.train.sharded import save_sharded
from layerswap.trainables.train.state import build_manifest, checkpoint_name, save_checkpoint
from layerswap.trainables.train.train_step import _Run, _StepOut
from layerswap.trainables.train.validation import sum_over_ranks, validation_losses


def checkpoint_due(exp: TrainExperiment, done: int, samples: int, total: int) -> bool:
    """Whether this step is the last one or crosses a checkpoint_every_samples boundary."""
    if done == total:
        return True
    every = exp.checkpoint_every_samples
    # Due when a multiple of `every` falls in (samples - batch_size, samples]: it need not divide.
    return every is not None and samples // every > (samples - exp.hyper.batch_size) // every


def _metrics(run: _Run, out: _StepOut, done: int, samples: int, ckpt_due: bool) -> dict:
    """The step's reported metrics; loss and tokens are summed over ranks (a collective)."""
    loss_sum, tokens = sum_over_ranks([out.loss.item(), run.tokens_local], run.world, run.device)
    return {
        "step": done,
        "samples": samples,
        "epoch": samples / sum(len(s) for s in run.data.streams),
        "loss": loss_sum / run.world,
        "lr": out.lr,
        "grad_norm": out.grad_norm,
        "active": out.group,
        "stream": out.stream,
        "tokens": tokens,
        "elapsed_s": time.time() - run.t0,
        "time": time.time(),
        "checkpoint": ckpt_due,  # on every rank (the path itself only exists on rank 0)
    }


def _validate(run: _Run, metrics: dict) -> list[float]:
    """Validation loss per dataset (on every rank), also added to `metrics`."""
    val = validation_losses(
        run.prep.model, run.data, run.exp, run.rank, run.world, run.device, run.pad, run.policy
    )
    if val:
        metrics["val_loss"] = sum(val) / len(val)
        metrics |= {f"val_loss__{i}": v for i, v in enumerate(val)}
    return val


def _save_checkpoint(
    run: _Run, done: int, samples: int, lr: float, val: list[float], train_loss: float
) -> Path | None:
    """Write `workdir/checkpoints/samples_*` for the step and return the folder holding this
    rank's files: rank 0's job under ddp (None elsewhere), every rank's under fsdp."""
    path = run.workdir / "checkpoints" / checkpoint_name(samples)
    manifest = build_manifest(run.exp, run.prep, run.data, done, samples, run.world, val, train_loss, run.policy, run.strategy.sharded, run.fingerprint)  # fmt: skip
    state = {"step": done, "samples": samples, "lr": lr, "total_steps": run.total}
    if run.strategy.sharded:
        return save_sharded(path, model=run.prep.model, tokenizer=run.tok, optimizers=run.optimizers, manifest=manifest, state=state, policy=run.policy)  # fmt: skip
    if run.rank != 0:
        return None
    if path.exists():  # a re-run of the same deterministic step writes the same
        shutil.rmtree(path)
    save_checkpoint(
        path,
        model=run.prep.model,
        tokenizer=run.tok,
        optimizers=run.optimizers,
        names=run.names,
        policy=run.policy,
        manifest=manifest,
        state=state,
    )
    return path


def _check_finite_checkpoint(run: _Run, metrics: dict, done: int) -> None:
    """NonFiniteTraining, on every rank alike, when step `done`'s checkpoint would hold a NaN or
    Inf: its losses are summed over ranks already; a sharded model's weight check is summed."""
    losses = {k: v for k, v in metrics.items() if k == "loss" or k.startswith("val_loss")}
    bad = float(nonfinite_weight(run.prep.model) is not None)
    if run.strategy.sharded:
        bad = sum_over_ranks([bad], run.world, run.device)[0]
    check_checkpoint(done, losses, run.prep.model, bad)
