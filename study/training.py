"""The cost of expert training runs for `layerswap plan`: steps, checkpoints, and device-hours
from compute (padding included), communication and checkpoint writes.

Rules (each estimate prints the profile figures it rests on, spaces/throughput.yaml):

- Counts reuse the trainer's own rules (trainables.train.data.total_steps, the loop's
  checkpoint rule); FLOPs per token are study/estimate.py's.
- Padding: a micro-batch is padded to its longest row (trainables.train.data.collate), and the
  ranks of a run wait for the slowest at every collective: under FSDP at every micro-batch,
  under DDP at the step's last. Sample lengths are not known offline; LENGTHS says what is
  assumed: the longest of k rows of mean m is then 2m·k/(k+1) tokens, capped at seq_len (one row
  of mean seq_len, the bound the plan uses when tokens_per_sample is not given, stays at it).
- A step: compute = padded tokens × training FLOPs / (train_flops_per_s × parallel_efficiency),
  communication = study/comms.py's bytes / interconnect_bytes_per_s, combined by
  comms.step_seconds (the longer, plus comm_exposed of the shorter).
- A run: run_startup_s + steps × step + validation (forward only, at every checkpoint, padded
  as a micro-batch) + checkpoint writes (study/storage.py), times the devices it holds.
Tests: .venv/bin/pytest -q tests/study/test_train_cost.py tests/study/test_study_plan.py
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields

from layerswap.spaces.study import Profile
from layerswap.spaces.sweep import Choice
from layerswap.spaces.train_experiment import TrainExperiment, with_overrides
from layerswap.study import comms
from layerswap.study.estimate import ModelCost, forward_flops, model_cost, train_flops
from layerswap.study.sizes import RunSizes, run_sizes
from layerswap.study.storage import STORAGE_FIGURES, run_storage

# Swept hyperparameters that change what a run costs; the rest (lr, warmup, ...) do not.
COST_PARAMS = (
    "hyper.batch_size",
    "hyper.micro_batch_size",
    "hyper.max_steps",
    "hyper.epochs",
    "hyper.seq_len",
    "hyper.val_share",
    "hyper.gradient_checkpointing",
    "checkpoint_every_samples",
    "mode.rank",
)
LENGTHS = (
    "assumed: a sample's tokens spread evenly from 0 to twice their mean (a coefficient of "
    "variation of 0.58, as for SFT pairs of a question and a worked answer), capped at seq_len"
)
TRAIN_FIGURES = (
    "train_flops_per_s",
    "prefill_flops_per_s",
    "run_startup_s",
    "parallel_efficiency",
    "interconnect_bytes_per_s",
    "comm_exposed",
    *STORAGE_FIGURES,
)


def split_rows(exp: TrainExperiment, rows: list[int]) -> tuple[int, int]:
    """(training samples, validation samples over all datasets) from each dataset's rows.

    Mirrors trainables.train.data.build_data, which needs the encoded data: validation takes
    round(val_share × the smallest dataset's rows), at least 1, from every dataset. Examples
    too long for seq_len, which the trainer drops, cannot be known without tokenizing.
    """
    h = exp.hyper
    n_val = max(round(h.val_share * min(rows)), 1) if h.val_share > 0 else 0
    return sum(r - n_val for r in rows), n_val * len(rows)


def total_steps(exp: TrainExperiment, n_train: int | None) -> int | None:
    """Optimizer steps of a run (trainables.train.data.total_steps; None: epochs, rows unknown)."""
    if exp.hyper.max_steps is not None:
        return exp.hyper.max_steps
    if n_train is None:
        return None
    # lazy: torch (~3 s); `layerswap plan` loads it only for a question only the trainer answers
    from layerswap.trainables.train import data

    # total_steps reads only the streams' lengths: a stand-in stream of n_train examples.
    stand_in = data.TrainData([data.Stream([None] * n_train, 0, 0)], [], [])
    return data.total_steps(exp, stand_in)


def checkpoints(exp: TrainExperiment, steps: int) -> int:
    """Checkpoints a run of `steps` steps writes (the training loop's own rule)."""
    # lazy: torch, as above
    from layerswap.trainables.train.checkpoint_step import checkpoint_due

    bs = exp.hyper.batch_size
    return sum(checkpoint_due(exp, s, s * bs, steps) for s in range(1, steps + 1))


def devices_per_run(exp: TrainExperiment, prof: Profile) -> int:
    """Devices one run holds: a GPU per worker; on the cpu profile (a device is one thread),
    cpus_per_worker threads per worker."""
    s = exp.scaling
    if prof.kind == "cpu":
        return s.num_workers * max(1, int(s.cpus_per_worker))
    return s.num_workers


def longest_row(mean: float, cap: int, k: int) -> float:
    """Expected tokens of the longest of `k` rows of `mean` tokens (LENGTHS), at most `cap`."""
    return min(float(cap), 2 * mean * k / (k + 1))


def step_flops(c: ModelCost, exp: TrainExperiment, mean: float) -> tuple[float, float]:
    """(training FLOPs one worker computes per optimizer step, padding and the wait for the
    slowest rank included; the padded row length of a micro-batch the ranks wait on)."""
    n, micro, m = exp.scaling.num_workers, exp.micro_batch, comms.micro_batches(exp)
    ckpt, cap = exp.hyper.gradient_checkpointing, exp.hyper.seq_len

    def padded(rows_seen: int) -> tuple[float, float]:
        length = longest_row(mean, cap, rows_seen)
        return micro * length * train_flops(c, length, ckpt), length

    own, _ = padded(micro)
    synced, length = padded(micro * n)
    waits = 0 if n == 1 else (m if exp.scaling.strategy == "fsdp" else 1)
    return (m - waits) * own + waits * synced, length


@dataclass(frozen=True)
class StepCost:
    """One optimizer step on one worker."""

    row_tokens: float  # padded row length of a micro-batch the ranks wait on
    compute_s: float
    comm_bytes: float  # bytes one device sends
    comm_s: float
    step_s: float


def step_cost(c: ModelCost, sizes: RunSizes, exp: TrainExperiment, mean: float, prof: Profile) -> StepCost:  # fmt: skip
    """StepCost of `exp` at `mean` tokens a sample (see the module docstring)."""
    workers, devices = exp.scaling.num_workers, devices_per_run(exp, prof)
    eff = prof.parallel_efficiency.value if devices > 1 else 1.0
    flops, row = step_flops(c, exp, mean)
    compute = flops / (prof.train_flops_per_s.value * (devices / workers) * eff)
    nbytes = comms.step_bytes(sizes, exp)
    comm = nbytes / prof.interconnect_bytes_per_s.value
    step = comms.step_seconds(compute, comm, prof.comm_exposed.value)
    return StepCost(row, compute, nbytes, comm, step)


def validation_seconds(c: ModelCost, exp: TrainExperiment, rows: int, mean: float, prof: Profile) -> float:  # fmt: skip
    """Seconds of forward passes over `rows` validation rows, micro-batches padded to their
    longest row, spread over the run's devices."""
    devices = devices_per_run(exp, prof)
    eff = prof.parallel_efficiency.value if devices > 1 else 1.0
    length = longest_row(mean, exp.hyper.seq_len, exp.micro_batch)
    return rows * length * forward_flops(c, length) / (prof.prefill_flops_per_s.value * devices * eff)  # fmt: skip


@dataclass(frozen=True)
class RunEstimate:
    """One training run: its counts, step, checkpoints and device-hours."""

    samples: int
    tokens: float
    steps: int
    checkpoints: int
    device_hours: float
    row_tokens: float  # StepCost's
    compute_s: float
    comm_bytes: float
    comm_s: float
    step_s: float
    write_s: float  # seconds the run waits for its checkpoint writes (in device_hours)
    write_hours: float  # the same in device-hours
    stored: float  # bytes on storage when the run ends
    written: float  # bytes written
    sizes: RunSizes


# RunEstimate's figures of a run's step and checkpoints (the plan's Row.costs).
COSTS = ("row_tokens", "compute_s", "comm_bytes", "comm_s", "step_s", "write_s", "write_hours", "stored", "written")  # fmt: skip


def mean_estimate(per: list[RunEstimate]) -> dict:
    """The numeric fields of several runs' estimates, averaged (sizes: the first's)."""
    keys = [f.name for f in fields(RunEstimate) if f.name != "sizes"]
    return {k: sum(getattr(p, k) for p in per) / len(per) for k in keys} | {"sizes": per[0].sizes}


def run_estimate(shape, exp: TrainExperiment, rows: list[int] | None, tokens_per_sample: float, prof: Profile) -> RunEstimate | None:  # fmt: skip
    """Counts and device-hours of one run of `exp` (None: an epochs run of unknown rows).

    Args:
        shape: the base's trainables.train.model_shape.ModelShape.
        exp: the experiment.
        rows: rows of each dataset (None: unknown; then validation is not counted).
        tokens_per_sample: mean tokens of one training sample.
        prof: the device profile.
    """
    n_train, n_val = split_rows(exp, rows) if rows else (None, 0)
    steps = total_steps(exp, n_train)
    if steps is None:
        return None
    c, sizes = model_cost(shape, exp), run_sizes(shape, exp)
    samples, ckpts = steps * exp.hyper.batch_size, checkpoints(exp, steps)
    step = step_cost(c, sizes, exp, tokens_per_sample, prof)
    val = validation_seconds(c, exp, ckpts * n_val, tokens_per_sample, prof)
    store = run_storage(sizes, exp, ckpts, prof)
    secs = prof.run_startup_s.value + steps * step.step_s + val + store.write_s
    devices = devices_per_run(exp, prof)
    return RunEstimate(
        samples, samples * tokens_per_sample, steps, ckpts, secs * devices / 3600,
        step.row_tokens, step.compute_s, step.comm_bytes, step.comm_s, step.step_s,
        store.write_s, store.write_s * devices / 3600, store.stored, store.written, sizes,
    )  # fmt: skip


def cost_variants(exp: TrainExperiment) -> tuple[list[TrainExperiment], list[str]]:
    """The experiment as its sweep's trials may run it, over the swept parameters that change
    the cost (COST_PARAMS): every choice, and a range's midpoint (geometric when log).

    Returns:
        (the variants that validate, one message per combination that cannot run).
    """
    if exp.sweep is None:
        return [exp], []
    axes = []
    ints = exp.sweep.int_params(exp.model_dump(mode="json"))
    for path, dim in exp.sweep.params.items():
        if path not in COST_PARAMS:
            continue
        if isinstance(dim, Choice):
            axes.append([(path, v) for v in dim.choices])
        else:
            mid = math.sqrt(dim.low * dim.high) if dim.log else (dim.low + dim.high) / 2
            axes.append([(path, round(mid) if path in ints else mid)])
    out, bad = [], []
    for combo in itertools.product(*axes):
        try:
            out.append(with_overrides(exp, dict(combo)) if combo else exp)
        except ValueError as e:
            bad.append(f"sweep trial with {dict(combo)} cannot run: {e}")
    return out, bad
