"""One expert trained where the caller asks: on Ray Train, or in this process (`--no-ray`).

`train_expert(exp, "runs/exp/train")` is what `layerswap train EXP.yaml` calls.
"""

from __future__ import annotations

from pathlib import Path

from spaces.train_experiment import TrainExperiment, with_overrides


def train_expert(exp: TrainExperiment, storage: str, *, use_ray: bool = True, resume: Path | None = None) -> Path | None:  # fmt: skip
    """Train one expert into `storage/<name>/` and return its last checkpoint dir.

    Args:
        storage: Ray storage path (local folder or cloud URI; local only with use_ray=False).
    """
    if not use_ray:
        if "://" in storage:
            raise ValueError(f"storage_path {storage}: --no-ray writes local folders only")
        from trainables.train import run_training

        if exp.scaling.num_workers != 1:
            print(f"--no-ray: running 1 worker (config asks for {exp.scaling.num_workers})")
            exp = with_overrides(exp, {"scaling.num_workers": 1})
        res = run_training(
            exp,
            workdir=Path(storage) / exp.name,
            resume_from=resume,
            report=lambda m, p: print(
                f"step {m['step']} samples {m['samples']} loss {m['loss']:.4f}"
                + (f" val {m['val_loss']:.4f}" if "val_loss" in m else "")
                + (f" -> {p}" if p else "")
            ),
        )
        return res.final_checkpoint
    if resume is not None:
        raise ValueError("--resume is for --no-ray; Ray resumes its own runs from storage")
    from trainables.train.ray_train import train_with_ray

    res = train_with_ray(exp, storage_path=storage)
    if res.error is not None:
        raise RuntimeError(f"training failed: {res.error}")
    return res.checkpoint
