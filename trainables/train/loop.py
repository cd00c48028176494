"""The training loop: one plain function, the same in one process and under torch.distributed.

`run_training(exp, workdir=Path("out"))` trains rank 0 of 1; under an initialised process group
(gloo on CPU, nccl on GPU) every rank calls it and the model is wrapped in DDP. Ray Train calls
it from trainables/train/ray_train.py.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.trainables.devices import require_cuda
from layerswap.trainables.train.data import (
    TrainData,
    build_data,
    collate,
    derive_seed,
    local_batch,
    total_steps,
)
from layerswap.trainables.train.finite import (
    check_checkpoint,
    check_loaded_weights,
    check_step,
    nonfinite_weight,
)
from layerswap.trainables.train.modes import Prepared, prepare
from layerswap.trainables.train.precision import (
    Policy,
    apply_precision,
    resolve_precision,
    warn_if_updates_vanish,
)
from layerswap.trainables.train.schedules import lr_at
from layerswap.trainables.train.sharded import DCP_DIR, load_sharded, save_sharded
from layerswap.trainables.train.state import (
    STATE_DIR,
    build_manifest,
    keep_resume_state_of_newest,
    load_master,
    load_optimizer,
    prune_checkpoints,
    read_manifest,
    read_state,
    resumable,
    save_checkpoint,
)
from layerswap.trainables.train.strategies import Strategy, pick
from layerswap.trainables.train.validation import sum_over_ranks, validation_losses

__all__ = ["TrainResult", "read_manifest", "run_training"]


@dataclass
class TrainResult:
    final_checkpoint: Path | None  # rank 0 only
    step: int
    samples: int
    losses: list[float] = field(default_factory=list)  # this rank's per-step train losses
    checkpoints: list[Path] = field(default_factory=list)  # rank 0 only


def _dist() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _adamw(named, exp: TrainExperiment) -> torch.optim.AdamW:
    h = exp.hyper
    # HF convention: no weight decay on biases and norm weights (1-D tensors).
    decay = [p for _, p in named if p.ndim >= 2]
    no_decay = [p for _, p in named if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": h.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    # fused on CUDA: one kernel per parameter group instead of the for-each path's launches,
    # and none of its per-step temporaries the size of a moment.
    fused = bool(decay) and all(p.is_cuda for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=h.lr, betas=(h.beta1, h.beta2), eps=h.eps, fused=fused)


def _load(exp: TrainExperiment, resume_from: Path | None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trc = exp.trust_remote_code
    tok = AutoTokenizer.from_pretrained(exp.base, trust_remote_code=trc)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    # Full-weight modes resume from the checkpoint's own weights; LoRA from base + adapter.
    src = resume_from if (resume_from is not None and not exp.is_lora) else exp.base
    # safetensors only: a Hub base (the CLI reads local folders' headers, not a Hub id's) with
    # pickled weights alone is refused by transformers instead of unpickled
    model = AutoModelForCausalLM.from_pretrained(src, dtype="auto", trust_remote_code=trc, use_safetensors=True)  # fmt: skip
    check_loaded_weights(model, src)  # a NaN in the base: named now, not as a NaN loss later
    return tok, model


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


@dataclass
class _StepOut:
    """One optimisation step's outcome, as logging and checkpointing read it."""

    stream: int
    group: str
    lr: float
    loss: torch.Tensor
    grad_norm: float


def _check_scaling(exp: TrainExperiment, world: int) -> None:
    """ValueError if the scaling settings cannot run on `world` workers."""
    h = exp.hyper
    if h.batch_size % world:
        raise ValueError(f"hyper.batch_size {h.batch_size} not divisible by {world} workers")


def _resolve_device(exp: TrainExperiment, device: str | torch.device | None) -> torch.device:
    """`device`, or by default cuda:$LOCAL_RANK under scaling.use_gpu, else cpu. use_gpu where
    CUDA is not usable is an error (trainables/devices.py), not a silent CPU run."""
    if device is None:
        if exp.scaling.use_gpu:
            require_cuda("scaling.use_gpu")
        use_gpu = exp.scaling.use_gpu and torch.cuda.is_available()
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if use_gpu else "cpu"
    return torch.device(device)


def enable_checkpointing(model) -> None:
    """Activation checkpointing, non-reentrant, by whichever name the installed transformers
    has: `activation_checkpointing_enable` (5.2x, where `gradient_checkpointing_enable` is a
    deprecated alias due to go in v6) or the old one."""
    kw = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def _prepare_model(model, exp: TrainExperiment, device: torch.device, policy: Policy, strategy: Strategy) -> Prepared:  # fmt: skip
    """The loaded model prepared for the mode, cast to the precision policy (trainable weights
    in the master dtype) and on `device` — except under a sharding strategy, which places and
    casts each unit as it shards it (the whole fp32 model never exists on one GPU)."""
    prep = prepare(model, exp, model.config.num_hidden_layers)
    warn_if_updates_vanish(prep.model, policy, exp.hyper.lr)
    if not strategy.sharded:
        # Moved first, then cast: the fp32 masters are made on the device, so each worker's host
        # memory holds the base only in its own dtype (8 workers of an 8B bf16 base: 16 GB each).
        prep.model.to(device)
        apply_precision(prep.model, policy)
    if exp.hyper.gradient_checkpointing:
        enable_checkpointing(model)
        if prep.is_lora:
            model.enable_input_require_grads()
    return prep


def _check_accumulation(model, exp: TrainExperiment) -> None:
    """ValueError when micro-batches are asked of a model whose loss ignores HF's
    `num_items_in_batch` (summing per-pass means would scale the step by the pass count)."""
    if exp.micro_batch == exp.hyper.batch_size // exp.scaling.num_workers:
        return
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters.values()
    takes = any(p.kind is p.VAR_KEYWORD or p.name == "num_items_in_batch" for p in params)
    if not takes or not getattr(base, "accepts_loss_kwargs", True):  # HF's flag, where set
        raise ValueError(
            f"hyper.micro_batch_size: {type(base).__name__} does not take num_items_in_batch, "
            "so its loss cannot be accumulated over micro-batches exactly; leave it unset"
        )


def _restore(resume: Path, prep: Prepared, optimizers: dict, strategy: Strategy, policy: Policy) -> int:  # fmt: skip
    """Load a checkpoint's trainer state into the wrapped model and optimizers; returns its step.

    The model was loaded from the checkpoint's HF weights (full modes) or the base (LoRA); what
    those lack comes from trainer_state/: the LoRA adapter, the fp32 masters when the weights
    were saved coarser, AdamW's moments (all of it sharded, for FSDP).
    """
    if not resumable(resume):
        raise ValueError(f"{resume}: not resumable, its optimizer state was dropped when a newer checkpoint was written (only a run's newest checkpoint keeps it); resume from the run's newest checkpoint")  # fmt: skip
    sharded_ckpt = (resume / STATE_DIR / DCP_DIR).is_dir()
    if strategy.sharded:
        load_sharded(resume, prep.model, optimizers)
        return read_state(resume)["step"]
    if sharded_ckpt:
        raise ValueError(f"{resume}: written by an FSDP run (sharded trainer state); resume it with scaling.strategy fsdp under torch.distributed")  # fmt: skip
    if prep.is_lora:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(prep.model, load_file(resume / "adapter_model.safetensors"))
    elif policy.keeps_master:
        load_master(prep.model, resume)  # the checkpoint's weights are rounded to policy.save
    for g, opt in optimizers.items():
        f = resume / STATE_DIR / f"optimizer__{g}.safetensors"
        if f.exists():
            load_optimizer(opt, prep.groups[g], f)
    return read_state(resume)["step"]


def _next_batch(run: _Run, step: int) -> tuple[int, str, list[dict[str, torch.Tensor]], int]:
    """(stream, active group, this rank's share of the batch as micro-batches on the device,
    its label tokens). Everything counted here is counted on the host, before the copy: a count
    read back from the device would wait for the previous step's GPU work at every step."""
    stream, own, group = run.prep.active(step)
    h = run.exp.hyper
    rows = local_batch(run.data.streams[stream], own, h.batch_size, run.rank, run.world)
    micro = run.exp.micro_batch
    batches = [collate(rows[i : i + micro], run.pad) for i in range(0, len(rows), micro)]
    run.tokens_local += float(sum(b["attention_mask"].sum() for b in batches))
    n_items = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    on_device = [{k: v.to(run.device, non_blocking=True) for k, v in b.items()} for b in batches]
    return stream, group, on_device, n_items


def _forward_backward(run: _Run, batches: list[dict[str, torch.Tensor]], n_items: int) -> torch.Tensor:  # fmt: skip
    """Accumulate gradients over the micro-batches; returns this rank's mean token loss.

    Each micro-batch's loss is its summed token loss over the label tokens of the WHOLE local
    batch (`n_items`, HF's `num_items_in_batch`), so the accumulated gradient is the one-pass
    gradient.
    """
    kw = {"num_items_in_batch": n_items} if len(batches) > 1 else {}
    total = torch.zeros((), device=run.device)
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1  # DDP reduces gradients over workers once per step
        with run.strategy.no_sync(run.net, last), run.policy.autocast(run.device):
            loss = run.net(**batch, **kw).loss
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
    path = run.workdir / "checkpoints" / f"samples_{samples:09d}"
    manifest = build_manifest(run.exp, run.prep, run.data, done, samples, run.world, val, train_loss, run.policy, run.strategy.sharded)  # fmt: skip
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
        result.checkpoints.append(path)
        result.final_checkpoint = path
        prune_checkpoints(result.checkpoints, run.exp.keep_checkpoints)
    if run.world > 1:
        dist.barrier()  # every rank's files of the new checkpoint are written
    if path is not None and run.rank == 0 and run.exp.resume_state == "newest":
        keep_resume_state_of_newest(result.checkpoints)
    return path


def run_training(
    exp: TrainExperiment,
    *,
    workdir: str | Path,
    resume_from: str | Path | None = None,
    report=None,
    device: str | torch.device | None = None,
) -> TrainResult:
    """Train the experiment's expert; checkpoints go to `workdir/checkpoints/samples_*`.

    Args:
        exp: the validated experiment.
        workdir: this process's output folder (rank 0 writes checkpoints there).
        resume_from: a checkpoint dir written by this function; training continues at its step.
        report: callable(metrics: dict, checkpoint: Path | None), called on every rank at each
            log step and checkpoint (checkpoint set on rank 0 only).
        device: default cuda:$LOCAL_RANK when scaling.use_gpu and CUDA is there, else cpu.
    Returns:
        TrainResult.
    """
    rank, world = _dist()
    h = exp.hyper
    _check_scaling(exp, world)
    device = _resolve_device(exp, device)
    workdir = Path(workdir)
    resume = Path(resume_from) if resume_from is not None else None
    torch.manual_seed(h.seed)  # LoRA init and anything else drawn at set-up
    tok, model = _load(exp, resume)
    policy = resolve_precision(exp)  # from the base's config: a resumed run's weights may differ
    data = build_data(exp, tok)
    total = total_steps(exp, data)
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
    )
    result = TrainResult(None, start, start * h.batch_size)
    run.net.train()
    for step in range(start, total):
        _maybe_fail(exp, step, rank)
        out = _train_step(run, step)
        result.losses.append(out.loss.item())
        done, samples = step + 1, (step + 1) * h.batch_size
        result.step, result.samples = done, samples
        _append_step_log(run, done, out.group)
        if exp.debug.step_delay_s:
            time.sleep(exp.debug.step_delay_s)
        ckpt_due = checkpoint_due(exp, done, samples, total)
        if not (ckpt_due or done % h.log_every == 0):
            continue
        metrics = _metrics(run, out, done, samples, ckpt_due)
        path = _checkpoint(run, result, metrics, done, samples, out.lr) if ckpt_due else None
        if report is not None:
            report(metrics, path)
    return result
