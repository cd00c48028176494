"""Communication of a training step: the bytes each device sends per optimizer step, and how a
step's communication and compute add up. Used by study/training.py.

Rules (trainables/train/strategies.py):

- FSDP2 (`fsdp`, full sharding): every micro-batch all-gathers every parameter for the forward
  in FSDP's param dtype (the compute dtype under bf16-mixed), and again for the backward
  (FSDP2 reshards a unit after its forward; the root unit, embeddings and lm_head, stays
  gathered, and gradient checkpointing's recompute runs inside the backward's gather), then
  reduce-scatters the gradients in the reduce dtype (the masters', fp32 under bf16-mixed):
  layerswap reduce-scatters after every micro-batch (FullyShard.no_sync).
- DDP (`ddp`): one all-reduce of the trainable gradients per optimizer step (no_sync on all
  micro-batches but the last), in their own dtype.
- A ring collective of S bytes over n devices sends (n-1)/n x S per device (all-gather,
  reduce-scatter) or 2(n-1)/n x S (all-reduce); at the profile's bus bandwidth
  (interconnect_bytes_per_s, nccl-tests' "busbw") that takes bytes / bandwidth.
- A step takes the longer of its compute and its communication plus the profile's exposed
  share (comm_exposed) of the shorter: FSDP2 prefetches the next layer's gather and DDP
  all-reduces buckets during the backward, so most of the shorter one hides under the longer.
Tests: .venv/bin/pytest -q tests/study/test_train_cost.py
"""

from __future__ import annotations

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.study.sizes import RunSizes


def ring_share(n: int) -> float:
    """Share of a collective's bytes each of `n` devices sends in a ring all-gather."""
    return (n - 1) / n


def micro_batches(exp: TrainExperiment) -> int:
    """Forward/backward passes per optimizer step on each worker."""
    return exp.hyper.batch_size // exp.scaling.num_workers // exp.micro_batch


def step_bytes(sizes: RunSizes, exp: TrainExperiment) -> float:
    """Bytes one device sends per optimizer step (0 for one worker).

    Args:
        sizes: the run's tensor sizes (study.sizes.run_sizes).
        exp: the experiment (strategy, workers, micro-batches).
    """
    n = exp.scaling.num_workers
    if n == 1:
        return 0.0
    if exp.scaling.strategy == "fsdp":
        per_micro = sizes.gather + sizes.gather_layers + sizes.grads
        return micro_batches(exp) * ring_share(n) * per_micro
    return 2 * ring_share(n) * sizes.grads


def step_seconds(compute_s: float, comm_s: float, exposed: float) -> float:
    """Seconds of a step: the longer of compute and communication, plus `exposed` of the
    shorter (the share that does not overlap)."""
    return max(compute_s, comm_s) + exposed * min(compute_s, comm_s)
