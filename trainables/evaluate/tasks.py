"""lm-eval task plumbing: world task YAMLs over lm-eval's built-in configs, and task lookup.

Used by trainables.evaluate.harness (`layerswap eval --world DIR`); `write_world_tasks(W)` writes W/tasks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.evaluate.lm_eval_api import include_list, offline_defaults

# Built-in lm-eval configs the world tasks include; the synthetic languages use English prompts.
MGSM_BASE = "mgsm/direct/mgsm_direct_en.yaml"
BELEBELE_BASE = "belebele/belebele_eng_Latn.yaml"
# world_belebele_brier_*: reported by brier_score (the first metric), accuracy beside it.
BRIER_METRICS = [
    {"metric": "brier_score", "aggregation": "brier_score", "higher_is_better": False},
    {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
]


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
    """Write lm-eval task YAMLs for a world's MGSM and Belebele files.

    Each set and language gets a dev and a test task (`world_mgsm_direct_{code}_dev`,
    `world_mgsm_direct_{code}`, `world_belebele_{code}_dev`, `world_belebele_{code}`), and
    Belebele a Brier-scored twin of each (`world_belebele_brier_{code}[_dev]`); each
    `include:`s lm-eval's installed built-in config (mgsm_direct_en, belebele_eng_Latn) and
    overrides only the data source (and the Brier twins' metric list, lm-eval's own metrics), so
    prompts, filters and metrics are lm-eval's. Tags `world_mgsm_direct[_dev]`,
    `world_belebele[_dev]` and `world_belebele_brier[_dev]` run all languages. A dev task
    reads only the dev file (plus MGSM's train file for few-shot), never the test file.

    Args:
        world_dir: the world folder W with W/data/mgsm/{code}/{train,dev,test}.jsonl and
            W/data/belebele/{code}/{dev,test}.jsonl.
        tasks_dir: where to write the YAMLs (default W/tasks); stale world_*.yaml are removed.
    Returns:
        The task names written, sorted.
    Raises:
        ValueError: no evaluation data, or a data file that is not UTF-8 JSON lines of objects
            (naming the file and line).
    """
    import yaml

    world_dir = Path(world_dir).resolve()
    tasks_dir = Path(tasks_dir) if tasks_dir is not None else world_dir / "tasks"
    builtin = lm_eval_tasks_dir()
    bases = {"mgsm": builtin / MGSM_BASE, "belebele": builtin / BELEBELE_BASE}
    for path in bases.values():
        if not path.is_file():
            raise ValueError(f"lm-eval built-in task config {path} not found (lm_eval changed?)")

    configs = {**_mgsm_configs(world_dir, bases["mgsm"]), **_belebele_configs(world_dir, bases["belebele"])}  # fmt: skip
    if not configs:
        raise ValueError(
            f"{world_dir}: no world evaluation data (expected data/mgsm/CODE/test.jsonl or "
            f"data/belebele/CODE/test.jsonl)"
        )
    # No data file is opened here: the search writes these YAMLs and must never open a test
    # split. A damaged world is caught by its sha256 values (world.build.verify_world).
    tasks_dir.mkdir(parents=True, exist_ok=True)
    for old in tasks_dir.glob("world_*.yaml"):
        if old.stem not in configs:
            old.unlink()
    for name, cfg in configs.items():
        atomic_write_text(tasks_dir / f"{name}.yaml", yaml.safe_dump(cfg, sort_keys=False))
    return sorted(configs)


def _splits(code_dir: Path):
    """(split, task-name suffix) of each of dev and test present in `code_dir`."""
    for split, suffix in (("dev", "_dev"), ("test", "")):
        if (code_dir / f"{split}.jsonl").is_file():
            yield split, suffix


def _mgsm_configs(world_dir: Path, base: Path) -> dict[str, dict]:
    """world_mgsm_direct_{code}[_dev] over W/data/mgsm/{code}/."""
    configs = {}
    for code_dir in sorted((world_dir / "data" / "mgsm").glob("*/")):
        train = code_dir / "train.jsonl"
        for split, suffix in _splits(code_dir):
            # train first: `datasets` fixes the column types from the first split it reads,
            # and only train has string answers (null elsewhere; null casts to string, not back).
            files = {"train": train} if train.is_file() else {}
            files[split] = code_dir / f"{split}.jsonl"
            name = f"world_mgsm_direct_{code_dir.name}{suffix}"
            cfg = _task_yaml(base, name, f"world_mgsm_direct{suffix}", files, split)
            # Few-shot examples come from the 8-item train split, as in the real MGSM.
            cfg["training_split"] = "train" if train.is_file() else None
            configs[name] = cfg
    return configs


# Belebele's variants: the built-in metrics (accuracy), and the same items reported by lm-eval's
# brier_score over the four options' renormalised probabilities (lower is better): a continuous
# reading that still ranks models where accuracy saturates.
BELEBELE_VARIANTS = {"world_belebele": None, "world_belebele_brier": BRIER_METRICS}


def _belebele_configs(world_dir: Path, base: Path) -> dict[str, dict]:
    """Each BELEBELE_VARIANTS stem + _{code}[_dev] over W/data/belebele/{code}/."""
    configs = {}
    for code_dir in sorted((world_dir / "data" / "belebele").glob("*/")):
        for split, suffix in _splits(code_dir):
            files = {split: code_dir / f"{split}.jsonl"}
            for stem, metrics in BELEBELE_VARIANTS.items():
                name = f"{stem}_{code_dir.name}{suffix}"
                cfg = _task_yaml(base, name, f"{stem}{suffix}", files, split)
                # Built-in Belebele draws few-shot examples from its only split; a dev task
                # must draw them from dev, so the test set never shapes a dev score.
                cfg["fewshot_split"] = split
                if metrics is not None:
                    cfg["metric_list"] = metrics
                configs[name] = cfg
    return configs


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
