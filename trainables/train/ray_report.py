"""How a Ray Train worker hands the plain loop's reports to Ray: metric reports rate-limited,
checkpoint reports uploaded atomically into the run folder, progress lines after the upload.

Used by trainables/train/ray_train.py's worker function. Tests:
.venv/bin/python -m pytest -q tests/trainables/train/test_ray_train.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ray.train
import torch
import torch.distributed as dist
from ray.train import Checkpoint

from layerswap.trainables.train.checkpoint_store import drop_older_in_store


@dataclass
class RayReporter:
    """The `report(metrics, path)` callback of trainables.train.loop.run_training on a worker.

    Ray Train V2 hands each report to the controller through a one-slot queue that the
    controller drains on its ~2 s health-check poll, and every report also syncs all ranks: a
    report per step would cost up to 2 s per step. Metric-only reports are therefore forwarded
    at most every `interval_s` (rank 0's clock decides, broadcast so every rank makes the same
    number of calls); checkpoint reports always go through.

    Args:
        interval_s: the least time between two metric-only reports.
        upload: the checkpoint_upload_fn for checkpoint reports (None: Ray's own upload).
        store_run: a store's Ray run folder (URI) in which only the newest checkpoint keeps
            its resume state (cloud storage, resume_state: newest), else None.
        progress: rank 0's progress sender (trainables/train/ray_progress.sender), else None.
    """

    interval_s: float
    upload: Callable | None
    store_run: str | None
    progress: Callable[[dict, Path | None], None] | None
    _last: float = field(default=float("-inf"), init=False)

    def __call__(self, metrics: dict, path: Path | None) -> None:
        self._forward(metrics, path)
        if self.progress is not None:  # after the upload: the line names a checkpoint that is there
            self.progress(metrics, path)

    def _forward(self, metrics: dict, path: Path | None) -> None:
        ctx = ray.train.get_context()
        # `checkpoint` is set on every rank at a checkpoint step (only rank 0 has the path), so
        # all ranks take the same branch and make the same number of report calls.
        if not metrics.get("checkpoint"):
            if not self._due(ctx.get_world_size()):
                return
            self._last = time.monotonic()
            ray.train.report(metrics)
        elif path is None:
            self._last = time.monotonic()
            ray.train.report(metrics)
        else:
            self._last = time.monotonic()
            ray.train.report(
                metrics,
                checkpoint=Checkpoint.from_directory(str(path)),
                checkpoint_dir_name=path.name,
                delete_local_checkpoint_after_upload=True,
                checkpoint_upload_fn=self.upload,
            )
        if metrics.get("checkpoint") and self.store_run:
            drop_older_in_store(self.store_run, ctx.get_world_rank(), ctx.get_world_size())

    def _due(self, world_size: int) -> bool:
        """Whether a metric-only report goes through now: rank 0's clock, on every rank."""
        due = time.monotonic() - self._last >= self.interval_s
        if world_size > 1:
            flag = torch.tensor([int(due)])  # a CPU tensor: the group's gloo backend carries it
            dist.broadcast(flag, src=0)
            due = bool(flag.item())
        return due
