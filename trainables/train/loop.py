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
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from spaces.train_experiment import TrainExperiment
from trainables.train.data import (
    TrainData,
    build_data,
    collate,
    derive_seed,
    local_batch,
    total_steps,
)
from trainables.train.modes import Prepared, prepare
from trainables.train.precision import (
    Policy,
    apply_precision,
    resolve_precision,
    warn_if_updates_vanish,
)
from trainables.train.schedules import lr_at
from trainables.train.state import (
    STATE_DIR,
    build_manifest,
    load_master,
    load_optimizer,
    prune_checkpoints,
    read_manifest,
    read_state,
    save_checkpoint,
)

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


def _sum(values: list[float], world: int, device) -> list[float]:
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _adamw(named, exp: TrainExperiment) -> torch.optim.AdamW:
    h = exp.hyper
    # HF convention: no weight decay on biases and norm weights (1-D tensors).
    decay = [p for _, p in named if p.ndim >= 2]
    no_decay = [p for _, p in named if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": h.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=h.lr, betas=(h.beta1, h.beta2), eps=h.eps)


def _load(exp: TrainExperiment, resume_from: Path | None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trc = exp.trust_remote_code
    tok = AutoTokenizer.from_pretrained(exp.base, trust_remote_code=trc)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    # Full-weight modes resume from the checkpoint's own weights; LoRA from base + adapter.
    src = resume_from if (resume_from is not None and not exp.is_lora) else exp.base
    model = AutoModelForCausalLM.from_pretrained(src, dtype="auto", trust_remote_code=trc)
    return tok, model


def validation_losses(model, data: TrainData, exp: TrainExperiment, rank: int, world: int, device, pad: int, policy: Policy | None = None) -> list[float]:  # fmt: skip
    """Token-weighted validation loss per dataset (each rank scores a strided share).

    `policy`: compute under its autocast (as training does); None computes in the weights' dtype.
    """
    device = torch.device(device)
    autocast = policy.autocast(device) if policy is not None else nullcontext()
    sums = []
    model.eval()
    per = max(1, exp.micro_batch)
    with torch.no_grad(), autocast:
        for val in data.val:
            mine = val[rank::world]
            loss_sum, n_tok = 0.0, 0.0
            for i in range(0, len(mine), per):
                b = {k: v.to(device) for k, v in collate(mine[i : i + per], pad).items()}
                logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
                lab = b["labels"][:, 1:]
                ce = torch.nn.functional.cross_entropy(
                    logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                    lab.reshape(-1),
                    ignore_index=-100,
                    reduction="sum",
                )
                loss_sum += ce.item()
                n_tok += (lab != -100).sum().item()
            sums += [loss_sum, n_tok]
    model.train()
    sums = _sum(sums, world, device) if sums else sums
    return [sums[i] / max(1.0, sums[i + 1]) for i in range(0, len(sums), 2)]


def _maybe_fail(exp: TrainExperiment, step: int, rank: int) -> None:
    d = exp.debug
    if d.fail_at_step is None or step != d.fail_at_step:
        return
    marker = Path(f"{d.fail_marker}.rank{rank}")
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        raise RuntimeError(f"injected failure at step {step} (rank {rank})")


@dataclass
class _Run:
    """What the steps of one training run share: fixed at set-up, except tokens_local."""

    exp: TrainExperiment
    tok: Any
    data: TrainData
    prep: Prepared
    policy: Policy
    net: torch.nn.Module  # prep.model, or its DDP wrapper when world > 1
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
    if exp.scaling.strategy == "fsdp" and world > 1:
        raise ValueError("scaling.strategy fsdp is not implemented yet; use ddp")


def _resolve_device(exp: TrainExperiment, device: str | torch.device | None) -> torch.device:
    """`device`, or by default cuda:$LOCAL_RANK when scaling.use_gpu and CUDA is there, else cpu."""
    if device is None:
        use_gpu = exp.scaling.use_gpu and torch.cuda.is_available()
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if use_gpu else "cpu"
    return torch.device(device)


def _prepare_model(
    model, exp: TrainExperiment, resume: Path | None, device: torch.device, policy: Policy
) -> Prepared:
    """The loaded model prepared for the mode, cast to the precision policy (trainable weights
    in the master dtype), with the LoRA adapter or fp32 master weights restored on resume, on
    `device`."""
    prep = prepare(model, exp, model.config.num_hidden_layers)
    apply_precision(prep.model, policy)
    warn_if_updates_vanish(prep.model, policy, exp.hyper.lr)
    if exp.hyper.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if prep.is_lora:
            model.enable_input_require_grads()
    if resume is not None and prep.is_lora:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(prep.model, load_file(resume / "adapter_model.safetensors"))
    elif resume is not None and policy.keeps_master:
        load_master(prep.model, resume)  # the checkpoint's weights are rounded to policy.save
    prep.model.to(device)
    return prep


def _make_optimizers(
    prep: Prepared, exp: TrainExperiment, resume: Path | None
) -> tuple[dict[str, torch.optim.AdamW], int]:
    """One AdamW per parameter group, restored from `resume` if given, and the step to start at."""
    optimizers = {g: _adamw(named, exp) for g, named in prep.groups.items()}
    start = 0
    if resume is not None:
        st = read_state(resume)
        start = st["step"]
        for g, opt in optimizers.items():
            f = resume / STATE_DIR / f"optimizer__{g}.safetensors"
            if f.exists():
                load_optimizer(opt, prep.groups[g], f)
    return optimizers, start


def _wrap_ddp(model: torch.nn.Module, world: int, device: torch.device) -> torch.nn.Module:
    """`model` in DistributedDataParallel under more than one worker, else `model` itself."""
    if world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def _next_batch(run: _Run, step: int) -> tuple[int, str, list[dict[str, torch.Tensor]]]:
    """(stream, active group, this rank's share of the batch as micro-batches on the device)."""
    stream, own, group = run.prep.active(step)
    h = run.exp.hyper
    rows = local_batch(run.data.streams[stream], own, h.batch_size, run.rank, run.world)
    micro = run.exp.micro_batch
    batches = [collate(rows[i : i + micro], run.pad) for i in range(0, len(rows), micro)]
    run.tokens_local += float(sum(b["attention_mask"].sum() for b in batches))
    return stream, group, [{k: v.to(run.device) for k, v in b.items()} for b in batches]


def _no_sync(net: torch.nn.Module, last: bool):
    """Skip DDP's gradient all-reduce on all but the last micro-batch of a step."""
    return nullcontext() if last or not hasattr(net, "no_sync") else net.no_sync()


def _forward_backward(run: _Run, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """Accumulate gradients over the micro-batches; returns this rank's mean token loss.

    Each micro-batch's loss is its summed token loss over the label tokens of the WHOLE local
    batch (HF's `num_items_in_batch`), so the accumulated gradient is the one-pass gradient.
    """
    n_items = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    total = torch.zeros((), device=run.device)
    for i, batch in enumerate(batches):
        with _no_sync(run.net, i == len(batches) - 1), run.policy.autocast(run.device):
            loss = run.net(**batch, num_items_in_batch=n_items).loss
        loss.backward()
        total += loss.detach().float()
    return total


def _train_step(run: _Run, step: int) -> _StepOut:
    """One step on this rank's batch (accumulated over micro-batches); only the active group
    is updated."""
    h = run.exp.hyper
    stream, group, batches = _next_batch(run, step)
    lr = lr_at(h, step, run.total)
    for opt in run.optimizers.values():
        for g in opt.param_groups:
            g["lr"] = lr
    torch.manual_seed(derive_seed(h.seed, "step", step, run.rank))  # dropout: exact on resume
    loss = _forward_backward(run, batches)
    params = [p for _, p in run.prep.groups[group]]
    clip = h.grad_clip if h.grad_clip is not None else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
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


def _checkpoint_due(exp: TrainExperiment, done: int, samples: int, total: int) -> bool:
    """Whether this step is the last one or crosses a checkpoint_every_samples boundary."""
    if done == total:
        return True
    every = exp.checkpoint_every_samples
    # Due when a multiple of `every` falls in (samples - batch_size, samples]: it need not divide.
    return every is not None and samples // every > (samples - exp.hyper.batch_size) // every


def _metrics(run: _Run, out: _StepOut, done: int, samples: int, ckpt_due: bool) -> dict:
    """The step's reported metrics; loss and tokens are summed over ranks (a collective)."""
    loss_sum, tokens = _sum([out.loss.item(), run.tokens_local], run.world, run.device)
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
) -> Path:
    """Write `workdir/checkpoints/samples_*` for the step (rank 0's job) and return its path."""
    path = run.workdir / "checkpoints" / f"samples_{samples:09d}"
    if path.exists():  # a re-run of the same deterministic step writes the same
        shutil.rmtree(path)
    save_checkpoint(
        path,
        model=run.prep.model,
        tokenizer=run.tok,
        optimizers=run.optimizers,
        names=run.names,
        policy=run.policy,
        manifest=build_manifest(
            run.exp, run.prep, run.data, done, samples, run.world, val, train_loss, run.policy
        ),
        state={"step": done, "samples": samples, "lr": lr, "total_steps": run.total},
    )
    return path


def _checkpoint(
    run: _Run, result: TrainResult, metrics: dict, done: int, samples: int, lr: float
) -> Path | None:
    """Validate, save and prune on rank 0, then hold every rank until rank 0 is done.

    Returns the checkpoint's path on rank 0, None elsewhere.
    """
    val = _validate(run, metrics)
    path = None
    if run.rank == 0:
        path = _save_checkpoint(run, done, samples, lr, val, metrics["loss"])
        result.checkpoints.append(path)
        result.final_checkpoint = path
        prune_checkpoints(result.checkpoints, run.exp.keep_checkpoints)
    if run.world > 1:
        dist.barrier()
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
    prep = _prepare_model(model, exp, resume, device, policy)
    names = {id(p): n for n, p in prep.model.named_parameters()}
    optimizers, start = _make_optimizers(prep, exp, resume)
    run = _Run(
        exp=exp,
        tok=tok,
        data=data,
        prep=prep,
        policy=policy,
        net=_wrap_ddp(prep.model, world, device),
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
        ckpt_due = _checkpoint_due(exp, done, samples, total)
        if not (ckpt_due or done % h.log_every == 0):
            continue
        metrics = _metrics(run, out, done, samples, ckpt_due)
        path = _checkpoint(run, result, metrics, done, samples, out.lr) if ckpt_due else None
        if report is not None:
            report(metrics, path)
    return result
