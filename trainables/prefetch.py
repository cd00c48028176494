"""Download what a study needs into the local Hugging Face caches, once, before it starts:
model snapshots (safetensors, configs, tokenizers; never pickled weights), training datasets of
the source table, and lm-eval tasks' datasets. Called by `layerswap prefetch` (cli/prefetch.py)
on the driver; Ray workers that share the cache (cluster.yaml's EFS HF_HOME, or each node run
once) then read instead of racing to download. `uncached_dataset` is the same read from the cache
only: `layerswap train` refuses, before Ray starts, a training source its offline workers could
not read. Tests: tests/cli/test_prefetch.py, tests/cli/test_train_hub_sources.py
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from layerswap.trainables.evaluate.lm_eval_api import task_manager
from layerswap.trainables.model_files import MODEL_FILES, MODEL_SKIP
from layerswap.trainables.train.sources import load_sft


def fetch_model(repo_id: str) -> str:
    """Snapshot `repo_id` into the HF hub cache; returns its local folder."""
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id, allow_patterns=MODEL_FILES, ignore_patterns=MODEL_SKIP)


def fetch_dataset(source: str, language: str | None) -> int:
    """Download a training source's train split (the source table's Hub id, config and split,
    as training reads it) into the datasets cache; returns the records read back (a check)."""
    return len(load_sft(source, language=language, split="train", limit=1))


def fetch_tasks(tasks: list[str]) -> list[str]:
    """Build lm-eval's tasks, which downloads their datasets into the datasets cache; returns
    the task names built."""
    from lm_eval.tasks import get_task_dict

    return sorted(get_task_dict(list(tasks), task_manager(list(tasks))))


# datasets' own spelling of "on" (datasets.config.ENV_VARS_TRUE_VALUES).
_TRUE = ("1", "ON", "YES", "TRUE")


def datasets_offline(environ: dict[str, str] | None = None) -> bool:
    """Whether `datasets` reads from the cache only under `environ`, by datasets' own rule:
    HF_DATASETS_OFFLINE when set, else HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE). A Ray worker
    given the driver's variables (trainables/ray_session.worker_env) decides the same way.

    Args:
        environ: the environment to read (default os.environ).
    Returns:
        True when training's dataset reads may not download.
    """
    env = os.environ if environ is None else environ
    datasets_var = env.get("HF_DATASETS_OFFLINE")
    if datasets_var is not None:
        return datasets_var.upper() in _TRUE
    hub = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or ""
    return hub.upper() in _TRUE


@contextmanager
def _cache_only() -> Iterator[None]:
    """datasets and huggingface_hub offline for the block: both read their switch once, at
    import, so a process that imported them online (or before the sweep's offline default set
    the variables) would otherwise download where the check means to look only."""
    import datasets.config  # lazy: datasets takes seconds to import; only this check reads it
    import huggingface_hub.constants as hub

    old = datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = old


def uncached_dataset(source: str, language: str | None) -> str | None:
    """Why training could not read a source's train split from the local datasets cache, or
    None: `fetch_dataset`'s read (the trainer's, trainables/train/data.load_pairs), offline.

    Args:
        source: source-table name or Hub id.
        language: the dataset's language (None: the source's only one).
    Returns:
        datasets' reason (one line) when the split is not in the cache; None when it is.
    Raises:
        DataSourceError: the source cannot serve that language (as training would raise).
    """
    with _cache_only():
        try:
            load_sft(source, language=language, split="train", limit=1)
        except ConnectionError as e:  # datasets' offline refusal (OfflineModeIsEnabled is one)
            return str(e).splitlines()[0]
    return None
