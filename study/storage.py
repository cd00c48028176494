"""Checkpoints of a training run: the bytes it writes, the bytes storage keeps when it ends, and
the seconds its devices wait for the writes. Used by study/training.py.

Rules (trainables/train/loop.py, state.py, ray_train.py):

- Every checkpoint writes the weights (study.sizes.RunSizes.weights) and what resuming needs
  (RunSizes.resume); with `resume_state: newest` (the default) the older checkpoint then drops
  its resume state, so storage keeps the weights of every checkpoint and the resume state once;
  with `all`, every kept checkpoint keeps both. `keep_checkpoints: N` keeps the newest N.
- A checkpoint is written into the worker's temporary folder, then copied to the run's storage
  (storage_path, or the run folder) by Ray Train's report, which the run waits for: seconds =
  the fsynced bytes (torch.distributed.checkpoint's shards) / disk_sync_bytes_per_s + every
  byte / storage_write_bytes_per_s. Other files reach the page cache without waiting for the
  disk. Tokenizer files and manifests (~10 MB a checkpoint) are not counted.
Tests: .venv/bin/pytest -q tests/study/test_train_cost.py
"""

from __future__ import annotations

from dataclasses import dataclass

from layerswap.spaces.study import Profile
from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.study.sizes import RunSizes

STORAGE_FIGURES = ("disk_sync_bytes_per_s", "storage_write_bytes_per_s")


@dataclass(frozen=True)
class RunStorage:
    """One run's checkpoints: bytes kept and written, seconds waited."""

    kept: int  # checkpoints on storage when the run ends
    stored: float  # bytes on storage when the run ends
    written: float  # bytes written over the run
    write_s: float  # seconds the run waits for its checkpoint writes


def checkpoint_write_seconds(sizes: RunSizes, prof: Profile) -> float:
    """Seconds one checkpoint's write holds the run (see the module docstring)."""
    every = (sizes.weights + sizes.resume) / prof.storage_write_bytes_per_s.value
    return sizes.synced / prof.disk_sync_bytes_per_s.value + every


def run_storage(sizes: RunSizes, exp: TrainExperiment, ckpts: int, prof: Profile) -> RunStorage:
    """RunStorage of a run that writes `ckpts` checkpoints.

    Args:
        sizes: the run's tensor sizes (study.sizes.run_sizes).
        exp: the experiment (keep_checkpoints, resume_state).
        ckpts: checkpoints the run writes.
        prof: the device profile (its storage figures).
    """
    kept = min(ckpts, exp.keep_checkpoints or ckpts)
    resumes = kept if exp.resume_state == "all" else min(kept, 1)
    stored = kept * sizes.weights + resumes * sizes.resume
    written = ckpts * (sizes.weights + sizes.resume)
    return RunStorage(kept, stored, written, ckpts * checkpoint_write_seconds(sizes, prof))


def fmt_bytes(nbytes: float) -> str:
    """Bytes as the plan prints them: TB (10^12) from 0.1 TB, else GB, MB or kB (3 digits)."""
    if nbytes >= 1e11:
        return f"{nbytes / 1e12:,.2f} TB"
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if nbytes >= 0.1 * scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes / 1e3:.3g} kB"
