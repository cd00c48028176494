"""What one training run's tensors weigh, in bytes, by the trainer's own rules: what FSDP gathers
and reduces every step, and what a checkpoint writes. Read by study/comms.py (bytes a step
sends) and study/storage.py (bytes a checkpoint writes and storage keeps).

The rules are the trainer's: which parameters exist and train (trainables.train.modes
trainable_split), the dtypes (trainables.train.precision resolve_precision: FSDP gathers in the
compute dtype and reduce-scatters in the masters'; HF weights are saved in `Policy.save`, the
base's dtype unless `precision.checkpoint_dtype: fp32`), and what a checkpoint holds
(trainables/train/state.py, sharded.py): the HF weights (a LoRA run: its adapter, which PEFT
writes in the masters' dtype) at every checkpoint, and what only resuming needs (AdamW's two
moments, the fp32 masters when the weights are saved coarser; under FSDP the sharded state of
every weight in its training dtype with AdamW's).
Tests: .venv/bin/pytest -q tests/study/test_train_cost.py
"""

from __future__ import annotations

from dataclasses import dataclass

from layerswap.spaces.train_experiment import TrainExperiment


@dataclass(frozen=True)
class RunSizes:
    """Bytes of one run's tensors (elements where said)."""

    params: int  # parameters in training (LoRA adapters included), elements
    trained: int  # of those, the trainable ones, elements
    gather: float  # one all-gather of every parameter in FSDP's param dtype
    gather_layers: float  # the same, decoder layers only (FSDP's root unit is not resharded)
    grads: float  # every trainable gradient in the reduce dtype (the masters')
    weights: float  # a checkpoint's weights: HF weights in the save dtype, or the LoRA adapter
    weights_other: float | None  # the same under the other checkpoint_dtype (None: LoRA)
    resume: float  # what only resuming needs (AdamW moments, masters, FSDP's sharded state)
    synced: float  # of `resume`, what torch.distributed.checkpoint fsyncs (FSDP's shards)
    save_dtype: str  # the dtype the weights are saved in ("bfloat16"; a LoRA adapter's masters')
    gather_dtype: str  # FSDP's param dtype ("mixed": each parameter's own)
    reduce_dtype: str  # the gradients' dtype in collectives


def run_sizes(shape, exp: TrainExperiment) -> RunSizes:
    """RunSizes of `exp` training a model of `shape`.

    Args:
        shape: the base's trainables.train.model_shape.ModelShape.
        exp: the experiment (mode, precision, scaling.strategy).
    Returns:
        RunSizes.
    """
    # lazy: torch (~3 s); `layerswap plan` loads it only for a question only the trainer answers
    from layerswap.trainables.merge.arch import layer_index
    from layerswap.trainables.train.modes import trainable_split
    from layerswap.trainables.train.precision import dtype_name, resolve_precision

    split = trainable_split(exp, shape)
    policy = resolve_precision(exp, base=shape.dtype)
    m, f, b = policy.master.itemsize, policy.frozen.itemsize, policy.base.itemsize
    trained = sum(split.params[n] for n in split.trainable)
    params = sum(split.params.values())
    frozen = params - trained
    layers = sum(v for n, v in split.params.items() if layer_index(n) is not None)
    # FSDP gathers in its param dtype (the compute dtype); without one, each in its own dtype.
    c = policy.compute.itemsize if policy.compute is not None else None
    per_param = c if c is not None else (trained * m + frozen * f) / max(1, params)
    moments = 2 * trained * m
    sharded = exp.scaling.strategy == "fsdp"
    saved = policy.saved(exp.is_lora)  # PEFT writes the adapter as it trains
    if exp.is_lora:
        weights, other = trained * m, None
        resume = moments
    else:
        weights = params * policy.save.itemsize
        other = params * (b if exp.precision.checkpoint_dtype == "fp32" else 4)
        if sharded:  # DCP: every weight's shard in its training dtype, with AdamW's state
            resume = trained * m + frozen * f + moments
        else:
            resume = (trained * m if policy.keeps_master else 0) + moments
    return RunSizes(
        params=params,
        trained=trained,
        gather=params * per_param,
        gather_layers=layers * per_param,
        grads=trained * m,
        weights=weights,
        weights_other=other,
        resume=resume,
        synced=resume if sharded else 0.0,
        save_dtype=dtype_name(saved),
        gather_dtype=dtype_name(policy.compute) if policy.compute is not None else "mixed",
        reduce_dtype=dtype_name(policy.master),
    )
