"""Ray Train wrapper of the plain training loop: one TorchTrainer per experiment.

`train_with_ray(load_train_experiment("exp.yaml"))` runs `layerswap.trainables.train.run_training` on
`scaling.num_workers` workers (gloo on CPU, nccl on GPU), persists each checkpoint under
`storage_path/name/`, and on a worker failure restarts the group from the last checkpoint
(`failure.max_failures`), except after an error a restart would raise again (training turned
non-finite: trainables/train/ray_failures.py). Call inside `ray.init(...)`, or let Ray start a
local cluster.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import ray.train
import torch
import torch.distributed as dist
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig

from layerswap.spaces.local_inputs import train_inputs
from layerswap.spaces.train_experiment import (
    TrainExperiment,
    absolute_local_paths,
    experiment_json,
    parse_train_experiment,
    records_experiment,
)
from layerswap.trainables.atomic import atomic_dir, remove_left_temps
from layerswap.trainables.data_fingerprint import data_fingerprint, resume_data_problem
from layerswap.trainables.devices import DeviceUnusable, cpu_allowed, require_cuda
from layerswap.trainables.merge.checkpoint import CheckpointError
from layerswap.trainables.node_paths import (
    NodePathError,
    check_here,
    check_node_paths,
    described,
    run_lock,
)
from layerswap.trainables.ray_session import init_ray
from layerswap.trainables.storage import filesystem, is_uri, join, uri_of
from layerswap.trainables.train.checkpoint_store import check_restored
from layerswap.trainables.train.finite import NonFiniteTraining
from layerswap.trainables.train.loop import run_training
from layerswap.trainables.train.ray_capacity import check_capacity
from layerswap.trainables.train.ray_failures import (
    OwnErrorsTrainer,
    describe_failure,
    quiet_own_errors,
)
from layerswap.trainables.train.ray_fit import fit_interruptibly
from layerswap.trainables.train.ray_keep import (
    prune_untracked,
    untracked_checkpoints,
    untracked_up_to,
)
from layerswap.trainables.train.ray_progress import printing, sender, teller
from layerswap.trainables.train.ray_report import RayReporter
from layerswap.trainables.train.state import (
    find_checkpoints,
    keep_resume_state_of_newest,
    read_manifest,
    resume_problem,
)


def _upload_into(run_dir: str, merged: bool = False, newest_only: bool = True, keep: int | None = None, untracked: list[str] | None = None):  # fmt: skip
    """A `checkpoint_upload_fn` that copies a checkpoint into the local run folder atomically.

    Ray's own upload copies file by file into storage: a worker killed mid-copy (an interrupted
    driver's Ray shutdown kills its workers) would leave a checkpoint folder that looks complete
    (its manifest is there) but is not. Built beside and renamed into place, it is whole or absent.
    `merged` (FSDP: every rank reports the folder of its own shards): each rank copies its files
    into one staging folder, and rank 0 renames it once all have (a collective: every rank
    reports a checkpoint at the same step). Then, the new one whole, keep_checkpoints prunes the
    `untracked` checkpoints (those Ray does not know of: trainables/train/ray_keep.py).
    """

    def upload(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
        dest = Path(run_dir) / dir_name
        if not merged:
            with atomic_dir(dest, overwrite=True) as tmp:
                shutil.copytree(checkpoint.path, tmp, dirs_exist_ok=True)
            prune_untracked(dest, keep, untracked or [])
            if newest_only:  # resume_state: newest
                keep_resume_state_of_newest(find_checkpoints(run_dir))
            return Checkpoint.from_directory(str(dest))
        stage = Path(run_dir) / f".{dir_name}.tmp-merge"  # swept by trainer_for if left
        rank = dist.get_rank()
        if rank == 0:
            shutil.rmtree(stage, ignore_errors=True)
            stage.mkdir(parents=True)
        dist.barrier()
        shutil.copytree(checkpoint.path, stage, dirs_exist_ok=True)  # ranks' files are disjoint
        dist.barrier()
        if rank == 0:
            with atomic_dir(dest, overwrite=True) as tmp:
                tmp.rmdir()
                os.rename(stage, tmp)
            prune_untracked(dest, keep, untracked or [])
            if newest_only:
                keep_resume_state_of_newest(find_checkpoints(run_dir))
        dist.barrier()
        return Checkpoint.from_directory(str(dest))

    return upload


def _resume_point(exp: TrainExperiment, run_dir: Path) -> str | None:
    """The newest checkpoint of this very experiment already in the local run folder, or None.

    Ray restores a run from its own snapshot (checkpoint_manager_snapshot.json), which its
    controller writes only once it has taken in a checkpoint's report (it polls every ~2 s): a
    driver interrupted in between leaves checkpoints Ray does not know of, or no snapshot at
    all, and the run would train those steps again (from scratch without a snapshot). The
    workers start from this one when it is newer than what Ray restores.
    """

    # Hashed only once a checkpoint of this experiment has a fingerprint to compare with (a
    # fresh run has none), and once for all of them.
    now = functools.cache(lambda: data_fingerprint(exp))

    def same(manifest: dict) -> bool:  # this experiment, trained on the dataset files as they are
        # the driver's rule (run.rerun_plan): a checkpoint of another worker count is refused
        # there before Ray starts, so no worker passes over one the driver planned to resume
        return records_experiment(manifest, exp) and resume_data_problem(exp, manifest, now) is None  # fmt: skip

    found = [c for c in find_checkpoints(run_dir) if same(read_manifest(c))] if run_dir.is_dir() else []  # fmt: skip
    intact = [
        c for c in found if resume_problem(c) is None
    ]  # as the driver chose (run.continue_from)
    return str(intact[-1]) if intact else None


def _newest(ray_ckpt: str | None, on_disk: str | None) -> str | None:
    """Of Ray's restored checkpoint and the newest intact one on disk, the one at the later
    step (Ray's own is passed over when its resume state is damaged: the driver said so)."""

    found = [p for p in (ray_ckpt, on_disk) if p is not None and resume_problem(Path(p)) is None]
    return max(found, key=lambda p: read_manifest(p)["step"]) if found else None


def _worker_device(use_gpu: bool, backend: str):
    """This worker's device: Ray's GPU for it under scaling.use_gpu, checked like a local run
    (trainables/devices.py): where CUDA is not usable, the one-line DeviceUnusable naming the
    setting, or the CPU with LAYERSWAP_ALLOW_CPU=1. Ray's get_device handed out cuda:N
    unchecked, and the run failed deep in torch ("Torch not compiled with CUDA enabled").

    Args:
        use_gpu: scaling.use_gpu.
        backend: the process group's backend, as the driver chose it (process_group_backend).
    Returns:
        "cpu" or this worker's CUDA device. Always the CPU in a gloo-only group (a GPU run allowed
        onto the CPU where the command runs): its CUDA tensors would go over gloo, which FSDP2's
        reduce-scatter cannot take and DDP takes slowly, so every worker trains on its CPU.
    """

    if not use_gpu or "nccl" not in backend:
        return "cpu"
    require_cuda("scaling.use_gpu")  # raises unless CUDA works or the CPU was allowed
    return ray.train.torch.get_device() if torch.cuda.is_available() else "cpu"


def process_group_backend(use_gpu: bool) -> str:
    """torch.distributed's backend: gloo for CPU tensors everywhere, NCCL for CUDA ones on GPU
    runs. Gloo alone only for a GPU run allowed onto the CPU where this command runs
    (LAYERSWAP_ALLOW_CPU=1 and no CUDA here), whose workers then all run on their CPUs (those
    with a GPU too: _worker_device reads this choice, so device and backend always agree): NCCL
    cannot start without a GPU. Decided here, for every worker: the cluster's nodes run one
    image, and a worker whose GPU is unusable fails NCCL's start-up, which describe_failure names."""

    if not use_gpu or (cpu_allowed() and not torch.cuda.is_available()):
        return "gloo"
    return "cpu:gloo,cuda:nccl"


def _worker(config: dict) -> None:
    """Per-worker fn: resume from Ray's checkpoint if any, run the loop, report to Ray."""

    quiet_own_errors()  # a divergence is one line on the driver, not a worker traceback too
    # A node the autoscaler started after the driver's check: its view of the inputs and of
    # RUN, before anything loads (NodePathError: not retried, one line on the driver).
    check_here(config.get("node_inputs"))
    exp = parse_train_experiment(config["experiment"], source="ray worker")
    ctx = ray.train.get_context()
    torch.set_num_threads(max(1, int(config.get("threads", 1))))
    device = _worker_device(exp.scaling.use_gpu, config["backend"])

    run_dir = config.get("run_dir")  # local storage only: checkpoints land there atomically
    # FSDP: each worker trains in its own folder below and writes its own shards, so every rank
    # reports a checkpoint and the uploads merge (Ray's own upload merges in cloud storage).
    merged = exp.scaling.strategy == "fsdp" and ctx.get_world_size() > 1
    rank0 = ctx.get_world_rank() == 0
    say = teller(config.get("progress")) if rank0 else None
    untracked: list[str] = []  # of config["untracked"], those this attempt may prune (below)
    newest_only = exp.resume_state == "newest"
    report = RayReporter(
        interval_s=float(config.get("min_report_interval_s", 2.0)),
        upload=_upload_into(run_dir, merged, newest_only, exp.keep_checkpoints, untracked)
        if run_dir
        else None,
        # a store's Ray run folder (URI): Ray's upload writes it
        store_run=config.get("store_run") if newest_only else None,
        progress=sender(config.get("progress")) if rank0 else None,
    )

    # Looked up again by every attempt: a worker group restarted after a lost worker may start
    # before Ray's controller has taken in the last checkpoint's report (a ~2 s poll).
    on_disk = _resume_point(exp, Path(run_dir)) if run_dir else None

    def start(work: str, resume: str | None) -> None:
        # Untracked checkpoints after the resume point are rewritten by this run (Ray then
        # knows them): only those up to it are pruned here.
        untracked[:] = untracked_up_to(config.get("untracked", []), resume)
        run_training(exp, workdir=work, resume_from=resume, report=report, device=device, say=say)

    with tempfile.TemporaryDirectory(prefix=f"lsw-{ctx.get_world_rank()}-") as work:
        ckpt = ray.train.get_checkpoint()
        if ckpt is None:
            start(work, _newest(None, on_disk))
        else:
            with ckpt.as_directory() as restored:
                check_restored(exp, restored, ckpt.path)
                start(work, _newest(restored, on_disk))


@dataclass
class RayTrainResult:
    checkpoint: Path | str | None  # the last persisted checkpoint dir (a URI in cloud storage)
    metrics: dict  # last reported metrics
    path: Path | str  # the run's folder under storage_path (a URI in cloud storage)
    error: str | None


def trainer_for(exp: TrainExperiment, *, storage_path: str | None = None, name: str | None = None, callbacks=None, min_report_interval_s: float = 2.0, progress=None) -> OwnErrorsTrainer:  # fmt: skip
    """The TorchTrainer for an experiment (not yet fitted); a deterministic worker error
    (training turned non-finite) is not retried, whatever `failure.max_failures` allows.

    Args:
        exp: the validated experiment.
        storage_path: overrides exp.storage_path (local folder or cloud URI).
        name: overrides exp.name (the run's folder under storage_path).
        callbacks: Ray Train callbacks (e.g. a Tune report callback for nested sweeps).
        min_report_interval_s: metric-only reports closer together than this are dropped
            (0: forward every log step; each may then block up to Ray's ~2 s poll).
        progress: a channel of trainables/train/ray_progress.printing: the rank 0 worker puts
            its progress lines there (None: no lines).
    """

    exp = absolute_local_paths(exp)  # workers do not share the driver's working folder
    s = exp.scaling
    backend = process_group_backend(s.use_gpu)  # the workers' devices follow it (_worker_device)
    storage = storage_path or exp.storage_path
    local, fs = {}, None
    inputs = train_inputs(exp)
    if is_uri(storage):  # Ray writes through the filesystem (and endpoint) storage reads with
        local = {"store_run": join(storage, name or exp.name)}
        fs, storage = filesystem(storage)
    else:
        storage = str(Path(storage).resolve())
        run_dir = Path(storage) / (name or exp.name)
        # A worker killed mid-upload (see _upload_into) leaves its temp folder: no one else
        # writes this run now, so it goes.
        remove_left_temps(run_dir)
        # Checkpoints Ray's snapshot does not name, read before Ray runs: its workers prune them
        # by keep_checkpoints (Ray prunes only those it registered).
        local = {"run_dir": str(run_dir), "untracked": untracked_checkpoints(run_dir)}
        inputs.append(run_lock(run_dir))  # its workers write their checkpoints there
    return OwnErrorsTrainer(
        _worker,
        train_loop_config={
            "experiment": experiment_json(exp),
            "threads": s.cpus_per_worker,
            "min_report_interval_s": min_report_interval_s,
            "progress": progress,
            "backend": backend,
            "node_inputs": described(inputs),
            **local,
        },
        # CPU tensors take gloo on GPU workers too: the report flag broadcast, and FSDP's
        # gradient-norm reduction when cpu_offload keeps gradients on the host.
        torch_config=TorchConfig(backend=backend),
        scaling_config=ScalingConfig(
            num_workers=s.num_workers,
            use_gpu=s.use_gpu,
            resources_per_worker={"CPU": s.cpus_per_worker} | ({"GPU": 1} if s.use_gpu else {}),
            accelerator_type=s.accelerator_type if s.use_gpu else None,
        ),
        run_config=RunConfig(
            name=name or exp.name,
            storage_path=storage,
            storage_filesystem=fs,
            failure_config=FailureConfig(max_failures=exp.failure.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=exp.keep_checkpoints),
            callbacks=callbacks,
        ),
    )


def start_ray(exp: TrainExperiment, verbose: bool, run_dir: Path | None = None) -> bool:
    """Start (or join, RAY_ADDRESS) Ray unless this process already has; unless `verbose`,
    without Ray's output: its workers' and controller's logs (Ray Train's report lines, weight
    loading bars, the placement group cleaner's notices every few seconds) and its INFO log.
    Warnings and errors still show; a worker's error reaches the caller as the run's error.
    In a driver, `exp`'s local inputs are then checked on every node (trainables/node_paths.py):
    train_expert calls this before it writes the run folder. `run_dir` (a local run folder, whose
    lock this command holds: its workers write checkpoints there) is checked too.

    Returns:
        whether this process is a driver (its stdout is the user's), not a Ray task.
    Raises:
        NodePathError (a ValueError): one line per node and input that differs there.
        ValueError: on a Ray this call started, workers no node can hold (ray_capacity).
    """
    if not ray.is_initialized():
        init_ray(verbose=verbose, log_to_driver=verbose, configure_logging=verbose)
    in_driver = ray.get_runtime_context().worker.mode != ray.WORKER_MODE
    if in_driver:
        extra = [run_lock(run_dir)] if run_dir is not None else []
        check_node_paths(train_inputs(absolute_local_paths(exp)) + extra)
        # Workers no node can hold: refused (or announced) before the run folder is marked.
        check_capacity(exp.scaling)
    return in_driver


def raise_own_error(e: Exception) -> None:
    """Re-raise, on the driver, a worker's error that already says in one line what went wrong
    (a non-finite base or step, a damaged checkpoint, an input a node does not see, a GPU a
    worker's torch cannot use), as the no-Ray
    run raises it; Ray's own
    wrapper would end the command in a traceback."""
    for err in (getattr(e, "worker_failures", None) or {}).values():
        err = getattr(err, "_base_exc", err)  # Ray's UserExceptionWithTraceback, should it stay
        if isinstance(err, (NonFiniteTraining, CheckpointError, NodePathError, DeviceUnusable)):
            raise type(err)(str(err)) from None


def train_with_ray(exp: TrainExperiment, *, storage_path: str | None = None, name: str | None = None, min_report_interval_s: float = 2.0, progress: bool = False, verbose: bool = False) -> RayTrainResult:  # fmt: skip
    """Fit one TorchTrainer for `exp` and return where its last checkpoint is.

    Args: as for `trainer_for`, and
        progress: print the progress lines (trainables/train/progress.py) on stdout; only in a
            driver (a Ray task's stdout is no user's).
        verbose: where this call starts Ray: also Ray's own output (see start_ray).
    Returns:
        RayTrainResult (error is set instead of raising when the run failed for good).
    """

    where = storage_path or exp.storage_path
    run = join(where, name or exp.name) if is_uri(where) else Path(where) / (name or exp.name)
    # Ray names cloud paths inside their filesystem ("bucket/key"): given back as URIs.
    as_path = (lambda p: uri_of(where, p)) if is_uri(where) else Path
    in_driver = start_ray(exp, verbose, None if is_uri(where) else run)
    try:
        with printing(run) if progress and in_driver else nullcontext() as channel:
            trainer = trainer_for(exp, storage_path=storage_path, name=name, min_report_interval_s=min_report_interval_s, progress=channel)  # fmt: skip
            result = fit_interruptibly(trainer)
    except ray.train.TrainingFailedError as e:  # V2 raises once max_failures is used up
        raise_own_error(e)
        return RayTrainResult(None, {}, run, describe_failure(e))
    ckpt = as_path(result.checkpoint.path) if result.checkpoint is not None else None
    return RayTrainResult(
        checkpoint=ckpt,
        metrics=dict(result.metrics or {}),
        path=as_path(result.path),
        error=None if result.error is None else describe_failure(result.error),
    )
