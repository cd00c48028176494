"""Helpers for the trainer tests: short experiments on the tiny world (imported by the tests)."""

from __future__ import annotations

from pathlib import Path

from layerswap.spaces.train_experiment import TrainExperiment, parse_train_experiment

# A custom partition that fits the tiny world's 4 layers: layers 0 and 3 language, 1-2 task.
EDGE = {"bottom": 1, "top": 1}
# The smallest expert sweep a CLI test runs: one trial of one lr, its last checkpoint scored on
# 2 English Belebele dev items.
TINY_SWEEP = {
    "num_samples": 1,
    "params": {"hyper.lr": {"choices": [1e-3]}},
    "checkpoints": "last",
    "indicators": ["world_belebele_en_dev"],
    "limit": 2,
    "max_gen_toks": 4,
}


def make_exp(world: Path, mode: str | dict = "full", **over) -> TrainExperiment:
    """A short experiment on the tiny world; `over` replaces top-level keys or hyper fields."""
    two = (mode if isinstance(mode, str) else mode["type"]) in ("simultaneous", "mix")
    data = [{"path": str(world / "data/sft/math_en.jsonl")}]
    if two:
        data.append({"path": str(world / "data/sft/lang_xa.jsonl")})
    hyper = {
        "lr": 3e-3,
        "schedule": "constant_with_warmup",
        "warmup_steps": 2,
        "batch_size": 8,
        "max_steps": 12,
        "seq_len": 96,
        "seed": 0,
    }
    hyper |= over.pop("hyper", {})
    cfg = {
        "name": "t",
        "base": str(world / "base"),
        "kind": "math",
        "language": "en",
        "datasets": data,
        "mode": mode,
        "hyper": hyper,
    } | over
    return parse_train_experiment(cfg, source="test")


MODE_CFGS = {
    "full": "full",
    "lora": {"type": "lora", "rank": 8, "alpha": 16},
    "partial": {"type": "partial", "partition": EDGE, "train": "task"},
    # embeddings/lm_head with the language side: the barely pretrained tiny base learns its
    # language data mostly there
    "simultaneous": {"type": "simultaneous", "partition": {**EDGE, "non_layer": "language"}},
    "mix": "mix",
}
# LoRA moves few parameters of a barely pretrained base (which learns most in lm_head): more
# steps make "the loss falls" visible.
# Simultaneous at 3e-3 is chaotic on this model (1 and 2 workers part ways after ~8 steps).
MODE_HYPER = {
    "lora": {"lr": 3e-3, "max_steps": 40, "schedule": "linear"},
    "simultaneous": {"lr": 2e-3, "max_steps": 16},
}


def ddp_worker(rank: int, world: int, init: str, jobs: list[dict], out: str) -> None:
    """torch.multiprocessing target: join a gloo group, run each job's experiment, rank 0 saves
    what the test checks (per-job reports and the final checkpoint) as JSON at `out`."""
    import json

    import torch
    import torch.distributed as dist

    from layerswap.trainables.train import run_training

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        results = {}
        for job in jobs:
            exp = parse_train_experiment(job["experiment"], source="ddp test")
            seen: list[dict] = []
            res = run_training(exp, workdir=job["workdir"], resume_from=job.get("resume_from"), report=lambda m, p, s=seen: s.append(m))  # fmt: skip
            results[job["id"]] = {
                "reports": seen,
                "final": str(res.final_checkpoint) if res.final_checkpoint else None,
                "losses": res.losses,
            }
        if rank == 0:
            Path(out).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()
