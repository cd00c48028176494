"""The data an lm-eval task reads, from its resolved config alone (no dataset opened), and the
dev-only data rule on it: no proxy may read the target's test data under another task name.

The name rule (spaces/task_families.py `held_out_reason`) refuses the target itself and world test
splits; a built-in task has no split in its name, so `mgsm_native_cot_sw` passed for target
`mgsm_direct_sw` although both score juletxara/mgsm `sw`, split `test`. `require_own_data` compares
what the tasks read. The search driver calls it before anything is written
(search/trial.py `check_proxy_scales`). Tests: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_task_data.py
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DataSplit:
    """One split of one dataset as a task config names it.

    dataset: `dataset_path` (a Hub id, or a loader such as "json"); name: `dataset_name`;
    split: the split's name; files: the split's `dataset_kwargs.data_files` (a json/csv task such
    as the embedded world's: the file is the data, the split's name only a label).
    """

    dataset: str
    name: str | None
    split: str
    files: tuple[str, ...] = ()

    @property
    def key(self) -> tuple:
        """What makes two splits the same data: the files when named, else dataset+name+split."""
        if self.files:
            return (self.dataset, self.name, self.files)
        return (self.dataset, self.name, self.split)

    def __str__(self) -> str:
        where = f"files {', '.join(self.files)}" if self.files else f"split {self.split}"
        return f"dataset_path {self.dataset}, dataset_name {self.name}, {where}"


def split_of(cfg: Mapping[str, Any], split: str | None) -> DataSplit | None:
    """The DataSplit `cfg` reads as `split` (None: no such split, or a config without a
    dataset_path, such as a Python task's)."""
    dataset = cfg.get("dataset_path")
    if split is None or not dataset:
        return None
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, Mapping):  # {split: file or files}; a str or list is lm-eval's "train"
        files = files.get(split)
    elif split != "train":
        files = None
    files = (files,) if isinstance(files, str) else tuple(map(str, files or ()))
    return DataSplit(str(dataset), cfg.get("dataset_name"), str(split), files)


def scored_split(cfg: Mapping[str, Any]) -> DataSplit | None:
    """The split lm-eval scores: test_split, else validation_split."""
    return split_of(cfg, cfg.get("test_split") or cfg.get("validation_split"))


def fewshot_source(cfg: Mapping[str, Any]) -> DataSplit | None:
    """The split lm-eval draws few-shot examples from: fewshot_split, else training_split, else
    validation_split, else test_split (lm-eval 0.4.13 ConfigurableTask.fewshot_docs)."""
    for key in ("fewshot_split", "training_split", "validation_split", "test_split"):
        if cfg.get(key):
            return split_of(cfg, cfg[key])
    return None


def leaf_configs(name: str, index: Mapping[str, Any]) -> list[tuple[str, dict]]:
    """(task name, config) of each single task `name` runs: itself, or a group's or a tag's
    members, nested groups and inline entries included, as lm-eval builds them (config only).

    Args:
        name: a task, group or tag name.
        index: lm-eval's task index (`lm_eval_api.task_index`): name -> Entry(kind, cfg, tags).
    Returns:
        the leaves in order; a name the index does not know gives none.
    """
    out: list[tuple[str, dict]] = []

    def walk(item: str | Mapping, overrides: Mapping, seen: frozenset) -> None:
        if isinstance(item, Mapping):  # an inline group, or a task with overrides
            ref = item.get("group", item.get("task"))
            if "group" in item and ref not in index:
                sub = {k: v for k, v in item.items() if k not in ("group", "task")}
                for child in item.get("task") or []:
                    walk(child, {**overrides, **sub}, seen)
                return
            more = {k: v for k, v in item.items() if k not in ("group", "task")}
            if ref not in index:  # an inline task: its own config
                out.append((str(ref), {**overrides, **more, "task": ref}))
                return
            walk(ref, {**overrides, **more}, seen)
            return
        entry = index.get(item)
        if entry is None or item in seen:
            return
        seen |= {item}
        kind = entry.kind.name
        if kind == "TAG":
            for member in sorted(entry.tags):
                walk(member, overrides, seen)
        elif kind == "GROUP":
            cfg = entry.cfg or {}
            sub = {k: v for k, v in cfg.items() if k not in _GROUP_KEYS}
            for child in cfg.get("task") or []:
                walk(child, {**sub, **overrides}, seen)
        else:
            out.append((item, {**(entry.cfg or {}), **overrides}))

    walk(name, {}, frozenset())
    return out


# A group config's own keys (lm-eval's GroupConfig); the rest are overrides for its members.
_GROUP_KEYS = {"group", "group_alias", "task", "tag", "aggregate_metric_list", "metadata"}


def shared_test_data(task: str, target: str, index: Mapping[str, Any]) -> str | None:
    """How `task` reads the target's test data, or None when it reads none of it.

    The target's test data: the split each of its tasks scores (a group's members all count).
    `task` reads the split it scores and the one its few-shot examples come from.

    Args:
        task: a proxy task name.
        target: the search's target task (a task, group or tag).
        index: lm-eval's task index (`lm_eval_api.task_index`) knowing both.
    Returns:
        e.g. "scores dataset_path juletxara/mgsm, dataset_name sw, split test, the test split
        of target 'mgsm_direct_sw'", or None.
    """
    test = {}
    for leaf, cfg in leaf_configs(target, index):
        if (s := scored_split(cfg)) is not None:
            test.setdefault(s.key, (leaf, s))
    for _, cfg in leaf_configs(task, index):
        for how, s in (("scores", scored_split(cfg)), ("draws few-shot examples from", fewshot_source(cfg))):  # fmt: skip
            if s is not None and s.key in test:
                leaf, ts = test[s.key]
                of = "" if leaf == target else f" ({leaf!r} in it)"
                return f"{how} {ts}, the test split of target {target!r}{of}"
    return None


def require_own_data(tasks: list[tuple[str, str]], target: str, index: Mapping[str, Any]) -> None:
    """Refuse a task that reads the target's test data (`shared_test_data`), by field.

    English MGSM as a proxy for another language's MGSM is allowed: the same problems, but another
    dataset_name (the papers' merging indicator); only the target's own data is refused.

    Args:
        tasks: (field, task name) pairs, e.g. ("proxies[0].task", "mgsm_native_cot_sw").
        target: the search's target task.
        index: lm-eval's task index knowing every name (`lm_eval_api.task_index`).
    Raises:
        ValueError naming the field, the task, the target and the shared dataset split.
    """
    for where, task in tasks:
        if (how := shared_test_data(task, target, index)) is not None:
            raise ValueError(
                f"{where} {task!r} {how}: the target's test set never guides the search; use a "
                "validation (dev) split of another dataset or subset"
            )
