"""Ray Train wrapper of the plain training loop: one TorchTrainer per experiment.

`train_with_ray(load_train_experiment("exp.yaml"))` runs `trainables.train.run_training` on
`scaling.num_workers` workers (gloo on CPU, nccl on GPU), persists each checkpoint under
`storage_path/name/`, and on a worker failure restarts the group from the last checkpoint
(`failure.max_failures`). Call inside `ray.init(...)`, or let Ray start a local cluster.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import ray.train
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from spaces.train_experiment import (
    TrainExperiment,
    absolute_local_paths,
    experiment_json,
    parse_train_experiment,
)


def _worker(config: dict) -> None:
    """Per-worker fn: resume from Ray's checkpoint if any, run the loop, report to Ray."""
    import torch

    from trainables.train import run_training

    exp = parse_train_experiment(config["experiment"], source="ray worker")
    ctx = ray.train.get_context()
    torch.set_num_threads(max(1, int(config.get("threads", 1))))
    device = ray.train.torch.get_device() if exp.scaling.use_gpu else "cpu"

    # Ray Train V2 hands each report to the controller through a one-slot queue that the
    # controller drains on its ~2 s health-check poll, and every report also syncs all ranks: a
    # report per step would cost up to 2 s per step. Metric-only reports are therefore forwarded
    # at most every `min_report_interval_s` (rank 0's clock decides, broadcast so every rank
    # makes the same number of calls); checkpoint reports always go through.
    interval = float(config.get("min_report_interval_s", 2.0))
    last = [float("-inf")]

    def report(metrics: dict, path: Path | None) -> None:
        # `checkpoint` is set on every rank at a checkpoint step (only rank 0 has the path), so
        # all ranks take the same branch and make the same number of report calls.
        if not metrics.get("checkpoint"):
            due = time.monotonic() - last[0] >= interval
            if ctx.get_world_size() > 1:
                import torch.distributed as dist

                flag = torch.tensor([int(due)])
                dist.broadcast(flag, src=0)
                due = bool(flag.item())
            if not due:
                return
            last[0] = time.monotonic()
            ray.train.report(metrics)
        elif path is None:
            last[0] = time.monotonic()
            ray.train.report(metrics)
        else:
            last[0] = time.monotonic()
            ray.train.report(
                metrics,
                checkpoint=Checkpoint.from_directory(str(path)),
                checkpoint_dir_name=path.name,
                delete_local_checkpoint_after_upload=True,
            )

    with tempfile.TemporaryDirectory(prefix=f"lsw-{ctx.get_world_rank()}-") as work:
        ckpt = ray.train.get_checkpoint()
        if ckpt is None:
            run_training(exp, workdir=work, report=report, device=device)
        else:
            with ckpt.as_directory() as resume:
                run_training(exp, workdir=work, resume_from=resume, report=report, device=device)


@dataclass
class RayTrainResult:
    checkpoint: Path | None  # the last persisted checkpoint dir (HF safetensors / adapter)
    metrics: dict  # last reported metrics
    path: Path  # the run's folder under storage_path
    error: str | None


def trainer_for(exp: TrainExperiment, *, storage_path: str | None = None, name: str | None = None, callbacks=None, min_report_interval_s: float = 2.0) -> TorchTrainer:  # fmt: skip
    """The TorchTrainer for an experiment (not yet fitted).

    Args:
        exp: the validated experiment.
        storage_path: overrides exp.storage_path (local folder or cloud URI).
        name: overrides exp.name (the run's folder under storage_path).
        callbacks: Ray Train callbacks (e.g. a Tune report callback for nested sweeps).
        min_report_interval_s: metric-only reports closer together than this are dropped
            (0: forward every log step; each may then block up to Ray's ~2 s poll).
    """
    exp = absolute_local_paths(exp)  # workers do not share the driver's working folder
    s = exp.scaling
    storage = storage_path or exp.storage_path
    if "://" not in storage:
        storage = str(Path(storage).resolve())
    return TorchTrainer(
        _worker,
        train_loop_config={
            "experiment": experiment_json(exp),
            "threads": s.cpus_per_worker,
            "min_report_interval_s": min_report_interval_s,
        },
        torch_config=TorchConfig(backend="nccl" if s.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=s.num_workers,
            use_gpu=s.use_gpu,
            resources_per_worker={"CPU": s.cpus_per_worker} | ({"GPU": 1} if s.use_gpu else {}),
        ),
        run_config=RunConfig(
            name=name or exp.name,
            storage_path=storage,
            failure_config=FailureConfig(max_failures=exp.failure.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=exp.keep_checkpoints),
            callbacks=callbacks,
        ),
    )


def _fit_off_main_thread(trainer: TorchTrainer):
    """`trainer.fit()` in a helper thread, so Ctrl-C reaches the caller as KeyboardInterrupt.

    In the main thread Ray Train installs its own SIGINT handler, which aborts the run and then
    returns from fit() as if it had ended; the caller could not tell an interrupted run from a
    finished one. Waiting in short joins lets Python deliver signals to the main thread.
    """
    if not ray.is_initialized():
        ray.init()  # here, not in the helper thread: Ray sets up its driver in the main thread
    box: dict = {}

    def fit() -> None:
        try:
            box["result"] = trainer.fit()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=fit, name="layerswap-ray-fit", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.2)
    if "error" in box:
        raise box["error"]
    return box["result"]


def train_with_ray(exp: TrainExperiment, *, storage_path: str | None = None, name: str | None = None, min_report_interval_s: float = 2.0) -> RayTrainResult:  # fmt: skip
    """Fit one TorchTrainer for `exp` and return where its last checkpoint is.

    Args: as for `trainer_for`.
    Returns:
        RayTrainResult (error is set instead of raising when the run failed for good).
    """
    trainer = trainer_for(exp, storage_path=storage_path, name=name, min_report_interval_s=min_report_interval_s)  # fmt: skip
    try:
        result = _fit_off_main_thread(trainer)
    except ray.train.TrainingFailedError as e:  # V2 raises once max_failures is used up
        return RayTrainResult(None, {}, Path(storage_path or exp.storage_path) / (name or exp.name), repr(e))  # fmt: skip
    ckpt = Path(result.checkpoint.path) if result.checkpoint is not None else None
    return RayTrainResult(
        checkpoint=ckpt,
        metrics=dict(result.metrics or {}),
        path=Path(result.path),
        error=None if result.error is None else repr(result.error),
    )
