"""How a training run optimises and runs: hyperparameters, scaling, precision, failures, debug.

The sections `hyper`, `scaling`, `precision`, `failure` and `debug` of `TrainExperiment`
(spaces/train_experiment.py), with the bounds that keep sizes trainable. Pure data: no torch,
no ray. Tests: .venv/bin/python -m pytest -q tests/spaces/test_train_experiment.py
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from layerswap.spaces.base import StrictModel

Schedule = Literal["linear", "wsd", "constant_with_warmup"]
# Bounds on sizes that set memory or time before the first step: past these a run would exhaust
# memory building its batches or never end, not train (the limit is named in the message).
MAX_BATCH = 1_048_576  # samples per step (global batch, micro-batch)
MAX_SEQ_LEN = 1_048_576  # tokens per sample
MAX_STEPS = 1_000_000_000  # optimizer steps (max_steps, warmup_steps, log_every)
MAX_EPOCHS = 100_000
# AdamW divides lr by its bias correction (0.1 at step 1 with beta1 0.9): an lr near float32's
# largest number overflowed inside torch's optimizer; any lr above 1 is a typo already.
MAX_LR = 1_000.0


class Hyper(StrictModel):
    """Optimisation. `batch_size` is global (samples per optimizer step over all workers)."""

    lr: float = Field(gt=0, le=MAX_LR)
    """Peak learning rate (AdamW)."""
    schedule: Schedule = "linear"
    """Learning-rate schedule after warmup: linear decay to 0, WSD (warmup-stable-decay) or
    constant."""
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    """Steps of linear warmup from 0 to `lr`."""
    wsd_decay_frac: float = Field(0.1, ge=0, le=1)
    """WSD: the final share of steps over which the learning rate decays to 0."""
    beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1."""
    beta2: float = Field(0.999, ge=0, lt=1)
    """AdamW beta2."""
    eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this (None: no clipping)."""
    batch_size: int = Field(8, gt=0, le=MAX_BATCH)
    """Global batch: samples per optimizer step over all workers."""
    max_steps: int | None = Field(None, gt=0, le=MAX_STEPS)
    """Optimizer steps to train; give this or `epochs`."""
    epochs: float | None = Field(None, gt=0, le=MAX_EPOCHS)
    """Passes over the training data (may be fractional); give this or `max_steps`.
    Simultaneous mode counts passes over both datasets together while they alternate batch by
    batch, so each sees (n0 + n1) / 2 rows an epoch: a smaller dataset gets more passes, a
    larger one fewer (training prints them; the manifest records `passes`). Equalise their
    sizes with the datasets' `limit` for `epochs` passes of each."""
    seq_len: int = Field(1024, gt=1, le=MAX_SEQ_LEN)
    """Longest training sample in tokens. A longer row is cut to it (the end of its answer turn,
    end-of-turn token included, is lost), or dropped when its prompt turn fills it; training
    prints how many of each per dataset, and the manifest records `n_truncated`, `n_dropped`."""
    seed: int = 0
    """Seeds data order, the validation split and dropout."""
    val_share: float = Field(0.05, ge=0, lt=1)
    """Share of the data held out for validation loss at checkpoints."""
    log_every: int = Field(1, ge=1, le=MAX_STEPS)
    """Report metrics every N steps."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, more compute (big models)."""
    micro_batch_size: int | None = Field(None, gt=0, le=MAX_BATCH)
    """Samples per worker per forward pass; the worker's share of `batch_size` is accumulated
    over several passes (None: one pass per step)."""

    @model_validator(mode="after")
    def _length(self) -> Hyper:
        if (self.max_steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of max_steps or epochs")
        return self


Strategy = Literal["ddp", "fsdp"]


# CPUs a GPU worker reserves unless told: one thread starves a GPU worker's host side (data,
# and the optimizer step under cpu_offload); 8 fits every GPU node type cluster.yaml names
# (p5.48xlarge: 24 CPUs a GPU; g6e.12xlarge: 12).
GPU_WORKER_CPUS = 8.0


class Scaling(StrictModel):
    """Workers and how the model is spread over them.

    `ddp`: every worker holds the whole model and optimizer state. `fsdp`: FSDP2 shards weights,
    gradients and optimizer state over the workers (full-weight modes; LoRA stays on ddp).
    `cpu_offload` (fsdp): sharded weights and optimizer state live in CPU memory between uses.
    `accelerator_type`: Ray's GPU type label (e.g. "H100", "A10G"); Ray places workers only on
    such GPUs, and `layerswap train --plan` checks the memory plan against their size.
    """

    num_workers: int = Field(1, ge=1)
    """Training workers (processes); `hyper.batch_size` must divide evenly among them."""
    use_gpu: bool = False
    """Give each worker one GPU."""
    strategy: Strategy = "ddp"
    """"ddp" (every worker holds the whole model) or "fsdp" (FSDP2 shards it over workers)."""
    cpus_per_worker: float = Field(1.0, gt=0)
    """CPUs each worker reserves in Ray, and its torch threads (default: 1, or GPU_WORKER_CPUS
    with use_gpu: a GPU worker tokenizes, collates and, with cpu_offload, steps AdamW on them)."""
    cpu_offload: bool = False
    """fsdp: keep sharded weights and optimizer state in CPU memory between uses."""
    accelerator_type: str | None = None
    """Ray's GPU type label (e.g. "H100"): workers are placed only on such GPUs."""

    @model_validator(mode="before")
    @classmethod
    def _gpu_worker_cpus(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("use_gpu") and "cpus_per_worker" not in data:
            return {**data, "cpus_per_worker": GPU_WORKER_CPUS}
        return data

    @model_validator(mode="after")
    def _offload_needs_fsdp(self) -> Scaling:
        if self.cpu_offload and self.strategy != "fsdp":
            raise ValueError(f"cpu_offload: needs strategy fsdp (got {self.strategy!r})")
        return self


# What the optimizer steps on and what the forward pass computes in:
#   bf16-mixed  fp32 master weights and AdamW state, bf16 compute (autocast / FSDP2 param_dtype)
#   fp32        everything in fp32
#   bf16-pure   weights and AdamW state in bf16: half the memory, but updates smaller than a
#               weight's bf16 rounding step vanish (warned about at set-up)
#   auto        bf16-mixed for a bf16 or fp16 checkpoint, fp32 otherwise
PrecisionPolicy = Literal["auto", "bf16-mixed", "fp32", "bf16-pure"]


class Precision(StrictModel):
    """The training precision; `precision: bf16-mixed` is shorthand for `{policy: bf16-mixed}`.

    `checkpoint_dtype`: the dtype of the saved HF weights, `base` (the base checkpoint's) or
    `fp32` (keeps updates smaller than a bf16 step visible to merging). When the saved weights
    are coarser than the masters, the masters are kept beside them for resuming
    (trainer_state/), and the manifest says what was written.
    """

    policy: PrecisionPolicy = "auto"
    """"bf16-mixed" (fp32 masters, bf16 compute), "fp32", "bf16-pure" (bf16 weights and AdamW
    state) or "auto" (bf16-mixed for a bf16/fp16 checkpoint, else fp32)."""
    checkpoint_dtype: Literal["base", "fp32"] = "base"
    """dtype of the saved weights: the base checkpoint's, or fp32 (keeps updates smaller than a
    bf16 step visible to merging)."""


class Failure(StrictModel):
    """What Ray Train does when a worker dies."""

    max_failures: int = Field(0, ge=-1)
    """Restarts from the last checkpoint after a worker failure (-1: forever, Ray's convention)."""


class Debug(StrictModel):
    """Fault injection for tests: raise once at `fail_at_step` (the marker file makes it once)."""

    fail_at_step: int | None = Field(None, ge=0)
    """Raise once at this update (0-based); needs `fail_marker`."""
    fail_marker: str | None = None
    """File whose existence records that the failure happened, so it happens once."""
    kill_rank: int | None = Field(None, ge=0)
    """Instead of raising on every rank, this rank's process SIGKILLs itself (a lost worker)."""
    step_log: str | None = None
    """A JSON-lines file rank 0 appends {step, start, group, time, tokens} to after each step."""
    # A test can then act (remove a node, kill the driver) while a run is between checkpoints,
    # without racing a tiny model's fast steps.
    step_delay_s: float = Field(0.0, ge=0)
    """Seconds every rank sleeps after each update."""

    @model_validator(mode="after")
    def _marker(self) -> Debug:
        if self.fail_at_step is not None and self.fail_marker is None:
            raise ValueError("debug.fail_at_step needs debug.fail_marker (so it fails only once)")
        return self
