"""What a study needs from the Hugging Face Hub before it starts: base models and Hub experts,
training datasets of the source table, and lm-eval tasks (indicators, proxies, targets).

`needs_of(paths)` reads study, training-experiment or search-experiment YAMLs (told apart by
their keys) and lists, without touching the network, everything `layerswap prefetch` downloads
into the shared cache, so Ray workers never race to download. Tests: tests/study/test_needs.py
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from layerswap.search.promote import promotion_tasks
from layerswap.spaces.base import is_hub_id, load_yaml
from layerswap.spaces.search_experiment import SearchExperiment, load_search_experiment
from layerswap.spaces.study import load_study
from layerswap.spaces.train_experiment import TrainExperiment, load_train_experiment


@dataclass
class Needs:
    """Hub downloads, each with the configs that need it (for the listing)."""

    models: dict[str, set[str]] = field(default_factory=dict)  # repo id -> configs
    datasets: dict[tuple[str, str | None], set[str]] = field(
        default_factory=dict
    )  # (source, language)
    tasks: dict[str, set[str]] = field(default_factory=dict)  # lm-eval task -> configs

    def add(self, kind: str, key, where: str) -> None:
        getattr(self, kind).setdefault(key, set()).add(where)

    def __len__(self) -> int:
        return len(self.models) + len(self.datasets) + len(self.tasks)


def _hub_model(name: str | None) -> bool:
    """A model named by Hub id (spaces.base.is_hub_id: never an existing local folder)."""
    return bool(name) and is_hub_id(name)


def _train(exp: TrainExperiment, where: str, out: Needs) -> None:
    if _hub_model(exp.base):
        out.add("models", exp.base, where)
    for ds in exp.datasets:
        if ds.source is not None and not ds.data_files:
            out.add("datasets", (ds.source, ds.language), where)
    sw = exp.sweep
    if sw is not None and sw.world is None:  # world tasks are local files
        for task in sw.tasks_for(exp.kind, exp.language, world=False):
            out.add("tasks", task, where)


def _search(exp: SearchExperiment, where: str, out: Needs) -> None:
    for name in [exp.base, *exp.task_experts, *exp.language_experts]:
        if _hub_model(name):
            out.add("models", name, where)
    if exp.world is None:
        for task in promotion_tasks(exp):  # the proxies, their held-out splits, the target
            out.add("tasks", task, where)


def needs_of(paths: list[str | Path]) -> Needs:
    """Everything the configs at `paths` will download.

    Args:
        paths: study, training-experiment or search-experiment YAMLs.
    Returns:
        the Needs, each entry with the configs that need it.
    Raises:
        ValueError naming a file that is none of the three, or whose config is invalid.
    """
    out = Needs()
    for path in map(Path, paths):
        data = load_yaml(path, "config")
        if not isinstance(data, dict):
            raise ValueError(f"{path}: not a study, training or search config (a YAML mapping)")
        if "proxies" in data:  # a search (its `experts:` is a registry)
            _search(load_search_experiment(path), path.name, out)
        elif "datasets" in data:
            _train(load_train_experiment(path), path.name, out)
        elif "experts" in data or "searches" in data:
            study = load_study(path)
            for ex in study.experts:
                _train(ex.experiment, f"{path.name} {ex.label}", out)
            for s in study.searches:
                _search(s.experiment, f"{path.name} {s.label}", out)
        else:
            raise ValueError(f"{path}: not a study (experts/searches), training (datasets) or search (proxies) config")  # fmt: skip
    return out
