"""What kind of expert a checkpoint folder is: a PEFT LoRA adapter or full weights. No torch.

The one rule the search's pool (explicit paths and registry rows alike), its preflight and the
merge engine type experts by. Tests: .venv/bin/python -m pytest -q tests/search/test_pool_kinds.py
"""

from __future__ import annotations

import json
from pathlib import Path

from layerswap.trainables.storage import join, read_text

CONFIG = "adapter_config.json"  # PEFT's adapter config, next to adapter_model.safetensors


def is_lora_adapter(path: str | Path) -> bool:
    """Whether `path` (a folder or URI) is a PEFT LoRA adapter (adapter_config.json with
    peft_type LORA).

    Args:
        path: the checkpoint folder or URI.
    Returns:
        True for an adapter; False when there is no adapter_config.json (or no such folder).
    Raises:
        OSError: any other failure to read it (an S3 credentials or network error, a local
            permission error): typing a LoRA adapter "full" on a bad read would merge it wrong.
    """
    try:
        text = read_text(join(path, CONFIG))
    # Only "not there" means "not an adapter" (StorageNotFoundError is a FileNotFoundError; a
    # path that is a file gives NotADirectoryError); StorageError is an OSError too, so no broader.
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        return json.loads(text).get("peft_type") == "LORA"
    except (ValueError, AttributeError):  # not JSON, or not an object: not PEFT's config
        return False


def expert_kind(path: str | Path, mode: str | None = None) -> str:
    """The expert format the search records for a checkpoint.

    Args:
        path: the checkpoint folder (or URI).
        mode: its training mode from the expert registry, when it came from there (partial,
            simultaneous and mix runs may write adapters too, so the folder is asked as well).
    Returns:
        "lora" for a LoRA run or an adapter folder, else "full".
    """
    return "lora" if mode == "lora" or is_lora_adapter(path) else "full"
