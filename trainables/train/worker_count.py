"""The worker count a run trains on, which is part of its experiment: `--no-ray` trains on one
worker whatever `scaling.num_workers` says, and a run is resumed only on the count its
checkpoints were trained on (run.rerun_plan refuses another, naming the field; this says why
and what to do).

Run its tests: .venv/bin/python -m pytest -q tests/trainables/train/test_worker_count_resume.py
"""

from __future__ import annotations

from layerswap.spaces.train_experiment import TrainExperiment, with_overrides


def one_worker(exp: TrainExperiment) -> TrainExperiment:
    """`exp` as `--no-ray` trains it, on this process's one worker (said when the config asks
    for more): what its marker and manifests record and its rerun decision compares.

    Args:
        exp: the experiment as configured.
    Returns:
        `exp`, with scaling.num_workers 1.
    """
    if exp.scaling.num_workers == 1:
        return exp
    print(f"--no-ray: running 1 worker (config asks for {exp.scaling.num_workers})")
    return with_overrides(exp, {"scaling.num_workers": 1})


def worker_hint(old: dict, exp: TrainExperiment, no_ray: bool) -> str:
    """What to do when the checkpoints' worker count is not this run's (`no_ray`: they were
    written by `--no-ray`, under checkpoints/): where they came from and how to go on.

    Args:
        old: the experiment the newest checkpoint's manifest records.
        exp: the experiment as this run would train it.
        no_ray: whether that checkpoint lies where `--no-ray` writes (RUN/checkpoints/).
    Returns:
        " (...)" to follow the changed fields in the refusal, or "" (no worker-count change,
        or a plain one the field names well enough).
    """
    was, now = (old.get("scaling") or {}).get("num_workers"), exp.scaling.num_workers
    if was == now:
        return ""
    if no_ray and was == 1:
        return (
            f" (its checkpoints were trained with --no-ray, which runs 1 worker; this config asks "
            f"for {now}: run it with --no-ray again (--no-ray --resume to continue it), or set "
            "scaling.num_workers: 1)"
        )
    return f" (its checkpoints were trained on {was} workers; --no-ray runs 1: resume it on Ray, without --no-ray)" if now == 1 else ""  # fmt: skip
