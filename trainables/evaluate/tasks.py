"""lm-eval task plumbing: world task YAMLs over lm-eval's built-in configs, and task lookup.

Used by trainables.evaluate.harness (`layerswap eval --world DIR`); `write_world_tasks(W)` writes W/tasks.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from layerswap.spaces.task_families import TaskFamily, split_task, world_families
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.evaluate.lm_eval_api import uncached_message, uncached_tasks


def lm_eval_tasks_dir() -> Path:
    """The installed lm_eval package's built-in task folder."""
    import importlib.util

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or spec.origin is None:
        raise ValueError("lm_eval is not installed (pip install lm-eval)")
    return Path(spec.origin).parent / "tasks"


def _task_yaml(base: Path, name: str, tag: str, files: dict[str, Path], split: str) -> dict:
    """One world task: the built-in config `base` with only the data source replaced."""
    cfg: dict[str, Any] = {
        "include": str(base),
        "task": name,
        # Replaces the inherited tag (mgsm's is `mgsm_direct`): world tasks must never run
        # under a built-in tag name.
        "tag": [tag],
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {s: str(p) for s, p in files.items()}},
        "test_split": split,
    }
    return cfg


def write_world_tasks(world_dir: Path, tasks_dir: Path | None = None) -> list[str]:
    """Write lm-eval task YAMLs for a world's evaluation files, one family at a time.

    Each world task family (spaces.task_families: MGSM, Belebele) and language gets a dev and a
    test task per world stem (`world_mgsm_direct_{code}_dev`, `world_mgsm_direct_{code}`,
    `world_belebele_{code}[_dev]`, and Belebele's Brier-scored twin
    `world_belebele_brier_{code}[_dev]`); each `include:`s the family's lm-eval built-in config
    (the synthetic languages use its English prompts: mgsm_direct_en, belebele_eng_Latn) and
    overrides only the data source (and a stem's metric list, lm-eval's own metrics), so
    prompts, filters and metrics are lm-eval's. Tags `{stem}[_dev]` (world_mgsm_direct_dev, ...)
    run all languages. A dev task reads only the dev file (plus, for a family whose few-shot
    examples come from train, its train file), never the test file.

    Args:
        world_dir: the world folder W with each family's W/data/{family}/{code}/{split}.jsonl.
        tasks_dir: where to write the YAMLs (default W/tasks); stale world_*.yaml are removed.
    Returns:
        The task names written, sorted.
    Raises:
        ValueError: no evaluation data, or lm-eval's built-in config of a family is missing.
    """
    import yaml

    world_dir = Path(world_dir).resolve()
    tasks_dir = Path(tasks_dir) if tasks_dir is not None else world_dir / "tasks"
    builtin = lm_eval_tasks_dir()
    configs: dict[str, dict] = {}
    for fam in world_families():
        base = builtin / fam.lm_eval_base
        if not base.is_file():
            raise ValueError(f"lm-eval built-in task config {base} not found (lm_eval changed?)")
        configs |= _family_configs(world_dir, fam, base)
    if not configs:
        expected = " or ".join(f.data_file("CODE", "test") for f in world_families())
        raise ValueError(f"{world_dir}: no world evaluation data (expected {expected})")
    # No data file is opened here: the search writes these YAMLs and must never open a test
    # split. A damaged world is caught by its sha256 values (world.build.verify_world).
    tasks_dir.mkdir(parents=True, exist_ok=True)
    for old in tasks_dir.glob("world_*.yaml"):
        if old.stem not in configs:
            old.unlink()
    for name, cfg in configs.items():
        atomic_write_text(tasks_dir / f"{name}.yaml", yaml.safe_dump(cfg, sort_keys=False))
    return sorted(configs)


def _family_configs(world_dir: Path, fam: TaskFamily, base: Path) -> dict[str, dict]:
    """Each of the family's world stems + _{code}[_dev] over W/data/{family}/{code}/."""
    configs = {}
    for code_dir in sorted((world_dir / fam.data_folder).glob("*/")):
        code = code_dir.name
        train = world_dir / fam.data_file(code, "train")
        for split in ("dev", "test"):
            data = world_dir / fam.data_file(code, split)
            if not data.is_file():
                continue
            for stem, metrics in fam.world_stems.items():
                name = fam.world_task(code, split, stem)
                if fam.fewshot == "train":
                    # train first: `datasets` fixes the column types from the first split it
                    # reads, and only MGSM's train has string answers (null elsewhere; null
                    # casts to string, not back).
                    files = {"train": train} if train.is_file() else {}
                    files[split] = data
                    cfg = _task_yaml(base, name, split_task(stem, split), files, split)
                    # Few-shot examples from the 8-item train split, as in the real MGSM.
                    cfg["training_split"] = "train" if train.is_file() else None
                else:
                    cfg = _task_yaml(base, name, split_task(stem, split), {split: data}, split)
                    # Built-in Belebele draws few-shot examples from its only split; a dev task
                    # must draw them from dev, so the test set never shapes a dev score.
                    cfg["fewshot_split"] = split
                if metrics is not None:
                    cfg["metric_list"] = metrics
                configs[name] = cfg
    return configs


def task_data_problem(
    tasks: list[str], world: Path | None, include_path: list[str], command: str | None = None
) -> str | None:
    """Why evaluating `tasks` would fail for data missing from the local cache, or None: each
    task is built as lm-eval builds it (lm_eval_api.uncached_tasks), world tasks from a scratch
    copy of the world's YAMLs (the run writes its own), before any model loads or run starts.

    Args:
        tasks: the task names a run will evaluate.
        world: the embedded world whose tasks are among them, or None.
        include_path: further folders of task YAMLs.
        command: the asking command, for the advice (`uncached_message`).
    Returns:
        one line naming each task whose data is not in the local cache and how to get it.
    """
    with tempfile.TemporaryDirectory(prefix="layerswap-tasks-") as tmp:
        paths = [str(p) for p in include_path]
        if world is not None:
            write_world_tasks(Path(world), Path(tmp))
            paths.insert(0, tmp)
        missing = uncached_tasks(tasks, paths or None)
    return uncached_message(missing, command) if missing else None
