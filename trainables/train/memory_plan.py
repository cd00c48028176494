"""A training experiment's GPU memory plan, from the model config alone (no weights, no Ray).

`memory_plan(exp, config)` estimates, per GPU under the experiment's strategy (ddp/fsdp) and
precision policy: parameters (total, trainable), weights, gradients, AdamW state, activations
and overhead, and whether it fits `scaling.accelerator_type`'s memory; `format_plan(plan)` is the
table `layerswap train EXP.yaml --plan` prints. Run: `layerswap train spaces/examples/
real_llama31_8b_math_full.yaml --plan [--gpu-memory 80]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.trainables.merge.arch import layer_index as layer_of
from layerswap.trainables.merge.arch import model_type_problem
from layerswap.trainables.train.model_shape import ModelShape, load_model_config, model_shape
from layerswap.trainables.train.modes import Split, trainable_split
from layerswap.trainables.train.precision import Policy, dtype_name, resolve_precision

GIB = 2**30
# Usable memory per GPU (GiB, as nvidia-smi reports it) by Ray's accelerator_type label.
# "A100" alone is ambiguous in Ray: the 40 GB part is assumed (name A100-80G for the larger).
GPU_MEMORY_GIB = {
    "H100": 79.6,
    "H200": 140.4,
    "A100-80G": 80.0,
    "A100-40G": 40.0,
    "A100": 40.0,
    "L40S": 45.0,
    "A10G": 22.5,
    "L4": 22.5,
    "V100": 16.0,
    "T4": 15.0,
}
# CUDA context, cuBLAS workspaces and caching-allocator fragmentation; NCCL's buffers on top
# when there are peers. A rule of thumb, not a measurement of this code.
CUDA_OVERHEAD = 2 * GIB
NCCL_OVERHEAD = 1 * GIB
# A CPU worker's process before any tensor: Python with torch, transformers, Ray and the trainer
# imported. Measured 2026-11-27 (2-core dev machine, torch 2.13 CPU): max RSS 0.39 GiB.
PROCESS_OVERHEAD = int(0.4 * GIB)

Phase = Literal["state", "backward", "step"]


@dataclass(frozen=True)
class Line:
    """One entry of the plan: `nbytes` per GPU (or per node, where="cpu").

    phase: "state" lives the whole run; "backward" only during forward/backward; "step" only
    during the optimizer step (the two transient phases never overlap).
    """

    label: str
    nbytes: int
    phase: Phase = "state"
    where: Literal["gpu", "cpu"] = "gpu"


@dataclass(frozen=True)
class Plan:
    """A memory plan; sizes in bytes. `fits` is None when the GPU memory is unknown."""

    name: str
    model: str  # one line: architecture and where its config came from
    setup: str  # one line: mode, strategy, workers, precision, batch shape
    params_total: int  # with LoRA adapters
    params_base: int  # the base model's own
    params_trainable: int
    lines: tuple[Line, ...]
    activations_other: int  # activations with gradient checkpointing switched the other way
    checkpointing: bool
    workers: int
    gpu_label: str | None
    gpu_bytes: int | None
    on_gpu: bool = True  # scaling.use_gpu: else every "gpu" line is a CPU worker's host memory
    refused: str | None = None  # why `layerswap train` would refuse this base (its family)

    @property
    def gpu_total(self) -> int:
        """Per GPU: every state line plus the larger of the two transient phases."""
        gpu = [x for x in self.lines if x.where == "gpu"]
        state = sum(x.nbytes for x in gpu if x.phase == "state")
        return state + max(sum(x.nbytes for x in gpu if x.phase == p) for p in ("backward", "step"))

    @property
    def cpu_total(self) -> int:
        """CPU RAM per node for offloaded state (all workers on one node)."""
        cpu = [x for x in self.lines if x.where == "cpu"]
        state = sum(x.nbytes for x in cpu if x.phase == "state")
        return state + sum(x.nbytes for x in cpu if x.phase == "step")

    @property
    def fits(self) -> bool | None:
        """Whether gpu_total fits the GPU's memory (None: memory unknown)."""
        return None if self.gpu_bytes is None else self.gpu_total <= self.gpu_bytes


def _size(dtype) -> int:
    return dtype.itemsize


def layer_activation_bytes(shape: ModelShape, b: int, seq: int, lora_rank: int = 0) -> int:
    """Bytes one decoder layer keeps for backward per token, counted tensor by tensor for an HF
    Llama-style block (b = activation dtype bytes; q = heads*head_dim, kv = kv_heads*head_dim):
      attention  b*(h + q + 2kv)        norm output (q/k/v input); q, k, v projections
               + b*2(q + kv)            rotary: rotate_half copies and the rotated q, k
               + b*2q                   k, v repeated to all heads (GQA with a padding mask)
               + b*2q                   attention output, and its reshaped copy (o_proj input)
      MLP        b*(h + 4i)             norm output; gate, up, act(gate), act(gate)*up
      norms      2 * 8h                 HF RMSNorm upcasts: fp32 input and normalised output
      LoRA       b*r per adapter        each adapter's A output (summed rank of the layer)
      eager      heads*seq*(4 + b)      only with eager attention: fp32 softmax and its cast
    SDPA (HF's default) keeps no seq x seq scores. Dropout is 0 in these models.
    """
    h, i, q = shape.hidden, shape.intermediate, shape.heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    attn = h + q + 2 * kv + 2 * (q + kv) + (2 * q if kv < q else 0) + 2 * q
    per = b * (attn + h + 4 * i) + 16 * h + b * lora_rank
    if shape.attention == "eager":
        per += shape.heads * seq * (4 + b)
    return per


def activation_bytes(shape: ModelShape, split: Split, tokens: int, seq: int, b: int, resid: int, checkpointing: bool) -> int:  # fmt: skip
    """Activations of one micro-batch of `tokens` tokens (resid: residual-stream dtype bytes).

    Without checkpointing every layer keeps its tensors: L*A, plus about one layer's worth of
    gradient buffers while backward runs: (L + 1)*A. With HF's per-layer checkpointing only
    each layer's input stays (L*resid*h per token), and backward recomputes one layer at a
    time: L*resid*h + 2*A. (A = layer_activation_bytes per token; the extra layer is the
    largest, LoRA adapters can differ by layer.)
    """
    per = [
        layer_activation_bytes(shape, b, seq, split.lora_rank.get(k, 0))
        for k in range(shape.layers)
    ]
    if checkpointing:
        return tokens * (shape.layers * resid * shape.hidden + 2 * max(per))
    return tokens * (sum(per) + max(per))


def logits_bytes(shape: ModelShape, tokens: int, b: int) -> int:
    """The loss head: logits in the compute dtype, HF's fp32 upcast and the fp32 log-softmax
    cross-entropy keeps, b + 8 bytes a logit; plus the final norm (8h) and lm_head input (b*h)."""
    return tokens * (shape.vocab * (b + 8) + 8 * shape.hidden + b * shape.hidden)


def _units(split: Split) -> tuple[dict, dict]:
    """Per FSDP unit (decoder layer k, or "root": embeddings, final norm, lm_head), the
    parameter elements in total and trainable."""
    total: dict = {}
    train: dict = {}
    for n, numel in split.params.items():
        unit = layer_of(n)
        unit = "root" if unit is None else unit
        total[unit] = total.get(unit, 0) + numel
        train[unit] = train.get(unit, 0) + (numel if n in split.trainable else 0)
    return total, train


def _state_lines(exp: TrainExperiment, split: Split, policy: Policy) -> list[Line]:
    """Weights, compute copy, gradients and AdamW state (per GPU; on the CPU when offloaded)."""
    s = exp.scaling
    fsdp = s.strategy == "fsdp"
    shard = s.num_workers if fsdp else 1
    where = "cpu" if s.cpu_offload else "gpu"
    node = s.num_workers if s.cpu_offload else 1  # offloaded: every worker's shard on one node
    m, f = _size(policy.master), _size(policy.frozen)
    t = sum(split.params[n] for n in split.trainable)
    frozen = sum(split.params.values()) - t
    tag = f", sharded /{shard}" if fsdp else ""
    mname, fname = dtype_name(policy.master), dtype_name(policy.frozen)
    out = [
        Line(f"weights: trainable {mname}{tag}", t * m * node // shard, "state", where),
        Line(f"weights: frozen {fname}{tag}", frozen * f * node // shard, "state", where),
        Line(f"gradients {mname}{tag}", t * m * node // shard, "state", where),
        Line(f"AdamW moments 2 x {mname}{tag}", 2 * t * m * node // shard, "state", where),
    ]
    # No AdamW step temporaries: on a GPU the trainer's AdamW is fused (trainables/train/run_setup.py
    # _adamw), which updates in place; offloaded state on the CPU steps one tensor at a time.
    if not fsdp and policy.compute is not None and policy.compute != policy.master:
        # autocast caches a compute-dtype copy of each trainable Linear weight it casts, and
        # the matmuls keep it for backward
        lin = sum(split.params[n] for n in split.trainable if n in split.linear)
        out.append(
            Line(
                "autocast copy of trainable Linear weights", lin * _size(policy.compute), "backward"
            )
        )
    if not fsdp and s.num_workers > 1:
        # DDP's gradient buckets are a second copy (gradient_as_bucket_view is off)
        out.append(Line("DDP gradient buckets", t * m))
    return [x for x in out if x.nbytes]


def _fsdp_lines(split: Split, policy: Policy) -> list[Line]:
    """FSDP2's unsharded working set: the root unit (embeddings, lm_head) gathered for the whole
    forward, the current and the prefetched decoder layer, in FSDP's param dtype; and the
    largest unit's unsharded gradients (compute dtype) with the flat reduce-scatter input
    FSDP copies them into (reduce dtype = master dtype)."""
    total, train = _units(split)
    c = _size(policy.compute or policy.master)
    biggest_layer = max(v for k, v in total.items() if k != "root")
    gathered = (total.get("root", 0) + 2 * biggest_layer) * c
    grads = max(train.values()) * (c + _size(policy.master))
    return [
        Line("FSDP gathered params (root + 2 layers)", gathered, "backward"),
        Line("FSDP unsharded grads (largest unit)", grads, "backward"),
    ]


def memory_plan(exp: TrainExperiment, model_config, source: str = "given config", gpu_memory: float | None = None) -> Plan:  # fmt: skip
    """The experiment's memory plan per GPU (per CPU worker, in host memory, for a CPU run).

    Args:
        exp: the experiment (mode, hyper, scaling, precision).
        model_config: the base's transformers config (no weights are read).
        source: where the config came from (printed).
        gpu_memory: GiB per GPU, overriding scaling.accelerator_type's table entry.
    Returns:
        Plan.
    """
    if gpu_memory is not None and not exp.scaling.use_gpu:
        raise ValueError(
            f"--gpu-memory {gpu_memory:g}: {exp.name} trains on CPUs (scaling.use_gpu is false); "
            "its plan is host memory per worker"
        )
    shape = model_shape(model_config)
    split = trainable_split(exp, shape)
    policy = resolve_precision(exp, base=shape.dtype)
    h, s = exp.hyper, exp.scaling
    tokens = exp.micro_batch * h.seq_len
    b = _size(policy.compute or policy.master)
    # The residual stream follows the embedding's output: fp32 when DDP trains fp32 masters
    # of it (autocast does not cast embeddings), else the compute dtype.
    emb = next((n for n in split.params if "embed_tokens" in n), None)
    resid = _size(policy.master) if s.strategy == "ddp" and emb in split.trainable else b
    act = activation_bytes(shape, split, tokens, h.seq_len, b, resid, h.gradient_checkpointing)
    other = activation_bytes(shape, split, tokens, h.seq_len, b, resid, not h.gradient_checkpointing)  # fmt: skip
    lines = _state_lines(exp, split, policy)
    if s.strategy == "fsdp":
        lines += _fsdp_lines(split, policy)
    ck = "with" if h.gradient_checkpointing else "without"
    lines += [
        Line(f"activations ({ck} gradient checkpointing)", act, "backward"),
        Line("logits + fp32 loss", logits_bytes(shape, tokens, b), "backward"),
    ]
    if s.use_gpu:  # a CPU worker has neither (gloo's buffers are small)
        overhead = CUDA_OVERHEAD + (NCCL_OVERHEAD if s.num_workers > 1 else 0)
        lines.append(Line("CUDA context + NCCL overhead", overhead))
    else:  # host memory holds the process itself too
        lines.append(Line("process: Python, torch, transformers, Ray", PROCESS_OVERHEAD))
    label, mem = _gpu(s.accelerator_type, gpu_memory) if s.use_gpu else (None, None)
    total_p = sum(split.params.values())
    compute = dtype_name(policy.compute or policy.master)
    return Plan(
        name=exp.name,
        model=f"{shape.model_type}, {shape.layers} layers, hidden {shape.hidden}, vocab "
        f"{shape.vocab}, {str(shape.dtype).removeprefix('torch.')}; from {source}",
        setup=f"mode {exp.mode.type}, {s.strategy} over {s.num_workers} worker(s)"
        f"{' + CPU offload' if s.cpu_offload else ''}, precision {policy.name} (compute "
        f"{compute}), micro-batch {exp.micro_batch} x seq {h.seq_len}",
        params_total=total_p,
        params_base=sum(shape.params.values()),
        params_trainable=sum(split.params[n] for n in split.trainable),
        lines=tuple(lines),
        activations_other=other,
        checkpointing=h.gradient_checkpointing,
        workers=s.num_workers,
        gpu_label=label,
        gpu_bytes=None if mem is None else int(mem * GIB),
        on_gpu=s.use_gpu,
        refused=model_type_problem(shape.model_type),
    )


def _gpu(accelerator_type: str | None, override: float | None) -> tuple[str | None, float | None]:
    """(label, GiB) of the GPU to check against: the override, the table entry, or unknown."""
    if override is not None:
        if override <= 0:
            raise ValueError(f"--gpu-memory: must be positive GiB, got {override}")
        return "--gpu-memory", override
    if accelerator_type is None:
        return None, None
    known = {k.lower(): v for k, v in GPU_MEMORY_GIB.items()}
    return accelerator_type, known.get(accelerator_type.lower())


def plan_experiment(exp: TrainExperiment, gpu_memory: float | None = None) -> Plan:
    """memory_plan with the base's config read by load_model_config (never its weights).

    Args:
        exp: the experiment.
        gpu_memory: GiB per GPU (overrides scaling.accelerator_type).
    Returns:
        Plan.
    """
    config, source = load_model_config(exp.base, exp.trust_remote_code)
    return memory_plan(exp, config, source=source, gpu_memory=gpu_memory)


def _gib(n: int) -> str:
    return f"{n / GIB:8.2f}"


def format_plan(plan: Plan) -> str:
    """The plan as a table (GiB = 2**30 bytes), with the fit verdict on its last line.

    Args:
        plan: from memory_plan.
    Returns:
        Text, several lines.
    """
    t, n = plan.params_trainable, plan.params_total
    extra = n - plan.params_base
    out = [
        f"memory plan: {plan.name} (estimate)",
        f"  model:  {plan.model}",
        f"  setup:  {plan.setup}",
        f"  params: {plan.params_base:,}"
        + (f" + {extra:,} LoRA" if extra else "")
        + f"; trainable {t:,} ({100 * t / n:.2f} %)",
        f"  {_per(plan):<50}{'GiB':>8}  when",
    ]
    when = {"state": "always", "backward": "fwd/bwd", "step": "opt step"}
    for x in plan.lines:
        if x.where == "gpu":
            out.append(f"    {x.label:<48}{_gib(x.nbytes)}  {when[x.phase]}")
    other = "without" if plan.checkpointing else "with"
    out.append(f"    {'(activations ' + other + ' checkpointing instead':<48}{_gib(plan.activations_other)})")  # fmt: skip
    # Within the label column (48 characters) either way
    total = "total per GPU (always + larger of fwd/bwd, step)" if plan.on_gpu else "total per worker (always + max of fwd/bwd, step)"  # fmt: skip
    out.append(f"  {total:<50}{_gib(plan.gpu_total)}")
    cpu = [x for x in plan.lines if x.where == "cpu"]
    if cpu:
        out.append(f"  {'CPU RAM per node (offloaded state)':<50}{'GiB':>8}")
        for x in cpu:
            out.append(f"    {x.label:<48}{_gib(x.nbytes)}  {when[x.phase]}")
        out.append(f"  {f'total per node ({plan.workers} workers on it)':<50}{_gib(plan.cpu_total)}")  # fmt: skip
    out.append("  " + verdict(plan))
    if plan.refused is not None:  # planned all the same: the figures hold for the shape
        out.append(f"  note: layerswap train and merge refuse this base: {plan.refused}")
    return "\n".join(out)


def _per(plan: Plan) -> str:
    return "per GPU" if plan.on_gpu else "per worker (host RAM)"


def verdict(plan: Plan) -> str:
    """One line: FITS / DOES NOT FIT on the GPU, or that its memory is unknown (a CPU run: the
    host memory it needs)."""
    total = plan.gpu_total / GIB
    if not plan.on_gpu:
        # The offloaded state (cpu_offload) lives in the same host memory: counted per node.
        node = plan.workers * total + plan.cpu_total / GIB
        with_offload = " with the offloaded state" if plan.cpu_total else ""
        on_node = f", {node:.1f} GiB for its {plan.workers} worker(s) on one node{with_offload}" if node > total else ""  # fmt: skip
        return f"a CPU run (scaling.use_gpu is false): about {total:.1f} GiB of host memory per worker{on_node}"  # fmt: skip
    if plan.gpu_label is None:
        return f"GPU memory unknown (no scaling.accelerator_type; --gpu-memory GIB): needs {total:.1f} GiB per GPU"  # fmt: skip
    if plan.gpu_bytes is None:
        known = ", ".join(GPU_MEMORY_GIB)
        return f"GPU memory unknown for accelerator_type {plan.gpu_label!r} (known: {known}; --gpu-memory GIB): needs {total:.1f} GiB per GPU"  # fmt: skip
    have = plan.gpu_bytes / GIB
    if plan.fits:
        return f"FITS on {plan.gpu_label} ({have:.1f} GiB): {total:.1f} GiB needed, {have - total:.1f} GiB spare"  # fmt: skip
    return f"DOES NOT FIT on {plan.gpu_label} ({have:.1f} GiB): {total:.1f} GiB needed, {total - have:.1f} GiB short"  # fmt: skip


__all__ = ["Line", "Plan", "format_plan", "memory_plan", "plan_experiment", "verdict"]
