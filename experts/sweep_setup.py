"""What an expert sweep resolves once in its driver and hands to every trial (SweepSetup), and what
it returns (SweepResult): plain data, in a module of its own so that experts/sweep.py,
experts/sweep_tuner.py and experts/scoring.py all take them without importing each other.
Tests: .venv/bin/python -m pytest -q tests/experts/test_sweep.py
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from layerswap.spaces.sweep import SweepConfig


@dataclass
class SweepSetup:
    """Everything a trial needs, resolved once in the driver (plain data, pickled to trials)."""

    experiment: dict  # the experiment as JSON data
    sweep: SweepConfig
    tasks: list[str]
    metric_task: str
    include_path: str | None
    int_params: set[str]
    executor: str  # "in_trial" | "ray_train"
    storage: str  # RUN/train/<experiment name>
    registry: str = ""  # RUN/experts/registry.parquet: a resumed trial reuses its rows there
    node_inputs: list = field(default_factory=list)  # node_paths.described: checked per trial


@dataclass
class SweepResult:
    registry: Path
    rows: list[dict]  # this sweep's registry rows
    best: list[dict]  # top_k of this sweep's experts on the metric task
    metric_task: str
    seconds: float
    trials: dict[str, str] = field(default_factory=dict)  # trial_id -> status
