"""The private Ray Train APIs trainables/train/ray_failures.py relies on are still there and behave.

No Ray is started: each check reads the installed ray's classes and source. A failure here names
what Ray changed; fix the adapter (trainables/train/ray_failures.py), nothing else.
Run: .venv/bin/python -m pytest -q tests/trainables/train/test_ray_failures_api.py
"""

from __future__ import annotations

import inspect
import logging

from ray.train import FailureConfig
from ray.train.v2._internal import util as ray_util
from ray.train.v2._internal.execution.failure_handling import FailureDecision
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from ray.train.v2.api.exceptions import WorkerGroupError

from layerswap.trainables.merge.arch import ArchitectureError
from layerswap.trainables.train.finite import NonFiniteTraining
from layerswap.trainables.train.ray_failures import (
    WORKER_ERROR_LOGGER,
    NoRetryOnDeterministic,
    OwnErrorsTrainer,
    deterministic,
    quiet_own_errors,
)


def test_fit_hands_the_controller_the_failure_policy_it_builds():
    fit = inspect.getsource(DataParallelTrainer.fit)
    assert "self._initialize_and_run_controller(" in fit, "fit no longer starts the controller so"
    assert "failure_policy=create_failure_policy(" in fit, "fit no longer passes failure_policy"
    params = inspect.signature(DataParallelTrainer._initialize_and_run_controller).parameters
    assert any(p.kind is p.VAR_KEYWORD for p in params.values())
    assert issubclass(OwnErrorsTrainer, DataParallelTrainer)


def test_a_divergence_is_raised_at_once_and_other_errors_still_retried():
    policy = NoRetryOnDeterministic(FailureConfig(max_failures=2))
    diverged = WorkerGroupError("x", {0: NonFiniteTraining("training turned non-finite")})
    assert policy.make_decision(diverged) is FailureDecision.RAISE
    # a base of a family layerswap does not merge: refused again on every retry
    unmerged = WorkerGroupError("x", {0: ArchitectureError("model_type 'gemma2' is not supported")})  # fmt: skip
    assert policy.make_decision(unmerged) is FailureDecision.RAISE
    other = WorkerGroupError("x", {0: RuntimeError("a lost connection")})
    assert policy.make_decision(other) is FailureDecision.RETRY  # Ray's max_failures as before
    assert policy.make_decision(other) is FailureDecision.RETRY
    assert policy.make_decision(other) is FailureDecision.RAISE


def test_the_worker_logs_its_error_where_the_filter_listens(caplog):
    assert ray_util.logger.name == WORKER_ERROR_LOGGER
    assert "Error in training function" in inspect.getsource(
        ray_util.construct_user_exception_with_traceback
    )
    quiet_own_errors()
    caplog.set_level(logging.ERROR, logger=WORKER_ERROR_LOGGER)
    for error in (NonFiniteTraining("training turned non-finite"), RuntimeError("lost")):
        try:
            raise error
        except Exception as e:
            ray_util.construct_user_exception_with_traceback(e)
    logged = [r.getMessage() for r in caplog.records if r.name == WORKER_ERROR_LOGGER]
    assert len(logged) == 1 and "RuntimeError: lost" in logged[0]


def test_a_divergence_still_counts_when_it_reaches_the_policy_wrapped():
    """Ray unwraps the worker's UserExceptionWithTraceback when it polls (poll.py `errors`); the
    wrapper and its `_base_exc` are what a Ray that stopped unwrapping would hand over."""
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    wrapped = UserExceptionWithTraceback(NonFiniteTraining("training turned non-finite"), "tb")
    assert wrapped._base_exc.__class__ is NonFiniteTraining
    assert deterministic(WorkerGroupError("x", {0: wrapped}))


def test_a_failed_run_names_each_worker_error_and_shows_its_traceback():
    """Without --verbose Ray forwards no worker log: the failure itself carries the worker's
    error and traceback, and an out-of-memory says what to change."""
    import torch
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    from layerswap.trainables.train.ray_failures import OOM_HINT, describe_failure

    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    tb = 'Traceback (most recent call last):\n  File "loop.py", line 9, in step\ntorch.OutOfMemoryError'
    err = WorkerGroupError("x", {1: RuntimeError("nccl"), 0: UserExceptionWithTraceback(oom, tb)})
    text = describe_failure(err).splitlines()
    assert text[0] == (
        "worker rank 0: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB; "
        "worker rank 1: RuntimeError: nccl"
    )
    assert text[1] == OOM_HINT
    assert text[2:] == ["worker rank 0's traceback:", *tb.splitlines()]
    assert "out of GPU memory" not in describe_failure(WorkerGroupError("x", {0: RuntimeError("nccl")}))  # fmt: skip


def test_a_failure_as_ray_builds_it_still_shows_the_tracebacks():
    """Ray hands the controller each worker's own error, unwrapped (worker_group/poll.py); the
    tracebacks survive only in WorkerGroupError's message, which the failure must carry."""
    from layerswap.trainables.train.ray_failures import HOST_OOM_HINT, describe_failure

    snippet = '[Rank 0 Error Snippet]:\nTraceback (most recent call last):\n  File "loop.py", line 9\nRuntimeError: [enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can\'t allocate memory'
    base = RuntimeError("[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory")  # fmt: skip
    err = WorkerGroupError(snippet, {0: base})
    assert err._error_message == snippet  # the private attribute read (Ray's __init__ keeps it)
    text = describe_failure(err)
    assert text.splitlines()[1] == HOST_OOM_HINT
    assert text.endswith("the workers' tracebacks, as Ray reports them:\n" + snippet)


def test_the_failure_ray_builds_from_a_worker_status_keeps_its_traceback():
    """Through Ray's own poll status (the path a real run takes): the traceback reaches the text."""
    import inspect

    import torch
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
    from ray.train.v2._internal.execution.worker_group.poll import (
        WorkerGroupPollStatus,
        WorkerStatus,
    )

    from layerswap.trainables.train.ray_failures import describe_failure

    tb = 'Traceback (most recent call last):\n  File "loop.py", line 9, in step\ntorch.OutOfMemoryError: CUDA out of memory'  # fmt: skip
    wrapped = UserExceptionWithTraceback(torch.OutOfMemoryError("CUDA out of memory"), tb)
    need = inspect.signature(WorkerStatus).parameters
    status = WorkerStatus(**{k: (False if k == "running" else None) for k, p in need.items() if p.default is inspect.Parameter.empty}, error=wrapped)  # fmt: skip
    need = inspect.signature(WorkerGroupPollStatus).parameters
    poll = WorkerGroupPollStatus(**{k: None for k, p in need.items() if p.default is inspect.Parameter.empty and k != "worker_statuses"}, worker_statuses={0: status})  # fmt: skip
    err = poll.get_worker_group_error()
    assert not hasattr(err.worker_failures[0], "_traceback_str")  # Ray unwrapped it
    text = describe_failure(err)
    assert text.startswith("worker rank 0: OutOfMemoryError: CUDA out of memory")
    assert 'File "loop.py", line 9, in step' in text
