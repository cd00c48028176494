"""The one rerun rule of a training run (`decide`), for a local run folder and a run in a store
alike: the same experiment continues only with `resume`, a finished one is not trained again, a
different one needs `overwrite` once it saved a checkpoint (before that it has nothing to lose),
and so does the same one whose dataset files changed since its checkpoints. Pure: what the run
holds comes in as functions (trainables/train/run.py `rerun_plan` reads a local folder).

Run its tests: .venv/bin/python -m pytest -q tests/trainables/train/test_uri_rerun.py
tests/cli/test_rerun_commands.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Literal

from layerswap.spaces.train_experiment import TrainExperiment, experiment_json
from layerswap.trainables.outputs import OutputError

Rerun = Literal["fresh", "resume", "done", "replace"]


def decide(run: str, *, started: bool, check: Callable[[], None], same: Callable[[], bool], saved: Callable[[], bool], last: Callable[[], tuple[object, bool]], changed: Callable[[], str], data: Callable[[], str | None], resume: bool, overwrite: bool) -> Rerun:  # fmt: skip
    """The one rerun rule, for a local run folder and a run in a store (s3://, file://) alike.

    Args:
        run: the run, as messages name it.
        started: whether it holds anything.
        check: raises when what it holds is no training run of layerswap's.
        same: whether it holds this very experiment.
        saved: whether it holds a checkpoint (a manifest: its state is not read).
        last: its last checkpoint and whether that is the final step's.
        changed: what differs from the experiment it holds, as a phrase ("" when unknown).
        data: why its newest checkpoint's data is not the data there now (a dataset file
            changed: data_fingerprint.resume_data_problem), or None.
        resume, overwrite: the user's flags.
    Returns:
        "fresh" (nothing there), "resume" (same experiment, unfinished, `resume`), "done"
        (same experiment, finished: nothing to train), "replace" (`overwrite`, or another
        experiment's run that saved no checkpoint: said on stderr).
    Raises:
        OutputError: it holds another experiment's checkpoints or something else, and no flag
            says what to do with it; or this experiment's, trained on a dataset file that has
            changed since (neither "done" nor "resume": the expert would not be of this data).
    """
    if resume and overwrite:
        raise OutputError("--resume and --overwrite: give one (continue the run, or start over)")
    if not started:
        if resume:
            raise OutputError(f"{run}: --resume, but there is no run to continue")
        return "fresh"
    check()  # a training run of layerswap's, or refuse
    if overwrite:
        return "replace"
    if not same():
        if not saved():
            # A run that failed before its first checkpoint (data too long for seq_len, a
            # worker's error): nothing to lose, and the corrected rerun must not need a flag.
            print(f"layerswap: {run}: holds a run of another experiment that saved no checkpoint; this one replaces it", file=sys.stderr)  # fmt: skip
            return "replace"
        what = changed()
        raise OutputError(
            f"{run}: holds a training run of a different experiment (config changed)"
            f"{'; its newest checkpoint differs in ' + what if what else ''}; pass --overwrite to "
            "start over (the old run is kept until the new one finishes) or choose another --out"
        )
    if (problem := data()) is not None:
        raise OutputError(f"{run}: {problem}")
    ckpt, finished = last()
    if finished:
        return "done"
    if not resume:
        where = f"last checkpoint {ckpt}" if ckpt is not None else "no checkpoint yet"
        raise OutputError(
            f"{run}: an unfinished run of this experiment exists ({where}); pass --resume to "
            "continue it or --overwrite to start over"
        )
    return "resume"


def changes(old: dict, exp: TrainExperiment, most: int = 4) -> str:
    """What differs between the experiment a checkpoint manifest records (`old`) and `exp`:
    "hyper.lr 3e-05 -> 0.0009, ..." (where it writes and debug aside, as the identity)."""

    def flat(d: object, pre: str = "") -> dict:
        if not isinstance(d, dict):
            return {pre: d}
        return {k: v for key, val in d.items() for k, v in flat(val, f"{pre}{key}.").items()}

    skip = ("storage_path.", "debug.")
    a = {k.rstrip("."): v for k, v in flat(old).items() if not k.startswith(skip)}
    b = {k.rstrip("."): v for k, v in flat(experiment_json(exp)).items() if not k.startswith(skip)}
    diff = [f"{k} {a.get(k)} -> {b.get(k)}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]  # fmt: skip
    return ", ".join(diff[:most]) + (f" and {len(diff) - most} more" if len(diff) > most else "")
