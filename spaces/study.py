"""A whole study as data: its experts (training configs, sweeps), its merge searches, and the
device throughput profile its plan is estimated with.

`load_study("spaces/examples/real_study.yaml")` validates the study YAML once (extra="forbid")
and every config it names, with its overrides applied, and lists every problem at once;
`load_profiles()` reads the named device profiles of spaces/throughput.yaml, each figure with
its provenance (measured by a layerswap benchmark, or assumed, with the reason). Plan a study
with `layerswap plan STUDY.yaml` (study/plan.py). Pure data: no torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from layerswap.spaces.base import StrictModel, load_yaml, resolve_local, validate
from layerswap.spaces.search_experiment import SearchExperiment, load_search_experiment
from layerswap.spaces.sweep import SweepConfig
from layerswap.spaces.task_families import TaskShape
from layerswap.spaces.train_experiment import TrainExperiment, load_train_experiment, with_overrides


class ExpertEntry(StrictModel):
    """One expert of the study: a training experiment YAML, optionally changed."""

    config: str
    """The training experiment YAML, relative to the study file."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Dotted paths into the experiment and their new values (`language: ben`, `hyper.lr:
    1.0e-7`); local paths in `base` and `datasets` are taken against the study's folder."""
    sweep: SweepConfig | None = None
    """An expert sweep for a config that has none of its own."""
    rows: int | None = Field(None, ge=1)
    """Dataset rows the run reads (before the validation split), for data that cannot be
    counted offline (a Hub source); local files are counted."""
    tokens_per_sample: float | None = Field(None, gt=0)
    """Mean non-padding tokens of one training sample (None: hyper.seq_len, an upper bound)."""


class SearchEntry(StrictModel):
    """One merge search of the study: a SearchExperiment YAML (`config`, relative to the study
    file) or the experiment itself (`experiment`, a mapping; its paths taken against the study
    file's folder as a search file's are against its own)."""

    config: str | None = None
    """A search experiment YAML, relative to the study file."""
    experiment: dict[str, Any] | None = None
    """The search experiment written inline (its fields as in a search YAML)."""

    @model_validator(mode="after")
    def _one(self) -> SearchEntry:
        if (self.config is None) == (self.experiment is None):
            raise ValueError(
                "give exactly one of `config` (a search YAML) or `experiment` (inline)"
            )
        return self


class Study(StrictModel):
    """A study: experts to train (and sweep), merge searches over them, a throughput profile."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The study's name."""
    profile: str = "h100"
    """The throughput profile of spaces/throughput.yaml the plan is estimated with."""
    experts: list[ExpertEntry] = Field(default_factory=list)
    """The experts to train (and sweep)."""
    searches: list[SearchEntry] = Field(default_factory=list)
    """The merge searches over them."""
    tasks: dict[str, TaskShape] = Field(default_factory=dict)
    """Cost shapes of evaluation tasks by name, for tasks the plan has no shape for."""

    @model_validator(mode="after")
    def _something(self) -> Study:
        if not self.experts and not self.searches:
            raise ValueError("a study needs at least one of `experts` or `searches`")
        return self


@dataclass(frozen=True)
class StudyExpert:
    """An expert entry with its experiment loaded (overrides and sweep applied)."""

    label: str  # "experts[2] (real_llama31_8b_sw_lora.yaml)"
    config: Path
    experiment: TrainExperiment
    rows: int | None
    tokens_per_sample: float | None


@dataclass(frozen=True)
class StudySearch:
    label: str
    config: Path  # the search YAML, or the study file for an inline experiment
    experiment: SearchExperiment


@dataclass(frozen=True)
class LoadedStudy:
    """A validated study and every experiment it names, loaded."""

    path: Path
    study: Study
    experts: list[StudyExpert]
    searches: list[StudySearch]


def _resolved_overrides(overrides: dict[str, Any], root: Path) -> dict[str, Any]:
    """Overrides with local `base` and dataset paths resolved against the study's folder."""
    out = dict(overrides)
    if "base" in out:
        out["base"] = resolve_local(out["base"], root)
    if isinstance(out.get("datasets"), list):
        sets = []
        for ds in out["datasets"]:
            if isinstance(ds, dict):
                ds = dict(ds)
                if "path" in ds:
                    ds["path"] = resolve_local(ds["path"], root)
                if isinstance(ds.get("data_files"), list):
                    ds["data_files"] = [resolve_local(f, root) for f in ds["data_files"]]
            sets.append(ds)
        out["datasets"] = sets
    return out


def _load_expert(i: int, entry: ExpertEntry, root: Path) -> StudyExpert:
    """experts[i] loaded; a ValueError names the entry, its file and the field."""
    label = f"experts[{i}] ({entry.config})"
    path = root / entry.config
    try:
        exp = load_train_experiment(path)
        if entry.overrides:
            exp = with_overrides(exp, _resolved_overrides(entry.overrides, root))
        if entry.sweep is not None:
            if exp.sweep is not None:
                raise ValueError(
                    f"sweep: {entry.config} already has a sweep: block; change it there or "
                    "drop the study's sweep"
                )
            exp = with_overrides(exp, {"sweep": entry.sweep.model_dump(mode="json")})
    except ValueError as e:
        raise ValueError(f"{label}: {e}") from None
    return StudyExpert(label, path, exp, entry.rows, entry.tokens_per_sample)


def _load_search(i: int, entry: SearchEntry, study: Path) -> StudySearch:
    """searches[i] loaded; a ValueError names the entry and the field."""
    from layerswap.spaces.search_experiment import resolve_paths  # the search file's own path rule

    if entry.config is not None:
        label = f"searches[{i}] ({entry.config})"
        try:
            exp = load_search_experiment(study.parent / entry.config)
        except ValueError as e:
            raise ValueError(f"{label}: {e}") from None
        return StudySearch(label, study.parent / entry.config, exp)
    label = f"searches[{i}] (inline)"
    data = resolve_paths(resolve_paths(entry.experiment, study.parent), Path.cwd())
    where = f"{label}: experiment"
    return StudySearch(label, study, validate(SearchExperiment, data, source=where, what="search experiment"))  # fmt: skip


def load_study(path: str | Path) -> LoadedStudy:
    """Read and validate a study YAML and every experiment it names.

    Args:
        path: the study file; `config:` paths are relative to its folder.
    Returns:
        the LoadedStudy.
    Raises:
        ValueError naming the study file and every entry, file and field that is wrong.
    """
    path = Path(path)
    data = load_yaml(path, "study")
    study = validate(Study, data, source=str(path), what="study", top="<study>")
    root = path.parent
    experts, searches, problems = [], [], []
    for i, entry in enumerate(study.experts):
        try:
            experts.append(_load_expert(i, entry, root))
        except ValueError as e:
            problems.append(str(e))
    for i, s in enumerate(study.searches):
        try:
            searches.append(_load_search(i, s, path))
        except ValueError as e:
            problems.append(str(e))
    names: dict[str, str] = {}
    for ex in experts:  # two runs of one name would train into the same RUN/train/<name>
        other = names.setdefault(ex.experiment.name, ex.label)
        if other != ex.label:
            problems.append(f"{ex.label}: experiment name {ex.experiment.name!r} is also {other}'s")
    if problems:
        raise ValueError(f"{path}: invalid study\n  " + "\n  ".join(problems))
    return LoadedStudy(path, study, experts, searches)


# ---------------------------------------------------------------------------- throughput profiles


class Measured(StrictModel):
    """Where a measured figure comes from: the benchmark run that gave it."""

    benchmark: str
    """The benchmark script, e.g. benchmarks/bench_train_step.py."""
    command: str
    """The command that ran it."""
    date: str
    """When it ran."""
    device: str
    """What it ran on."""
    shape: str
    """The model shape it measured."""
    result: str
    """What the benchmark printed."""
    derivation: str
    """How the value follows from the result."""
    partial: str | None = None
    """Set when the run that measured it failed or was cut after part of it finished (the GPU
    check's kept parts): what stopped and what had finished, e.g. "stage evaluator running after
    candidate 1 finished". The value measures that part only; `layerswap plan` says so."""


class Figure(StrictModel):
    """One throughput figure: its value, unit and provenance (exactly one of measured/assumed)."""

    value: float = Field(gt=0)
    """The figure."""
    unit: str
    """Its unit, e.g. FLOP/s."""
    measured: Measured | None = None
    """The benchmark run it comes from."""
    assumed: str | None = None
    """Why this number, when nothing measured it."""

    @model_validator(mode="after")
    def _provenance(self) -> Figure:
        if (self.measured is None) == (self.assumed is None):
            raise ValueError("give exactly one of `measured` (a benchmark run) or `assumed` (why)")
        return self

    @property
    def origin(self) -> str:
        return "measured" if self.measured is not None else "assumed"


class Profile(StrictModel):
    """A device (one GPU, or one CPU thread) and what layerswap's work achieves on it; how each
    figure enters an estimate: study/estimate.py."""

    kind: Literal["gpu", "cpu"]
    """A GPU or a CPU thread."""
    device: str
    """What the device is, in words."""
    unit: str
    """What one device-hour is called in the plan ("GPU-h", "CPU-thread-h")."""
    train_flops_per_s: Figure
    """Training FLOP/s per device, FLOPs counted by study/estimate.py's rule."""
    prefill_flops_per_s: Figure
    """Forward-only FLOP/s (scoring, prompts, validation)."""
    decode_bytes_per_s: Figure
    """Weight bytes read per second while decoding (one read per step)."""
    decode_step_overhead_s: Figure
    """Fixed seconds per decoding step (launches, Python)."""
    merge_bytes_per_s: Figure
    """Model bytes composed per second (a merge candidate from experts)."""
    run_startup_s: Figure
    """Seconds from launch to the first step of a training run."""
    trial_overhead_s: Figure
    """Fixed seconds per search trial (scheduling, result writes)."""
    parallel_efficiency: Figure
    """Share of the compute rate kept with several devices per run, beyond what the plan
    counts itself (communication, waiting for the slowest rank)."""
    interconnect_bytes_per_s: Figure
    """Bus bandwidth per device of a run's collectives (all-gather, reduce-scatter,
    all-reduce): bytes a device sends per second in a ring collective."""
    comm_exposed: Figure
    """Share of the shorter of a step's compute and communication that the longer does not
    hide (1: they add up; 0: the step takes the longer of the two)."""
    disk_sync_bytes_per_s: Figure
    """Bytes per second a node's local disk takes writes that must reach it (fsynced) in the
    workers' temporary folder, where a checkpoint is written first."""
    storage_write_bytes_per_s: Figure
    """Bytes per second a checkpoint is copied to the run's storage at (the run waits)."""

    def figures(self) -> dict[str, Figure]:
        """Every figure by name."""
        return {k: v for k, v in self if isinstance(v, Figure)}


class Profiles(StrictModel):
    """The throughput profiles file (spaces/throughput.yaml)."""

    profiles: dict[str, Profile] = Field(min_length=1)
    """The device profiles by name (a study's `profile` names one)."""


def load_profiles(path: str | Path | None = None) -> dict[str, Profile]:
    """The device profiles by name.

    Args:
        path: a profiles YAML (default: spaces/throughput.yaml, shipped with the package).
    Returns:
        {name: Profile}.
    Raises:
        ValueError naming the file and every bad field.
    """
    if path is None:
        with resources.as_file(resources.files("layerswap.spaces") / "throughput.yaml") as p:
            return load_profiles(p)
    data = load_yaml(Path(path), "throughput profiles")
    return validate(Profiles, data, source=str(path), what="throughput profiles").profiles
