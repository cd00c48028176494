"""The search's data check, after its preflight and before Ray starts: the tasks the search and its
promotion evaluate must be readable offline (layerswap's default), so missing data fails the
command in seconds, not at the first trial or at promotion hours later, beside any refusal of the
task configs themselves (a proxy reading the target's test split), so data is not fetched for a
config that would be refused anyway. The proxies (dev splits) are built as lm-eval builds them;
promotion's test-split tasks are checked from their configs and the dataset's declared splits only
(`datasets.load_dataset_builder`: a local file's existence, a cached Hub dataset's
dataset_info.json), never a row of a test split opened: the search never opens one
(docs/guarantees.md). Unlike search/preflight.py it loads lm-eval (~1.5 s, ~12 s more when a
built-in task makes it index lm-eval's own task YAMLs: twice when both the proxies and promotion's
tasks are built-ins, one index each), so the CLI runs it last.

Tests: .venv/bin/python -m pytest -q tests/search/test_preflight_data.py tests/search/test_split_audit.py
"""

from __future__ import annotations

import inspect
import tempfile
from pathlib import Path

from layerswap.search.promote import promotion_tasks
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.trainables.evaluate.lm_eval_api import (
    offline_defaults,
    task_index,
    task_manager,
    uncached_message,
    uncached_tasks,
)
from layerswap.trainables.evaluate.task_data import fewshot_source, leaf_configs, scored_split
from layerswap.trainables.evaluate.tasks import write_world_tasks


def searched_tasks(exp: SearchExperiment, promote: bool) -> list[str]:
    """The tasks a search reads: its proxies (dev splits), and with promotion also their
    held-out splits and the target task (search.promote.promotion_tasks)."""
    if promote:
        return promotion_tasks(exp)
    return [p.task for p in exp.proxy_list]


def uncached_problem(exp: SearchExperiment, promote: bool = True) -> str | None:
    """Why the search would fail for task data it cannot read offline, or None. When data is
    missing, the task configs' own refusal (a proxy reading the target's test split, a proxy's
    scale against its metric: search/trial.py check_proxy_scales, which the search runs once the
    data is there) is said first: downloading data for a config refused anyway wastes the time.

    Args:
        exp: the validated search experiment (its world and include_path already checked).
        promote: the promotion runs too (its held-out and target tasks are checked, by their
            declared splits: `split_data_problems`).
    Returns:
        one line naming each task whose data is not in the local cache, and how to get it, and a
        line for each promotion task whose split is missing; the config's refusal on a line
        before them, if it has one.
    Raises:
        ValueError: naming the tasks neither the world, include_path nor lm-eval knows.
    """
    proxies = [p.task for p in exp.proxy_list]
    held_out = [t for t in searched_tasks(exp, promote) if t not in proxies]
    with tempfile.TemporaryDirectory(prefix="layerswap-tasks-") as tmp:
        paths = [str(p) for p in exp.include_path]
        if exp.world is not None:
            write_world_tasks(Path(exp.world), Path(tmp))
            paths.insert(0, tmp)
        # One index of every task for both checks: lm-eval's built-ins take seconds to index.
        tm = task_manager([*proxies, *held_out], paths or None)
        missing = uncached_tasks(proxies, manager=tm)  # dev splits: built as lm-eval builds them
        lines = split_data_problems(held_out, paths, missing, tm.task_index) if held_out else []
    if missing:  # in the order the search reads them: target, held-out splits, proxies
        order = {t: i for i, t in enumerate(searched_tasks(exp, promote))}
        missing = dict(sorted(missing.items(), key=lambda kv: order.get(kv[0], len(order))))
        lines.insert(0, uncached_message(missing))
    if not lines:
        return None  # the search's own check_proxy_scales runs next, before anything is written
    refused = _config_problem(exp)
    return "\n  ".join(lines if refused is None else [refused, *lines])


def split_data_problems(tasks: list[str], include_path: list[str], missing: dict[str, str], index: dict | None = None) -> list[str]:  # fmt: skip
    """Check that each task's data is there without reading any row of it: each single task of
    `tasks` (a group's or tag's members too) must name a dataset `datasets` resolves offline (a
    local data file that exists; a Hub dataset in the local cache) that declares the split the
    task scores and the one its few-shot examples come from. A task without a `dataset_path` (a
    Python-class task) is left unchecked: only building it would tell.

    Nothing is checked when downloads are allowed (HF_DATASETS_OFFLINE=0 or HF_HUB_OFFLINE=0):
    the run may then fetch what it needs.

    Args:
        tasks: lm-eval task, group or tag names (promotion's test-split tasks).
        include_path: folders of task YAMLs (the world's scratch copy first).
        missing: {task: why} to add each task whose dataset is not in the local cache to.
        index: lm-eval's task index knowing every task (None: built from include_path).
    Returns:
        one line for each task whose data file is missing or whose dataset lacks a split.
    Raises:
        ValueError: naming the tasks neither `include_path` nor lm-eval knows.
    """
    if index is None:
        index = task_index(tasks, include_path)
    offline_defaults()
    # lazy: datasets reads HF_HUB_OFFLINE once, at import: after layerswap's offline default
    import datasets

    if not datasets.config.HF_HUB_OFFLINE:
        return []
    lines: list[str] = []
    for name in dict.fromkeys(tasks):
        for leaf, cfg in leaf_configs(name, index):
            if not cfg.get("dataset_path"):
                continue
            try:
                builder = datasets.load_dataset_builder(
                    cfg["dataset_path"],
                    cfg.get("dataset_name"),
                    **_builder_kwargs(cfg.get("dataset_kwargs") or {}),
                )
            except FileNotFoundError as e:  # a local data file the config names is not there
                lines.append(f"task {leaf!r}: {e}")
                continue
            except Exception as e:  # datasets says "not cached" in several error types
                said = f"{type(e).__name__}: {e}"
                if "OfflineModeIsEnabled" not in said and "Couldn't find cache" not in said:
                    raise
                missing.setdefault(name, str(e).splitlines()[0])
                continue
            files = builder.config.data_files
            declared = set(files) if files else set(builder.info.splits or ())
            scored, shots = scored_split(cfg), fewshot_source(cfg)
            reads = [("scores", scored)]
            if shots is not None and (scored is None or shots.split != scored.split):
                reads.append(("draws few-shot examples from", shots))
            for how, split in reads:
                if split is not None and declared and split.split not in declared:
                    of = split.dataset + (f" {split.name}" if split.name else "")
                    lines.append(
                        f"task {leaf!r} {how} split {split.split!r}, which dataset_path {of} does "
                        f"not have (it has: {', '.join(sorted(declared))})"
                    )
    return lines


def _builder_kwargs(kwargs: dict) -> dict:
    """A task's `dataset_kwargs` (what lm-eval passes to `datasets.load_dataset`) without those
    only `load_dataset` takes (verification_mode, num_proc, ...): `load_dataset_builder` would
    take them for builder-config fields and raise."""
    import datasets  # lazy: imported by the caller already, after the offline default

    load = inspect.signature(datasets.load_dataset).parameters
    builder = inspect.signature(datasets.load_dataset_builder).parameters
    return {k: v for k, v in kwargs.items() if k not in load or k in builder}


def _config_problem(exp: SearchExperiment) -> str | None:
    """check_proxy_scales' refusal of `exp` (task configs only, no data), or None. Run only once
    data is missing, so the happy path indexes lm-eval's tasks once, in the search."""
    # lazy: search/trial.py imports torch (3.0 s measured), needed here only when the data check failed
    from layerswap.search.trial import check_proxy_scales

    try:
        check_proxy_scales(exp)
    except ValueError as e:
        return str(e)
    return None
