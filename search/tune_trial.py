"""Thin Ray Tune function trainable around search.trial.TrialRunner (one runner per process).

Built by search/search.py: `tune.with_parameters(merge_trial, spec=TrialSpec(...))`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from layerswap.search.expert_store import node_loader
from layerswap.search.trial import TrialRunner
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool, decode
from layerswap.trainables.devices import require_cuda
from layerswap.trainables.node_paths import NodePathError, check_here

# One runner per worker process and spec: experts, live model and prompts survive across
# trials because the search runs with reuse_actors=True.
_RUNNERS: dict[str, TrialRunner] = {}
META = "_layerswap"  # config key the searcher adds next to the Optuna params
TWIN = "twin_of"  # served as: the recipe id of a twin running in the same batch (reproducible)
# A trial whose node does not see an input (or RUN) as the driver does reports the lines under
# this key: not retried (the path does not come back), and the search ends in them (search.py).
NODE_PATHS_KEY = "node_paths"


@dataclass(frozen=True)
class TrialSpec:
    experiment_json: str
    pool_json: str
    include_path: tuple[str, ...]
    depth: int
    expert_store: str = "process"  # "node": search/expert_store.py; "process": own copy
    store_key: str = ""  # names the node stores of this search
    node_inputs: tuple = ()  # node_paths.described(...) on the driver: each trial's node checks

    @property
    def key(self) -> str:
        return f"{hash((self.experiment_json, self.pool_json, self.include_path))}"


def trial_device(gpus_per_trial: float) -> tuple[str, list[str]]:
    """Where this trial's live model runs, and the GPU ids Ray assigned to it.

    Ray sets CUDA_VISIBLE_DEVICES to the assigned GPUs, so "cuda" is this trial's own GPU. A
    cluster that advertises GPUs torch cannot use (a CUDA build too new for the node's driver,
    or `ray.init(num_gpus=...)` in tests) still schedules by GPU: the trial then fails with the
    reason, unless LAYERSWAP_ALLOW_CPU=1 lets it run on the CPU (trainables/devices.py).
    """
    import ray
    import torch

    ids = [str(i) for i in ray.get_gpu_ids()] if gpus_per_trial > 0 else []
    if ids:
        require_cuda(f"search.gpus_per_trial {gpus_per_trial} (Ray gave this trial GPU {','.join(ids)})")  # fmt: skip
    return ("cuda" if ids and torch.cuda.is_available() else "cpu"), ids


def runner_for(spec: TrialSpec) -> TrialRunner:
    if spec.key not in _RUNNERS:
        exp = SearchExperiment.model_validate_json(spec.experiment_json)
        pool = ExpertPool.model_validate_json(spec.pool_json)
        if _RUNNERS:  # one experiment per process at a time: free the previous experts
            import gc

            import torch

            _RUNNERS.clear()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        device, _ = trial_device(exp.search.gpus_per_trial)
        loader = None
        if spec.expert_store == "node":
            loader = node_loader(spec.store_key)
        _RUNNERS[spec.key] = TrialRunner(
            exp, pool, list(spec.include_path), device=device, loader=loader
        )
    return _RUNNERS[spec.key]


def run_config(config: dict, spec: TrialSpec) -> dict:
    """One trial from a Tune config: served from results, or decoded, composed and scored.

    Returns:
        the metrics dict reported to Tune (objective is NaN unless status is ok).
    """
    meta = config.get(META, {})
    served = meta.get("served")
    if served is not None:  # an identical recipe already evaluated (or being evaluated): no work
        return dict(served) if TWIN in served else served_result(served)
    params = {k: v for k, v in config.items() if k != META}
    check_here(list(spec.node_inputs))  # a node started after the driver's check: before loading
    runner = runner_for(spec)
    recipe = decode(params, runner.exp.space, spec.depth, runner.pool)
    res = runner.run(recipe, gates=meta.get("gates")).to_dict()
    # A pruned trial's objective is its screening (low-fidelity) value: reported under another
    # key so nothing downstream can mistake it for a final score.
    res["low_fidelity_objective"] = res["objective"] if res["status"] == "pruned" else None
    res["objective"] = res["objective"] if res["status"] == "ok" else math.nan
    res["t_setup_s"] = runner.t_setup_s
    res["gpu_ids"] = ",".join(trial_device(runner.exp.search.gpus_per_trial)[1])
    res["expert_store"] = spec.expert_store
    res["node_id"] = _node_id()
    return res


def served_result(row: dict) -> dict:
    """What a trial served from an earlier trial's row reports (status "duplicate", no work)."""
    out = dict(row)
    out["served_from"] = out.get("trial_id")
    out["status"] = "duplicate"
    out["source_status"] = row.get("status")
    # No work: it read no split (the source row's list, JSON in the table, is the source's).
    return out | {"t_compose_s": 0.0, "t_eval_s": 0.0, "t_total_s": 0.0, "splits_read": []}


def _node_id() -> str | None:
    """The Ray node this trial ran on (None outside Ray: run_config is also called directly)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def merge_trial(config: dict, spec: TrialSpec) -> None:
    """The Tune function trainable: one flat report per trial (Tune flattens nested dicts)."""
    from ray import tune

    try:
        res = run_config(config, spec)
    except NodePathError as e:  # a failed row, told to Optuna as FAIL; no Tune retry
        tune.report({"status": "failed", "error": str(e), NODE_PATHS_KEY: str(e), "objective": float("nan")})  # fmt: skip
        return
    report = flat_report(res)
    _jitter()
    tune.report(report)


def flat_report(res: dict) -> dict:
    """A trial's result as Tune reports it: flat, lists as JSON (what the searcher decodes)."""
    res = dict(res)
    res["objective"] = float("nan") if res.get("objective") is None else res["objective"]
    for i, v in enumerate(res.pop("objectives", None) or []):
        res[f"objective_{i}"] = v
    for task, v in (res.pop("proxies", None) or {}).items():
        res[f"proxy__{task}"] = v
    for key in ("splits_read", "rungs"):  # lists from the trial; a served row's are JSON already
        if not isinstance(res.get(key), str):
            res[key] = json.dumps(res.get(key) or [])
    return {k: v for k, v in res.items() if v is not None}


def _jitter() -> None:
    """Sleep LAYERSWAP_TRIAL_DELAY_S seconds, then up to LAYERSWAP_TRIAL_JITTER_S more
    (unseeded), before reporting.

    Debugging knobs: the jitter shuffles the order in which concurrent trials finish, which a
    reproducible search must not notice (tests/search/test_reproducible.py sets it); the delay
    keeps a tiny model's trials from all finishing between two looks of a test that must signal
    a search mid-way (tests/cli/test_interrupts.py sets it).
    """
    import os
    import random
    import time

    delay = float(os.environ.get("LAYERSWAP_TRIAL_DELAY_S") or 0)
    top = float(os.environ.get("LAYERSWAP_TRIAL_JITTER_S") or 0)
    if delay > 0 or top > 0:
        time.sleep(delay + (random.SystemRandom().uniform(0, top) if top > 0 else 0.0))
