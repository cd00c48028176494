"""The training loop: one plain function, the same in one process and under torch.distributed.

`run_training(exp, workdir=Path("out"))` trains rank 0 of 1; under an initialised process group
(gloo on CPU, nccl on GPU) every rank calls it and the model is wrapped in DDP. Ray Train calls
it from trainables/train/ray_train.py.

The set-up is trainables/train/run_setup.py, one step trainables/train/train_step.py, the log
and checkpoint steps trainables/train/checkpoint_step.py.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.trainables.atomic import remove_left_temps
from layerswap.trainables.data_fingerprint import data_fingerprint, resume_data_problem
from layerswap.trainables.train.checkpoint_step import (
    _check_finite_checkpoint,
    _metrics,
    _save_checkpoint,
    _validate,
    checkpoint_due,
)
from layerswap.trainables.train.data import build_data, passes_note, seq_len_notes, total_steps
from layerswap.trainables.train.precision import resolve_precision
from layerswap.trainables.train.run_setup import (
    _adamw,
    _check_accumulation,
    _check_scaling,
    _dist,
    _load,
    _prepare_model,
    _resolve_device,
    _restore,
)
from layerswap.trainables.train.side_notes import side_notes
from layerswap.trainables.train.state import (
    checkpoints_up_to,
    keep_resume_state_of_newest,
    prune_checkpoints,
    read_manifest,
)
from layerswap.trainables.train.strategies import pick
from layerswap.trainables.train.train_step import _append_step_log, _maybe_fail, _Run, _train_step

__all__ = ["TrainResult", "read_manifest", "run_training"]


@dataclass
class TrainResult:
    final_checkpoint: Path | None  # rank 0 only
    step: int
    samples: int
    # this rank's per-step train losses: one worker's is the step's token mean; with several,
    # each rank's share scaled by the world size, whose mean over ranks is (train_step.py)
    losses: list[float] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)  # rank 0: this process's, still there


def _checkpoint(
    run: _Run, result: TrainResult, metrics: dict, done: int, samples: int, lr: float
) -> Path | None:
    """Validate, save and prune, then hold every rank until the checkpoint is written.

    Returns the folder holding this rank's checkpoint files (rank 0 always; other ranks only
    under fsdp with folders of their own), else None.
    """
    val = _validate(run, metrics)
    _check_finite_checkpoint(run, metrics, done)
    path = _save_checkpoint(run, done, samples, lr, val, metrics["loss"])
    if path is not None:
        # Only now, with the new checkpoint whole: the folder's older ones (also those a killed
        # process wrote before this one resumed, the resume point among them) may go.
        result.final_checkpoint = path
        prune_checkpoints(checkpoints_up_to(path), run.exp.keep_checkpoints)
        result.checkpoints = [p for p in [*result.checkpoints, path] if p.is_dir()]
    if run.world > 1:
        dist.barrier()  # every rank's files of the new checkpoint are written
    if path is not None and run.rank == 0 and run.exp.resume_state == "newest":
        keep_resume_state_of_newest(checkpoints_up_to(path))
    return path


def _progress(run: _Run, samples: int) -> dict:
    """The report's totals and throughput: what the progress line (trainables/train/progress.py)
    prints besides the step's own numbers. samples/s is this process's mean since its training
    loop started (a resumed run counts from its resume point)."""
    batch = run.exp.hyper.batch_size
    elapsed = max(time.time() - run.t0, 1e-9)
    return {
        "total_steps": run.total,
        "total_samples": run.total * batch,
        "samples_per_s": (samples - run.start * batch) / elapsed,
    }


def run_training(
    exp: TrainExperiment,
    *,
    workdir: str | Path,
    resume_from: str | Path | None = None,
    report=None,
    device: str | torch.device | None = None,
    say: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train the experiment's expert; checkpoints go to `workdir/checkpoints/samples_*`.

    Args:
        exp: the validated experiment.
        workdir: this process's output folder (rank 0 writes checkpoints there).
        resume_from: a checkpoint dir written by this function; training continues at its step.
        report: callable(metrics: dict, checkpoint: Path | None), called on every rank at each
            log step and checkpoint (checkpoint set on rank 0 only); the metrics carry what the
            progress line prints (trainables/train/progress.py).
        device: default cuda:$LOCAL_RANK when scaling.use_gpu and CUDA is there, else cpu.
        say: how rank 0 tells the user a line about the run before it trains (rows cut to
            seq_len, unequal simultaneous streams, a partition's sides and data); None: print
            it. A Ray worker's stdout is nobody's: it sends them to the driver
            (trainables/train/ray_progress.py).
    Returns:
        TrainResult.
    """
    rank, world = _dist()
    h = exp.hyper
    _check_scaling(exp, world)
    device = _resolve_device(exp, device)
    workdir = Path(workdir)
    resume, fingerprint = _starting_point(exp, workdir, resume_from, rank)
    torch.manual_seed(h.seed)  # LoRA init and anything else drawn at set-up
    tok, model = _load(exp, resume)
    policy = resolve_precision(exp)  # from the base's config: a resumed run's weights may differ
    data = build_data(exp, tok)
    total = total_steps(exp, data)
    if rank == 0:
        note = passes_note(exp, data, total)
        notes = side_notes(exp, model.config.num_hidden_layers) + seq_len_notes(exp, data)
        for line in notes + ([note] if note is not None else []):
            say(line) if say is not None else print(line, flush=True)
    strategy = pick(exp, world)
    prep = _prepare_model(model, exp, device, policy, strategy)
    _check_accumulation(prep.model, exp)
    net = strategy.wrap(prep, exp, policy, device, world)  # FSDP: new (sharded) parameters
    names = {id(p): n for n, p in prep.model.named_parameters()}
    optimizers = {g: _adamw(named, exp) for g, named in prep.groups.items()}
    start = _restore(resume, prep, optimizers, strategy, policy) if resume is not None else 0
    run = _Run(
        exp=exp,
        tok=tok,
        data=data,
        prep=prep,
        policy=policy,
        strategy=strategy,
        net=net,
        optimizers=optimizers,
        names=names,
        device=device,
        workdir=workdir,
        rank=rank,
        world=world,
        pad=tok.pad_token_id,
        start=start,
        total=total,
        step_log=Path(exp.debug.step_log) if exp.debug.step_log and rank == 0 else None,
        t0=time.time(),
        fingerprint=fingerprint,
    )
    return _train_steps(run, report)


def _starting_point(exp: TrainExperiment, workdir: Path, resume_from, rank: int) -> tuple[Path | None, dict]:  # fmt: skip
    """The checkpoint to resume (None: from scratch) and the data fingerprint of this run, after
    clearing a killed run's half-written checkpoint (rank 0).

    A SIGKILLed run's half-written checkpoint (a whole model each) goes before any checkpoint is
    written. The caller is the run's one writer: `train --no-ray` holds the run's lock
    (run.train_expert), an in-trial sweep trial works for the sweep that holds its folder's
    (experts/sweep.py), and a Ray worker's workdir is a fresh temporary folder. The fingerprint
    is taken before the data is read and compared before any weight loads: a checkpoint trained
    on other content of a dataset file is not continued (the driver refused it already; this
    covers Ray's own restore, `--resume CKPT` and the Python API).
    """
    if rank == 0:
        remove_left_temps(workdir / "checkpoints")
    resume = Path(resume_from) if resume_from is not None else None
    now = functools.cache(lambda: data_fingerprint(exp))  # one hash, whoever asks first
    if resume is not None and (problem := resume_data_problem(exp, read_manifest(resume), now)):
        raise ValueError(f"{resume}: {problem}")
    # Only rank 0 writes manifests (checkpoint_step, sharded.save_sharded): the other ranks
    # hash only to compare a checkpoint they resume from, above.
    return resume, now() if rank == 0 else {}


def _train_steps(run: _Run, report) -> TrainResult:
    """Steps run.start..run.total: log, checkpoint and report as the experiment asks."""
    exp, h, rank = run.exp, run.exp.hyper, run.rank
    result = TrainResult(None, run.start, run.start * h.batch_size)
    run.net.train()
    for step in range(run.start, run.total):
        _maybe_fail(exp, step, rank)
        out = _train_step(run, step)
        result.losses.append(out.loss.item())
        done, samples = step + 1, (step + 1) * h.batch_size
        result.step, result.samples = done, samples
        _append_step_log(run, done, out.group)
        if exp.debug.step_delay_s:
            time.sleep(exp.debug.step_delay_s)
        ckpt_due = checkpoint_due(exp, done, samples, run.total)
        if not (ckpt_due or done % h.log_every == 0):
            continue
        metrics = _metrics(run, out, done, samples, ckpt_due) | _progress(run, samples)
        path = _checkpoint(run, result, metrics, done, samples, out.lr) if ckpt_due else None
        if report is not None:
            report(metrics, path)
    return result
