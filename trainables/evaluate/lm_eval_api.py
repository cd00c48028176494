"""The lm-eval internals layerswap relies on, behind one small adapter (lm-eval pinned to 0.4.13).

The cached proxy evaluator mirrors lm-eval's HFLM and Task pipeline, so it needs a few things
lm-eval does not promise to keep: a Task's filter pipelines (`Task._filters`) and the task-dict
shape `get_task_dict` returns. They are reached only here; tests/trainables/evaluate/
test_lm_eval_api.py fails loudly, naming the version, when an lm-eval release changes them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

LM_EVAL_VERSION = "0.4.13"  # pinned in pyproject.toml; the proxy evaluator is tested against it


def offline_defaults() -> None:
    """Default to offline hub/datasets access (an explicit "0" from the user is kept).

    `datasets` and `huggingface_hub` read these once, at import, so every entry point that may
    import them calls this first; otherwise loading even a local JSON file reaches for the
    network. Not done at import time, so that importing this module (e.g. to build the CLI)
    does not switch other commands, such as merging from a hub id, offline.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def include_list(include_path: str | Path | list | tuple | None) -> list[str]:
    """An lm-eval `include_path` argument (one folder, several, or None) as a list of str."""
    if include_path is None:
        return []
    if isinstance(include_path, (list, tuple)):
        return [str(p) for p in include_path]
    return [str(include_path)]


def load_tasks(task_names: list[str], include_path: str | Path | list) -> dict[str, Any]:
    """lm-eval Task objects by leaf name from YAMLs under `include_path` (no default index).

    Groups are flattened: `get_task_dict` nests a group's tasks in dicts of their own.
    """
    offline_defaults()
    from lm_eval.tasks import TaskManager, get_task_dict

    tm = TaskManager(include_path=include_list(include_path), include_defaults=False)
    out: dict[str, Any] = {}
    stack = [get_task_dict(list(task_names), tm)]
    while stack:  # groups nest dicts of tasks
        for val in stack.pop().values():
            if isinstance(val, dict):
                stack.append(val)
            else:
                out[val.config.task] = val
    return out


def apply_filters(task: Any, instances: list) -> None:
    """Run the task's own filter pipelines over `instances` (what `Task.apply_filters` does to
    the task's whole instance list), filling each instance's `filtered_resps` by filter name."""
    for ensemble in task._filters:
        ensemble.apply(instances)
