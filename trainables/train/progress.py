"""The progress line `layerswap train` prints, and when: one rule for a run on Ray Train and one
with `--no-ray`.

    step 30 of 60, samples 480 of 960: loss 0.3254, val 0.2994, 21.5 samples/s -> RUN/samples_...

A line is printed at the first report, at every checkpoint (with its path) and otherwise at most
every `PRINT_EVERY_S` seconds; the training loop's report metrics (trainables/train/loop.py)
carry every number in it. On Ray the rank 0 worker decides (`ProgressGate`) and the driver
prints (trainables/train/ray_train.py). Tests:
.venv/bin/python -m pytest -q tests/trainables/train/test_train_progress_lines.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

PRINT_EVERY_S = 30.0  # a run of hours shows it is alive without flooding the terminal


def progress_line(metrics: dict, checkpoint: str | Path | None = None) -> str:
    """The line for one report of the training loop.

    Args:
        metrics: the loop's report metrics (step, samples, total_steps, total_samples, loss,
            samples_per_s; val_loss at a checkpoint with validation data).
        checkpoint: the checkpoint written at this step, where the user finds it.
    Returns:
        one line, no newline.
    """
    m = metrics
    line = (
        f"step {m['step']} of {m['total_steps']}, samples {m['samples']} of "
        f"{m['total_samples']}: loss {m['loss']:.4f}"
    )
    if "val_loss" in m:
        line += f", val {m['val_loss']:.4f}"
    line += f", {m['samples_per_s']:.1f} samples/s"
    return line + (f" -> {checkpoint}" if checkpoint is not None else "")


class ProgressGate:
    """Whether a report gets a line: the first, every checkpoint, else `every_s` after the last.

    Args:
        every_s: the least time between two lines that are not checkpoints.
        clock: seconds (monotonic); a test's own clock.
    """

    def __init__(self, every_s: float = PRINT_EVERY_S, clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.every_s, self.clock, self.last = every_s, clock, None

    def due(self, metrics: dict) -> bool:
        """Whether this report is printed (and, if so, the clock restarts)."""
        now = self.clock()
        if not metrics.get("checkpoint") and self.last is not None and now - self.last < self.every_s:  # fmt: skip
            return False
        self.last = now
        return True


def printer(every_s: float = PRINT_EVERY_S) -> Callable[[dict, Path | None], None]:
    """A training loop `report` callable that prints the progress lines (the `--no-ray` run)."""
    gate = ProgressGate(every_s)

    def report(metrics: dict, checkpoint: Path | None) -> None:
        if gate.due(metrics):
            print(progress_line(metrics, checkpoint), flush=True)

    return report
