"""Progress lines of a Ray Train run, printed by the driver as `--no-ray` prints them.

The rank 0 worker decides which reports get a line (trainables/train/progress.py: the first,
every checkpoint, else every ~30 s) and puts them on a Ray queue; a thread of the driver prints
them while `fit()` blocks. Worker output does not serve: Ray forwards it with a
`(RayTrainWorker pid=...)` prefix and interleaved with its own logs, and not at all where the
driver runs with `log_to_driver=False` (the default of `layerswap train` without --verbose).

    with printing(where) as channel:          # the driver, Ray initialised
        trainer_for(exp, progress=channel)...  # the worker calls sender(channel)(metrics, path)

Tests: .venv/bin/python -m pytest -q tests/trainables/train/test_train_progress_lines.py
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ray.util.queue import Empty, Queue

from layerswap.trainables.storage import is_uri, join
from layerswap.trainables.train.progress import ProgressGate, progress_line

_POLL_S = 0.5  # how soon after fit() returns the driver's thread sees it is done


def sender(channel: Queue | None) -> Callable[[dict, Path | None], None] | None:
    """The rank 0 worker's side: a `report(metrics, checkpoint)` that puts the due reports on
    `channel` (None: no channel, nothing to send). Call it after the checkpoint is uploaded, so
    the line's path is there when the user reads it.

    Returns:
        the callable, or None when there is no channel.
    """
    if channel is None:
        return None
    gate = ProgressGate()

    def send(metrics: dict, checkpoint: Path | None) -> None:
        if not gate.due(metrics):
            return
        try:  # progress is a courtesy: a driver gone does not stop the training
            channel.put_nowait((metrics, checkpoint.name if checkpoint is not None else None))
        except Exception:
            pass

    return send


def teller(channel: Queue | None) -> Callable[[str], None] | None:
    """The rank 0 worker's side of a line about the run that is no progress line (rows cut to
    seq_len, say): the driver prints it as it is, in order with the progress lines.

    Returns:
        a `say(line)` callable, or None when there is no channel.
    """
    if channel is None:
        return None

    def say(line: str) -> None:
        try:  # as for progress: a driver gone does not stop the training
            channel.put_nowait(line)
        except Exception:
            pass

    return say


def _persisted(run: str | Path, name: str | None) -> str | Path | None:
    """Where the checkpoint `name` lands in the run folder (a URI in cloud storage)."""
    if name is None:
        return None
    return join(str(run), name) if is_uri(str(run)) else Path(run) / name


def _print_all(channel: Queue, run: str | Path, done: threading.Event) -> None:
    """The driver's thread: print each line as it comes, until `done` and the queue is empty."""
    while True:
        try:
            item = channel.get(timeout=_POLL_S)
        except Empty:
            if done.is_set():
                return  # fit() has returned: every worker's put had finished before
            continue
        except Exception:  # Ray shut down under it (an interrupted driver)
            return
        if isinstance(item, str):  # a line of teller's
            print(item, flush=True)
            continue
        metrics, name = item
        print(progress_line(metrics, _persisted(run, name)), flush=True)


@contextmanager
def printing(run: str | Path) -> Iterator[Queue]:
    """The driver's side: a queue for the workers and a thread printing what they put there,
    drained when the block ends (Ray must be initialised).

    Args:
        run: the run's folder under storage_path (a URI in cloud storage), where the
            checkpoints named in the lines land.
    Yields:
        the channel to hand to the workers (trainer_for(progress=...)).
    """
    # num_cpus=0: a cluster whose CPUs all train (or a head node without CPUs) still places it
    channel = Queue(actor_options={"num_cpus": 0})
    done = threading.Event()
    thread = threading.Thread(target=_print_all, args=(channel, run, done), daemon=True)
    thread.start()
    try:
        yield channel
    finally:
        done.set()
        thread.join(timeout=10)  # the last lines; never hang an interrupted command on them
        try:
            channel.shutdown(force=True)  # its lines are printed: nothing is lost
        except Exception:  # Ray already shut down (an interrupted driver)
            pass
