"""The local files and folders an experiment's Ray workers read, as (config field, path) pairs.

One function per experiment kind (`train_inputs`, `search_inputs`); trainables/node_paths.py
checks each pair on every Ray node before trials or training workers start. Pure data: no Ray.
Hub ids and URIs (s3://, gs://, file://) are not local paths and are left out. Tests:
.venv/bin/python -m pytest -q tests/spaces/test_local_inputs.py
"""

from __future__ import annotations

from pathlib import Path

from layerswap.spaces.base import is_hub_id, is_uri
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool
from layerswap.spaces.train_experiment import TrainExperiment, world_dir


def is_local(ref: str | None) -> bool:
    """Whether `ref` names a local file or folder (not None, a URI or a Hub id)."""
    return isinstance(ref, str) and bool(ref) and not is_uri(ref) and not is_hub_id(ref)


def _local(pairs: list[tuple[str, str | None]]) -> list[tuple[str, str]]:
    """The pairs whose path is local, made absolute, each path once (its first field)."""
    out, seen = [], set()
    for field, ref in pairs:
        if is_local(ref):
            path = str(Path(ref).expanduser().absolute())
            if path not in seen:
                seen.add(path)
                out.append((field, path))
    return out


def train_inputs(exp: TrainExperiment) -> list[tuple[str, str]]:
    """What a training run's workers (and a sweep's trials) read: the base, each dataset file,
    and the embedded world whose tasks a sweep scores on.

    Args:
        exp: the validated experiment (relative paths resolved, e.g. by absolute_local_paths).
    Returns:
        [(field, absolute path)], e.g. ("datasets[0].path", "/data/math.jsonl").
    """
    pairs: list[tuple[str, str | None]] = [("base", exp.base)]
    for i, ds in enumerate(exp.datasets):
        pairs.append((f"datasets[{i}].path", ds.path))
        pairs += [(f"datasets[{i}].data_files[{j}]", f) for j, f in enumerate(ds.data_files or [])]
    if exp.sweep is not None:
        world = world_dir(exp)
        field = "sweep.world" if exp.sweep.world is not None else "base (its world)"
        pairs.append((field, None if world is None else str(world)))
    return _local(pairs)


def search_inputs(exp: SearchExperiment, pool: ExpertPool) -> list[tuple[str, str]]:
    """What a search's trials read: the base, every expert of the pool, the world (its task data)
    and each include_path folder of task YAMLs.

    Args:
        exp: the validated search experiment.
        pool: its resolved pool (search/pool.resolve_pool: explicit paths or registry picks).
    Returns:
        [(field, absolute path)], e.g. ("task_experts[0]", "/ckpt/math").
    """
    listed = exp.experts is None
    pairs: list[tuple[str, str | None]] = [
        ("base" if exp.base is not None or listed else "experts.registry (base)", pool.base)
    ]
    for side, refs in (("task", pool.task), ("language", pool.language)):
        for i, ref in enumerate(refs):
            field = f"{side}_experts[{i}]" if listed else f"experts.registry ({ref.expert_id})"
            pairs.append((field, ref.path))
    pairs.append(("world", exp.world))
    pairs += [(f"include_path[{i}]", p) for i, p in enumerate(exp.include_path)]
    return _local(pairs)
