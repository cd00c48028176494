"""The lm-eval internals layerswap relies on, behind one small adapter (lm-eval pinned to 0.4.13).

The cached proxy evaluator mirrors lm-eval's HFLM and Task pipeline, so it needs a few things
lm-eval does not promise to keep: a Task's filter pipelines (`Task._filters`), the task-dict
shape `get_task_dict` returns, the task index's resolved configs (`task_index[name].cfg`) and
its tags' members (`tag_members`);
`lm_eval_output` and `request_bars_off`, which hide lm-eval's log and progress bars, need the
tqdm of `lm_eval.api.task` and HFLM's `disable_tqdm`; `quiet_git_probe` replaces the
`get_git_commit_hash` that `lm_eval.evaluator` imported. They are reached only here;
tests/trainables/evaluate/test_lm_eval_api.py fails loudly, naming the version, when an lm-eval
release changes them.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
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


@contextmanager
def offline_hint(tasks: list[str]) -> Iterator[None]:
    """A task whose dataset is not in the local cache, under layerswap's offline default
    (`offline_defaults`), says how to get it: datasets only says it "Couldn't reach" the Hub."""
    try:
        yield
    except Exception as e:
        if "OfflineModeIsEnabled" not in f"{type(e).__name__}: {e}":
            raise
        raise ValueError(
            f"{e}: a dataset of {', '.join(tasks)} is not in the local Hugging Face cache, and "
            "layerswap runs offline by default; download it first with `layerswap prefetch "
            "CONFIG`, or allow downloads with HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0"
        ) from None


def uncached_tasks(task_names: list[str], include_path: str | Path | list | None = None, manager=None) -> dict[str, str]:  # fmt: skip
    """The tasks whose data cannot be read here, offline: each task is built as lm-eval builds it
    (its dataset read from the local Hugging Face cache) before any model loads, so a run that
    would fail at its first evaluation (or at promotion, hours into a search) fails in seconds.

    Nothing is checked when downloads are allowed (HF_DATASETS_OFFLINE=0 or HF_HUB_OFFLINE=0):
    the run may then fetch what it needs.

    Args:
        task_names: lm-eval task names (world tasks, include_path tasks or built-ins).
        include_path: folders of task YAMLs, as for `task_manager`.
        manager: a `task_manager` already built that knows every task (None: one is built):
            indexing lm-eval's built-ins costs seconds, once per caller.
    Returns:
        {task: why} for each task whose data is not in the local cache ({} when all are).
    Raises:
        ValueError: naming the tasks neither `include_path` nor lm-eval knows.
    """
    offline_defaults()
    import datasets.config
    from lm_eval.tasks import get_task_dict

    if not datasets.config.HF_HUB_OFFLINE:
        return {}
    lm_eval_output(verbose=False)  # a check, not a run: lm-eval's "Selected tasks" log stays out
    tm = manager if manager is not None else task_manager(list(task_names), include_path)
    missing: dict[str, str] = {}
    for name in dict.fromkeys(task_names):  # one by one: the message names each missing task
        try:
            get_task_dict([name], tm)
        except Exception as e:  # datasets wraps the offline refusal in several error types
            if "OfflineModeIsEnabled" not in f"{type(e).__name__}: {e}":
                raise
            missing[name] = str(e)
    return missing


def uncached_message(missing: dict[str, str], command: str | None = None) -> str:
    """One line for `uncached_tasks`' result: the tasks, and how to get their data.

    Args:
        missing: `uncached_tasks`' result.
        command: "eval" for `layerswap eval`, which has no config for `layerswap prefetch`
            (that takes study, training or search YAMLs): it is told to run online instead.
    Returns:
        the message.
    """
    online = "HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0"
    if command == "eval":
        how = f"run it online to download the data: {online} layerswap eval ..."
    else:
        how = (
            "download it first with `layerswap prefetch CONFIG` (the study, training or search "
            f"YAML), or allow downloads with {online}"
        )
    return (
        f"task data not in the local Hugging Face cache: {', '.join(missing)} "
        f"({'; '.join(dict.fromkeys(missing.values()))}); layerswap runs offline by default: {how}"
    )


def include_list(include_path: str | Path | list | tuple | None) -> list[str]:
    """An lm-eval `include_path` argument (one folder, several, or None) as a list of str."""
    if include_path is None:
        return []
    if isinstance(include_path, (list, tuple)):
        return [str(p) for p in include_path]
    return [str(include_path)]


def task_manager(tasks: list[str], include_path: str | Path | list | None = None):
    """An lm-eval TaskManager that knows every name in `tasks`, indexing built-ins only if needed.

    Indexing lm-eval's ~10k built-in YAMLs costs seconds, so world-only runs index just
    `include_path`; their `include:` lines are absolute file paths and resolve either way.

    Raises:
        ValueError: naming the tasks neither the include path nor lm-eval knows.
    """
    offline_defaults()
    from lm_eval.tasks import TaskManager

    paths = include_list(include_path)
    for p in paths:
        if not Path(p).is_dir():
            raise ValueError(f"task include path {p} is not a folder")
    if paths:
        tm = TaskManager(include_path=paths, include_defaults=False)
        if all(t in tm.all_tasks for t in tasks):
            return tm
    tm = TaskManager(include_path=paths or None, include_defaults=True)
    unknown = [t for t in tasks if t not in tm.all_tasks]
    if unknown:
        where = f" or in {', '.join(paths)}" if paths else ""
        raise ValueError(
            f"unknown lm-eval task(s) {', '.join(unknown)}: not built into lm_eval{where} "
            f"(world tasks need --world DIR)"
        )
    return tm


def load_tasks(task_names: list[str], include_path: str | Path | list) -> dict[str, Any]:
    """lm-eval Task objects by leaf name from YAMLs under `include_path`, and lm-eval's built-in
    tasks only when a name is not found there (indexing them costs seconds).

    Groups are flattened: `get_task_dict` nests a group's tasks in dicts of their own.
    """
    offline_defaults()
    from lm_eval.tasks import get_task_dict

    tm = task_manager(list(task_names), include_path)
    out: dict[str, Any] = {}
    stack = [get_task_dict(list(task_names), tm)]
    while stack:  # groups nest dicts of tasks
        for val in stack.pop().values():
            if isinstance(val, dict):
                stack.append(val)
            else:
                out[val.config.task] = val
    return out


def task_index(task_names: list[str], include_path: str | Path | list) -> dict[str, Any]:
    """lm-eval's task index (name -> Entry: kind, resolved config, tags) knowing every name in
    `task_names`, built from configs alone (no data); built-ins indexed only if needed.

    Raises:
        ValueError: naming the tasks neither `include_path` nor lm-eval knows.
    """
    return task_manager(list(task_names), include_path).task_index


def task_configs(task_names: list[str], include_path: str | Path | list) -> dict[str, dict | None]:
    """Each single task's config as lm-eval resolves it (its `include:`s merged), without
    loading any data: `TaskManager.task_index[name].cfg`. None for a group or a tag (their
    leaves are configured apart).

    Raises:
        ValueError: naming the tasks neither `include_path` nor lm-eval knows.
    """
    return single_configs(task_index(task_names, include_path), task_names)


def single_configs(index: dict[str, Any], task_names: list[str]) -> dict[str, dict | None]:
    """`task_configs` from a task index already built (`task_index`): one index, several reads."""
    from lm_eval.tasks._index import Kind  # lazy: lm-eval's import takes seconds; callers hold one

    single = (Kind.TASK, Kind.PY_TASK)
    return {n: index[n].cfg if index[n].kind in single else None for n in task_names}


def tag_members(index: dict[str, Any]) -> dict[str, list[str]]:
    """{tag: member names} of an lm-eval task index (a tag entry's `tags` are its members)."""
    from lm_eval.tasks._index import Kind  # lazy: as in single_configs

    return {name: sorted(e.tags) for name, e in index.items() if e.kind == Kind.TAG}


def apply_filters(task: Any, instances: list) -> None:
    """Run the task's own filter pipelines over `instances` (what `Task.apply_filters` does to
    the task's whole instance list), filling each instance's `filtered_resps` by filter name."""
    for ensemble in task._filters:
        ensemble.apply(instances)


REQUEST_METHODS = ("loglikelihood", "loglikelihood_rolling", "generate_until")


def lm_eval_output(verbose: bool) -> None:
    """Show or hide lm-eval's log and its per-document task bar, and keep its git probe quiet:
    the one place lm-eval's output is set.

    Call it before lm-eval runs (task indexing and HFLM's constructor already log). lm-eval's
    logger gets INFO through lm-eval's own handler (`setup_logging`, which honours
    LMEVAL_LOG_LEVEL) when verbose, else errors only (its in-memory-model and gen_kwargs
    warnings repeat for every evaluated model). The bar of `Task.build_all_requests` has no
    switch at all: the tqdm that `lm_eval.api.task` imported is swapped for a disabled one, and
    back when verbose. simple_evaluate's own `verbosity` is deprecated and only sets the level.

    Args:
        verbose: lm-eval's INFO log and bars on (as its own CLI shows them), else off.
    """
    import lm_eval.api.task as task_module
    from tqdm import tqdm

    quiet_git_probe()  # git's "fatal: not a git repository" is noise, verbose or not
    if verbose:
        from lm_eval.utils import setup_logging

        setup_logging(logging.INFO)
        task_module.tqdm = tqdm
    else:
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
        task_module.tqdm = partial(tqdm, disable=True)


def request_bars_off(lm: Any) -> None:
    """Turn off `lm`'s per-request bars ("Running loglikelihood requests", "Running
    generate_until requests", "Tokenizing inputs"), on this instance only.

    Its request methods take `disable_tqdm`, which lm-eval's evaluator never passes; it is bound
    here (methods without it are left alone).

    Args:
        lm: an lm-eval model (an HFLM), before it is handed to simple_evaluate.
    """
    import inspect

    for name in REQUEST_METHODS:
        method = getattr(lm, name, None)
        if method is not None and "disable_tqdm" in inspect.signature(method).parameters:
            setattr(lm, name, partial(method, disable_tqdm=True))


def quiet_git_probe() -> None:
    """Keep lm-eval's git probe off stderr; the hash it records is unchanged.

    `simple_evaluate` records the git commit of the working directory by running `git describe
    --always` with git's stderr inherited, so outside a git checkout every evaluated model printed
    "fatal: not a git repository". The same probe with git's stderr discarded (mirroring lm-eval
    0.4.13's `loggers.utils.get_git_commit_hash`, fallback included) takes the place of the name
    `lm_eval.evaluator` imported; idempotent.
    """
    import lm_eval.evaluator as evaluator
    from lm_eval.loggers.utils import get_commit_from_path

    current = evaluator.get_git_commit_hash
    original = getattr(current, "lm_eval_original", current)  # kept, for tests and undoing

    def get_git_commit_hash() -> str | None:
        try:
            out = subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL)  # fmt: skip
            return out.strip().decode()
        except (subprocess.CalledProcessError, FileNotFoundError):
            return get_commit_from_path(os.getcwd())  # as lm-eval: None outside git

    get_git_commit_hash.lm_eval_original = original
    evaluator.get_git_commit_hash = get_git_commit_hash
