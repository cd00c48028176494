"""Where and how a sweep trial scores its checkpoints: on what Ray reserves for it, with the
batch halved on out-of-memory.

A trial that drives a nested TorchTrainer (executor ray_train) holds nothing and runs on the
head node; its workers hold the GPUs or CPUs and free them when training ends. Scoring in the
trial's process would then run on the head, unaccounted, beside every concurrent trial's (or on
cuda:0 of the head, colliding). So such a sweep scores in a Ray task that reserves one GPU (Ray
sets its CUDA_VISIBLE_DEVICES) or its CPUs, after training has given them back. An in-trial run
reserves its GPU or CPUs as trial resources instead (experts/sweep.py).
Tests: tests/experts/test_sweep_scoring.py
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from layerswap.experts.sweep_setup import SweepSetup
from layerswap.trainables.evaluate.fit import backing_off


def scoring_resources(setup: SweepSetup) -> dict | None:
    """Ray task options for scoring a trial's checkpoints, or None to score in the trial.

    A trial that drives a nested TorchTrainer holds nothing (it sits on the head node,
    `trial_resources`): its scoring reserves what it uses, a GPU of its own when the experiment
    trains on GPUs and the sweep does not ask for the CPU (of the experiment's
    scaling.accelerator_type, when it names one), else `cpus_per_trial` CPUs, so
    concurrent trials never score unreserved on the head. An in-trial run scores on what the
    trial holds.
    """
    if setup.executor != "ray_train":
        return None
    scaling = setup.experiment["scaling"]
    if scaling["use_gpu"] and setup.sweep.device != "cpu":
        opts = {"num_gpus": 1, "num_cpus": setup.sweep.cpus_per_trial}
        # The GPU kind the experts trained on (Ray's accelerator_type:NAME label): without it, a
        # mixed cluster scores on whichever GPU frees first, and an autoscaler whose GPUs are
        # busy may start a node of another type (one the memory plan did not size).
        if kind := scaling.get("accelerator_type"):
            opts["accelerator_type"] = kind
        return opts
    return {"num_cpus": setup.sweep.cpus_per_trial}


# Ray's resource of the head node (ray/_common/constants.HEAD_NODE_RESOURCE_NAME; Ray Train's
# own state actor pins itself with it). tests/experts/test_sweep_scoring.py pins the name.
HEAD_NODE = "node:__internal_head__"


def trial_resources(setup: SweepSetup) -> dict[str, float]:
    """What a sweep trial reserves: its CPUs and the GPU an in-trial GPU run trains on; a trial
    that only drives a nested TorchTrainer (whose workers reserve their own) reserves no CPU
    and runs on the head node. There Ray Train's controller, which Ray puts on the node of the
    process that starts it, outlives a lost worker node and restarts the run from its last
    checkpoint; on a GPU node that was lost, the trial failed with no retry (a red-team
    reproduced it: Tune had placed every trial on the GPU node)."""
    if setup.executor != "in_trial":
        return {"cpu": 0, HEAD_NODE: 0.001}
    res = {"cpu": setup.sweep.cpus_per_trial}
    if setup.experiment["scaling"]["use_gpu"]:
        res["gpu"] = 1
    return res


def score_backing_off(score, setup: SweepSetup, checkpoints: list[Path], trial_id: str, params: dict) -> list[dict]:  # fmt: skip
    """`score(setup, checkpoints, trial_id, params)`, halving an int sweep.batch_size on
    out-of-memory down to 1 ("auto" backs off inside the evaluator)."""
    batch = setup.sweep.batch_size
    if batch == "auto" or batch == 1:
        return score(setup, checkpoints, trial_id, params)

    def at(b: int) -> list[dict]:
        sized = replace(setup, sweep=setup.sweep.model_copy(update={"batch_size": b}))
        return score(sized, checkpoints, trial_id, params)

    def said(failed: int, nxt: int) -> None:
        print(f"sweep trial {trial_id}: out of memory scoring at batch {failed}; retrying at {nxt}", flush=True)  # fmt: skip

    return backing_off(at, int(batch), said)[0]


def score_reserved(score, setup: SweepSetup, checkpoints: list[Path], trial_id: str, params: dict) -> list[dict]:  # fmt: skip
    """Score in a Ray task reserving what `scoring_resources` says, else in this process;
    either way backing off on out-of-memory."""
    opts = scoring_resources(setup)
    if opts is None:
        return score_backing_off(score, setup, checkpoints, trial_id, params)
    import ray  # lazy: only a sweep inside Ray gets here

    # "DEFAULT": out of the Tune trial's placement group, which Ray would otherwise make the task
    # fit into (the trial's one bundle holds no GPU and no CPU: "Cannot schedule ... with the
    # placement group"; Ray Train's own actors escape the same way).
    task = ray.remote(**opts, scheduling_strategy="DEFAULT")(score_backing_off)
    return ray.get(task.remote(score, setup, checkpoints, trial_id, params))
