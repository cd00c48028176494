"""Ray Train's failure handling for layerswap's deterministic errors: raised at once, in one line.

`failure.max_failures` restarts a worker group from its last checkpoint after a worker error, which
helps with a lost node or a flaky collective; a run whose training turned non-finite
(`NonFiniteTraining`) diverges again from the same checkpoint with the same data and learning
rate, so `OwnErrorsTrainer` (the TorchTrainer every layerswap run uses) raises it without a retry,
and `quiet_own_errors()` keeps the worker from logging its traceback (the driver says it in the
error's one line, trainables/train/ray_train.py `raise_own_error`).

Ray Train V2 has no public way to either, so this module holds every private name it uses, and
tests/trainables/train/test_ray_failures_api.py fails naming the one that changed:
- the controller asks its `failure_policy` (built in the driver by `DataParallelTrainer.fit`,
  passed to `_initialize_and_run_controller`, pickled to the controller actor) whether to retry;
  `DefaultFailurePolicy` / `FailureDecision` live in ray.train.v2._internal;
- a worker logs "Error in training function" with the traceback on the logger
  `ray.train.v2._internal.util` before it hands the error to the controller.
Run its tests: .venv/bin/python -m pytest -q tests/trainables/train/test_ray_failures_api.py
"""

from __future__ import annotations

import logging

import torch
from ray.train.torch import TorchTrainer
from ray.train.v2._internal.execution.failure_handling import (
    DefaultFailurePolicy,
    FailureDecision,
)
from ray.train.v2.api.exceptions import WorkerGroupError

from layerswap.trainables.devices import DeviceUnusable
from layerswap.trainables.merge.arch import ArchitectureError
from layerswap.trainables.node_paths import NodePathError
from layerswap.trainables.train.finite import NonFiniteTraining

# Errors that the same inputs raise again: a retry only repeats them (and their cost). A path a
# node does not see (checked by each worker first) does not appear on a retry either, nor CUDA
# on a node whose torch or driver cannot use its GPU.
# ArchitectureError: a base of a family layerswap does not merge (trainables/train/run_setup.py).
DETERMINISTIC = (NonFiniteTraining, NodePathError, DeviceUnusable, ArchitectureError)
# Where a Ray Train V2 worker logs a training function's error with its traceback.
WORKER_ERROR_LOGGER = "ray.train.v2._internal.util"


def deterministic(error: BaseException) -> bool:
    """Whether a Ray Train failure holds a worker error that a retry would raise again.

    Args:
        error: the TrainingFailedError the controller decides on.
    """
    failures = error.worker_failures.values() if isinstance(error, WorkerGroupError) else ()
    # Ray unwraps a worker's UserExceptionWithTraceback (its `_base_exc`) when it polls the
    # group; unwrapped here too, so a Ray that stops doing so still counts our errors.
    return any(isinstance(getattr(e, "_base_exc", e), DETERMINISTIC) for e in failures)


class NoRetryOnDeterministic(DefaultFailurePolicy):
    """Ray's default policy (max_failures and the rest), except that a deterministic worker
    error is raised at once."""

    def make_decision(self, training_failed_error):
        if deterministic(training_failed_error):
            return FailureDecision.RAISE
        return super().make_decision(training_failed_error)


class OwnErrorsTrainer(TorchTrainer):
    """TorchTrainer whose controller does not retry a deterministic worker error."""

    def _initialize_and_run_controller(self, **controller_init_kwargs):
        config = self.run_config.failure_config
        controller_init_kwargs["failure_policy"] = NoRetryOnDeterministic(config)
        return super()._initialize_and_run_controller(**controller_init_kwargs)


class _OwnErrorFilter(logging.Filter):
    """Drops a worker's traceback log of a deterministic layerswap error (said in one line by
    the driver); every other error keeps its traceback."""

    names = tuple(f"{c.__module__}.{c.__qualname__}: " for c in DETERMINISTIC)

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(n in record.getMessage() for n in self.names)


# What to change when a worker ran out of GPU memory (the commonest failure of an 8B run).
OOM_HINT = (
    "a worker ran out of GPU memory: check `layerswap train EXP --plan`, then lower "
    "hyper.micro_batch_size (the batch is accumulated) or hyper.seq_len, set "
    "hyper.gradient_checkpointing: true, or shard with scaling.strategy: fsdp (cpu_offload: true)"
)


HOST_OOM_HINT = (
    "a worker ran out of host memory: check `layerswap train EXP --plan` (a CPU run's plan is "
    "host memory per worker), then lower hyper.micro_batch_size or scaling.num_workers per node"
)


# What torch says when a GPU run's workers cannot start NCCL (Ray Train's process-group start-up,
# before any layerswap code runs in them): named with the setting and what to do.
NCCL_SIGNS = ("Distributed package doesn't have NCCL built in", "ProcessGroupNCCL is only supported with GPUs")  # fmt: skip
NCCL_HINT = (
    "scaling.use_gpu: the workers could not start NCCL, so a worker's torch sees no usable CUDA "
    "GPU (or is a CPU-only build): check nvidia-smi and torch there, or set LAYERSWAP_ALLOW_CPU=1 "
    "where the command runs to train on the workers' CPUs over gloo"
)


def describe_failure(error: BaseException) -> str:
    """`_describe_failure`, led by NCCL_HINT when the workers could not start NCCL."""
    text = _describe_failure(error)
    return f"{NCCL_HINT}\n{text}" if any(sign in text for sign in NCCL_SIGNS) else text


def _describe_failure(error: BaseException) -> str:
    """A run that failed for good, as its user reads it: one line naming each failed worker's
    error, what to change for an out-of-memory, then the workers' own tracebacks (which the
    driver shows nowhere else: without --verbose, Ray does not forward the workers' logs).

    Args:
        error: the TrainingFailedError `fit()` raised.
    """
    failures = error.worker_failures if isinstance(error, WorkerGroupError) else {}
    if not failures:
        return f"{type(error).__name__}: {error}"
    heads, tracebacks, oom = [], [], False
    for rank, e in sorted(failures.items()):
        base = getattr(e, "_base_exc", e)  # UserExceptionWithTraceback: the worker's own error
        first = (str(base).strip().splitlines() or [""])[0]
        heads.append(f"worker rank {rank}: {type(base).__name__}: {first}")
        oom |= isinstance(base, torch.OutOfMemoryError) or "CUDA out of memory" in str(base)
        if tb := str(getattr(e, "_traceback_str", "")).strip():
            tracebacks.append(f"worker rank {rank}'s traceback:\n{tb}")
    # Ray unwraps each worker's error before it builds WorkerGroupError (worker_group/poll.py),
    # so the tracebacks are in its message: the workers' snippets, equal ones grouped by rank.
    said = str(getattr(error, "_error_message", "")).strip()
    if said and not tracebacks:
        tracebacks.append(f"the workers' tracebacks, as Ray reports them:\n{said}")
    host = any("DefaultCPUAllocator" in str(getattr(e, "_base_exc", e)) for e in failures.values())
    hints = [OOM_HINT] if oom else [HOST_OOM_HINT] if host else []
    return "\n".join(["; ".join(heads), *hints, *tracebacks])


def quiet_own_errors() -> None:
    """In a Ray Train worker: do not log the traceback of a deterministic layerswap error."""
    logger = logging.getLogger(WORKER_ERROR_LOGGER)
    if not any(isinstance(f, _OwnErrorFilter) for f in logger.filters):
        logger.addFilter(_OwnErrorFilter())
