"""Download what a study needs into the local Hugging Face caches, once, before it starts:
model snapshots (safetensors, configs, tokenizers; never pickled weights), training datasets of
the source table, and lm-eval tasks' datasets. Called by `layerswap prefetch` (cli/prefetch.py)
on the driver; Ray workers that share the cache (cluster.yaml's EFS HF_HOME, or each node run
once) then read instead of racing to download. Tests: tests/cli/test_prefetch.py
"""

from __future__ import annotations

from layerswap.trainables.evaluate.lm_eval_api import task_manager
from layerswap.trainables.train.sources import load_sft

# What a model snapshot needs to load: no *.bin / *.pt (pickles), no original/ consolidated
# checkpoints Meta ships beside the HF weights (another 16 GB of the same model).
MODEL_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.py"]
MODEL_SKIP = ["original/*", "*.bin", "*.pt", "*.pth", "*.pkl", "*.ckpt"]


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
