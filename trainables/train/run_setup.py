"""Setting up one training run for the loop (trainables/train/loop.py): this process's rank and
world, its device, the base model and tokenizer, the mode's preparation, AdamW per parameter
group, and resuming a checkpoint's trainer state.

`_prepare_model(model, exp, device, policy, strategy)` and `_adamw(named, exp)` are what
benchmarks/bench_train_step.py builds a run from too. Tests:
.venv/bin/python -m pytest -q tests/trainables/train/test_train_modes.py
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.trainables.devices import require_cuda
from layerswap.trainables.merge.arch import check_model_type
from layerswap.trainables.train.finite import check_loaded_weights
from layerswap.trainables.train.modes import Prepared, prepare
from layerswap.trainables.train.precision import Policy, apply_precision, warn_if_updates_vanish
from layerswap.trainables.train.sharded import DCP_DIR, load_sharded
from layerswap.trainables.train.state import (
    STATE_DIR,
    load_master,
    load_optimizer,
    read_state,
    resumable,
)
from layerswap.trainables.train.strategies import Strategy


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
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    trc = exp.trust_remote_code
    tok = AutoTokenizer.from_pretrained(exp.base, trust_remote_code=trc)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    # Full-weight modes resume from the checkpoint's own weights; LoRA from base + adapter.
    src = resume_from if (resume_from is not None and not exp.is_lora) else exp.base
    # The CLI checked the family where it ran; the worker checks the config it loads (another
    # node's cache, the Python API), before the weights (an 8B download) are fetched and loaded.
    config = AutoConfig.from_pretrained(src, trust_remote_code=trc)
    check_model_type(config.to_dict(), f"base {exp.base}")
    # safetensors only: a Hub base (the CLI reads local folders' headers, not a Hub id's) with
    # pickled weights alone is refused by transformers instead of unpickled
    model = AutoModelForCausalLM.from_pretrained(src, config=config, dtype="auto", trust_remote_code=trc, use_safetensors=True)  # fmt: skip
    check_loaded_weights(model, src)  # a NaN in the base: named now, not as a NaN loss later
    return tok, model


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
