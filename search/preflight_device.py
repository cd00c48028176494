"""Preflight for `layerswap search`: a pool too large for the CPU it would run on, refused before Ray
starts (the rule is trainables/devices.check_cpu_size's; this only applies it early).

The trials and promotion check the size themselves, but only once a model is built: an 8B search
with `promote.device: auto` on a driver without CUDA ran all its trials and was refused at
promotion; with `search.gpus_per_trial: 0` every trial loaded every expert and then failed.
Here the pool's parameters are counted from config.json alone (on the meta device, no weights).
Tests: .venv/bin/python -m pytest -q tests/search/test_preflight_device.py
"""

from __future__ import annotations

from layerswap.search.pool import resolve_pool
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.trainables.devices import DeviceUnusable, check_cpu_size, config_params
from layerswap.trainables.merge.generation import side_dir


def cpu_size_problems(exp: SearchExperiment, promote_device: str | None) -> list[str]:
    """The CPU-size refusals the trials and promotion would raise, as preflight lines.

    Args:
        exp: the validated search experiment.
        promote_device: promotion's resolved device (devices.resolve_device of promote.device);
            None when there is no promotion or its device was refused already.
    Returns:
        one line per refusal (trials on the CPU: search.gpus_per_trial 0; promotion on the CPU);
        [] when neither runs on the CPU, the CPU is allowed, or the pool's config cannot be read
        here (its folders' problems are preflight's; a trial or promotion still checks the size).
    """
    runs = []
    if exp.search.gpus_per_trial == 0:  # a trial that Ray gives no GPU runs on the CPU
        runs.append(("cpu", "search.gpus_per_trial 0: each search trial"))
    if promote_device is not None:
        runs.append((promote_device, f"promote.device {exp.promote.device} ({promote_device} here): promotion"))  # fmt: skip
    if not runs:
        return []
    counted = _pool_params(exp)
    if counted is None:
        return []
    ref, n_params = counted
    problems = []
    for device, what in runs:
        try:
            check_cpu_size(n_params, device, f"{what} of {ref}")
        except DeviceUnusable as e:
            problems.append(str(e))
    return problems


def _pool_params(exp: SearchExperiment) -> tuple[str, int] | None:
    """(the model whose config the search builds from, its parameter count), or None when its
    config.json cannot be found or read without the network."""
    # lazy: transformers (~2 s); only a search command that passed its light checks reads it
    from transformers import AutoConfig

    try:
        pool = resolve_pool(exp)
    except (ValueError, OSError):  # a broken registry: preflight names it
        return None
    # The config trainables/merge/live.LiveModel builds from: the first full task expert's, else
    # the base's (LoRA experts).
    like = next((r.path for r in pool.task if r.kind == "full"), pool.base)
    for ref in dict.fromkeys(r for r in (like, pool.base) if r is not None):
        folder = side_dir(ref, "config.json")
        if folder is None:
            continue
        try:
            return ref, config_params(AutoConfig.from_pretrained(folder))
        except (ValueError, OSError, KeyError):  # unreadable or unknown: preflight names it
            return None
    return None
