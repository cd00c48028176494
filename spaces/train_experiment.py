"""Training experiments as validated data: base, datasets, mode, hyperparameters, scaling, storage.

Load with `load_train_experiment("spaces/examples/world_math_full.yaml")`; `layerswap train FILE` runs
it. Pure data: no torch, no ray. The modes and what they mean are in trainables/train/. The
mode models are in spaces/train_modes.py, the optimisation and run settings (hyper, scaling,
precision, failure, debug) in spaces/train_settings.py. Tests:
.venv/bin/python -m pytest -q tests/spaces/test_train_experiment.py
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from layerswap.spaces.base import StrictModel, is_uri, load_yaml, resolve_local, validate
from layerswap.spaces.languages import WORLD_LANGUAGES, language_key
from layerswap.spaces.sweep import ExpertKind, SweepConfig
from layerswap.spaces.train_modes import MODE_NAMES, Mode
from layerswap.spaces.train_settings import (
    Debug,
    Failure,
    Hyper,
    Precision,
    PrecisionPolicy,
    Scaling,
)
from layerswap.spaces.world import sft_language


class DatasetSpec(StrictModel):
    """One SFT dataset: a local JSONL/JSON/Parquet file, or a registered source.

    `path`: rows in Orca (question/answer), Aya (inputs/targets) or record (prompt/response)
    schema. `source`: a name of trainables/train/sources.py SOURCES (read from the Hub, or from
    `data_files` in the source's schema), with `language` for multilingual sources.
    """

    path: str | None = None
    """A local JSONL, JSON or Parquet file of rows (Orca, Aya or prompt/response schema)."""
    source: str | None = None
    """A registered source name (trainables/train/sources.py SOURCES), read from the Hub."""
    language: str | None = None
    """The language to read from a multilingual `source` (it filters the source's rows). Not
    for a `path`, which trains every row it holds: for a multilingual file in a source's schema
    (Aya's inputs/targets/language) give `source: aya`, `data_files: [FILE]` and `language`."""
    data_files: list[str] | None = None
    """Local files in the `source`'s schema, read instead of the Hub."""
    limit: int | None = Field(None, gt=0)
    """Use only the first N rows (None: all)."""

    @model_validator(mode="after")
    def _one_origin(self) -> DatasetSpec:
        if (self.path is None) == (self.source is None):
            raise ValueError("give exactly one of `path` (local file) or `source` (SOURCES name)")
        if self.path is not None and self.data_files is not None:
            raise ValueError("data_files goes with `source`; a `path` dataset is one file")
        if self.path is not None and self.language is not None:
            # A `path` is read whole (no language filter): the language would label the expert
            # while every language in the file trains. A source filters its rows by language.
            raise ValueError(
                f"language: {self.language} goes with `source`; a `path` dataset trains every "
                f"row of {self.path} whatever its language. To train one language of a "
                "multilingual file in a source's schema, give `source: aya` (or another "
                f"SOURCES name), `data_files: [{self.path}]` and `language: {self.language}`"
            )
        return self

    @property
    def label(self) -> str:
        return self.path if self.path is not None else f"{self.source}:{self.language or ''}"


def _shorthand_schema(schema: dict) -> None:
    """The JSON Schema also accepts what `TrainExperiment._mode_shorthand` expands: a mode's
    name alone for a mode with no other required field (`mode: full`), a precision policy alone
    (`precision: bf16-mixed`)."""
    plain = [
        name
        for name, model in zip(MODE_NAMES, get_args(get_args(Mode)[0]), strict=True)
        if all(not f.is_required() for key, f in model.model_fields.items() if key != "type")
    ]
    props = schema["properties"]
    for key, names, field in (
        ("mode", plain, "type"),
        ("precision", list(get_args(PrecisionPolicy)), "policy"),
    ):
        full = props[key]
        short = {"enum": names, "description": f"shorthand for {{{field}: NAME}}"}
        props[key] = {"description": full.pop("description"), "anyOf": [full, short]}
        if "default" in full:
            props[key]["default"] = full.pop("default")


def stated_language(spec: DatasetSpec) -> str | None:
    """The language a dataset states: a source's `language`, or a world SFT file's name.

    Args:
        spec: one dataset of an experiment.
    Returns:
        the code as the dataset writes it, or None where it states none (a registered source's
        own default language is the trainer's to know, in trainables/train/sources.py).
    """
    if spec.source is not None:
        return spec.language
    code = sft_language(str(spec.path))
    return code if code in WORLD_LANGUAGES else None


def language_contradiction(language: str, datasets: list[DatasetSpec]) -> str | None:
    """Why `language` certainly contradicts the data, or None.

    Certain only when every dataset states a known language and none is `language`: one dataset
    of unknown language may be in it, and a mix (English math plus xa data) is an xa expert.

    Args:
        language: the experiment's `language`.
        datasets: its datasets.
    Returns:
        the message naming the field and both languages, or None.
    """
    stated = [stated_language(d) for d in datasets]
    known = [language_key(c) if c is not None else None for c in stated]
    mine = language_key(language)
    if mine is None or None in known or mine in known:
        return None
    data = ", ".join(f"datasets[{i}] ({d.label}) is {c} data" for i, (d, c) in enumerate(zip(datasets, stated, strict=True)))  # fmt: skip
    return (
        f"language: {language}, but {data}; the expert registry would list this expert as "
        f"{language} and a search for {language} would pick it. Set language to the data's "
        f"({' or '.join(dict.fromkeys(c for c in stated if c))}) or train on {language} data"
    )


class TrainExperiment(StrictModel):
    """One expert training run (`layerswap train FILE`): base, data, mode, hyperparameters.

    Shorthands: `mode: full` (or lora, mix) stands for `mode: {type: full}`, and
    `precision: bf16-mixed` for `precision: {policy: bf16-mixed}`.
    """

    model_config = ConfigDict(json_schema_extra=_shorthand_schema)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The run's name: its folder under `storage_path` (letters, digits, `.`, `_`, `-`)."""
    base: str
    """The base checkpoint to fine-tune: a local folder or a Hub id."""
    kind: ExpertKind
    """What the expert is for: "math" (the task expert) or "language"."""
    language: str = Field(min_length=1)
    """The expert's language code (e.g. "en", "xa", "sw"); a search picks experts by it. It
    must be a language its datasets state, where they all state one."""
    datasets: list[DatasetSpec] = Field(min_length=1, max_length=2)
    """The training data: one dataset, or two for the simultaneous and mix modes."""
    mode: Mode
    """What trains: full, lora, partial, simultaneous or mix (`mode: full` is shorthand)."""
    hyper: Hyper
    """Optimisation hyperparameters."""
    checkpoint_every_samples: int | None = Field(None, gt=0)
    """Save a checkpoint every N training samples, besides the final one (None: final only)."""
    keep_checkpoints: int | None = Field(None, ge=1)
    """Keep only the run's newest N checkpoints, counting those written before a resume (None:
    all). An older one goes only once a newer one is written whole."""
    resume_state: Literal["newest", "all"] = "newest"
    """Which checkpoints keep what resuming needs beyond the weights (AdamW state, fp32 masters,
    FSDP's sharded state): only the newest (resuming starts there; at 8B that state is ~96 GB a
    checkpoint beside 16 GB of bf16 weights), or all of them (to study optimizer state)."""
    scaling: Scaling = Scaling()
    """Workers, GPUs and how the model is spread over them."""
    precision: Precision = Precision()
    """Training precision (`precision: bf16-mixed` is shorthand for its policy)."""
    storage_path: str = "runs/train"
    """Where runs are written (a folder or a cloud URI); `--out RUN` writes RUN/train instead."""
    failure: Failure = Failure()
    """Restarts after worker failures."""
    sweep: SweepConfig | None = None
    """An expert sweep over this experiment's hyperparameters (None: one run)."""
    debug: Debug = Debug()
    """Fault injection for tests."""
    trust_remote_code: bool = False
    """Let transformers run model code shipped with the checkpoint."""

    @model_validator(mode="before")
    @classmethod
    def _mode_shorthand(cls, data):
        if isinstance(data, dict) and "search" in data:
            # Configs written before the rename: say what to change, not pydantic's "extra field".
            raise ValueError(
                "search: the expert-sweep block is now called `sweep:`; rename the key `search:` "
                "to `sweep:` (its fields are unchanged)"
            )
        if isinstance(data, dict) and isinstance(data.get("mode"), str):
            data = {**data, "mode": {"type": data["mode"]}}
        if isinstance(data, dict) and isinstance(data.get("precision"), str):
            data = {**data, "precision": {"policy": data["precision"]}}
        return data

    @model_validator(mode="after")
    def _datasets_fit_mode(self) -> TrainExperiment:
        two = self.mode.type in ("simultaneous", "mix")
        if two and len(self.datasets) != 2:
            raise ValueError(f"mode {self.mode.type}: needs exactly 2 datasets, got {len(self.datasets)}")  # fmt: skip
        if not two and len(self.datasets) != 1:
            raise ValueError(f"mode {self.mode.type}: takes 1 dataset, got {len(self.datasets)} (use mix for a union)")  # fmt: skip
        self._check_scaling()
        if (contradiction := language_contradiction(self.language, self.datasets)) is not None:
            raise ValueError(contradiction)
        if self.sweep is not None:
            for key in self.sweep.params:
                _check_path(self, key)
        return self

    def _check_scaling(self) -> None:
        h, s = self.hyper, self.scaling
        if h.batch_size % s.num_workers:
            raise ValueError(
                f"hyper.batch_size ({h.batch_size}) must be divisible by "
                f"scaling.num_workers ({s.num_workers})"
            )
        per_worker = h.batch_size // s.num_workers
        if h.micro_batch_size is not None and per_worker % h.micro_batch_size:
            raise ValueError(
                f"hyper.micro_batch_size ({h.micro_batch_size}) must divide each worker's share "
                f"of the batch (batch_size {h.batch_size} / {s.num_workers} workers = {per_worker})"
            )
        if s.strategy == "fsdp" and self.is_lora:
            raise ValueError(
                f"scaling.strategy fsdp: mode {self.mode.type} trains LoRA adapters, which stay "
                "on ddp (the adapters are small and the frozen base is not optimised)"
            )

    @property
    def micro_batch(self) -> int:
        """Samples per worker per forward pass (micro_batch_size, or the worker's whole share)."""
        per_worker = self.hyper.batch_size // self.scaling.num_workers
        return self.hyper.micro_batch_size or per_worker

    @property
    def is_lora(self) -> bool:
        m = self.mode
        return m.type == "lora" or getattr(m, "lora", None) is not None


def _check_path(exp: TrainExperiment, dotted: str) -> None:
    node: object = exp
    for part in dotted.split("."):
        if not isinstance(node, BaseModel) or part not in type(node).model_fields:
            raise ValueError(f"sweep.params: {dotted!r} is not a field of the experiment")
        node = getattr(node, part)


_EXPERIMENT = TypeAdapter(TrainExperiment)


def parse_train_experiment(data: object, source: str = "experiment") -> TrainExperiment:
    """Validate a mapping into a TrainExperiment; ValueError names `source` and each bad field."""
    return validate(_EXPERIMENT, data, source=source, what="experiment", top="<top>")


def load_train_experiment(path: str | Path) -> TrainExperiment:
    """Read and validate a training experiment YAML.

    Relative `base` and dataset paths follow the one path rule (spaces.base.resolve_local):
    against the file's folder when they exist there, else as written (the working directory).
    Args:
        path: the YAML file.
    Returns:
        The typed experiment.
    """
    path = Path(path)
    data = load_yaml(path, "experiment")
    if isinstance(data, dict):
        data = resolve_input_paths(data, path.parent)
    return parse_train_experiment(data, source=str(path))


def resolve_input_paths(data: dict, root: Path) -> dict:
    """Local input paths (base, dataset files, a sweep's world) by spaces.base.resolve_local:
    made absolute against `root` where they exist there; outputs (storage_path) are left alone.

    Args:
        data: an experiment's JSON data (a copy is returned; `data` is not changed).
        root: the folder relative paths are read from.
    Returns:
        the data with those paths resolved.
    """
    out = copy.deepcopy(data)
    if "base" in out:  # not added when missing: the error should say it is missing
        out["base"] = resolve_local(out["base"], root)
    for ds in out.get("datasets") or []:
        if isinstance(ds, dict):
            if "path" in ds:
                ds["path"] = resolve_local(ds["path"], root)
            if isinstance(ds.get("data_files"), list):
                ds["data_files"] = [resolve_local(f, root) for f in ds["data_files"]]
    if isinstance(out.get("sweep"), dict) and out["sweep"].get("world"):
        out["sweep"]["world"] = resolve_local(out["sweep"]["world"], root)
    return out


def world_dir(experiment: TrainExperiment) -> Path | None:
    """The embedded world of an experiment: `sweep.world`, or the base's parent with world.json."""
    sweep = experiment.sweep
    if sweep is not None and sweep.world is not None:
        w = Path(sweep.world)
        if not (w / "world.json").is_file():
            raise ValueError(f"sweep.world: {w} is not a world folder (no world.json)")
        return w
    parent = Path(experiment.base).parent
    return parent if (parent / "world.json").is_file() else None


def absolute_local_paths(exp: TrainExperiment, cwd: str | Path | None = None) -> TrainExperiment:
    """`exp` with relative local paths (base, dataset files, a sweep's world, storage) made
    absolute against `cwd` (default: the current folder), so workers started elsewhere (Ray,
    Tune trials in their own folders) find them. Hub ids and cloud URIs are kept as written."""
    root = Path(cwd) if cwd is not None else Path.cwd()
    data = resolve_input_paths(exp.model_dump(mode="json"), root)
    sp = data["storage_path"]
    if not is_uri(sp) and not Path(sp).is_absolute():
        data["storage_path"] = str((root / sp).resolve())
    return _keep_mode_defaults(exp, parse_train_experiment(data, source=exp.name))


def with_overrides(exp: TrainExperiment, overrides: dict[str, object]) -> TrainExperiment:
    """A copy of `exp` with dotted-path fields replaced (`{"hyper.lr": 1e-4}`), re-validated."""
    data = exp.model_dump(mode="json")
    for dotted, value in overrides.items():
        node = data
        *head, last = dotted.split(".")
        for part in head:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"override {dotted!r}: {part!r} is not a section")
            node = node[part]
        if last not in node:
            raise ValueError(f"override {dotted!r}: no field {last!r}")
        node[last] = value
    return _keep_mode_defaults(exp, parse_train_experiment(data, source=f"{exp.name} with {overrides}"))  # fmt: skip


def _keep_mode_defaults(old: TrainExperiment, new: TrainExperiment) -> TrainExperiment:
    """`new` (a full dump of `old` re-validated) with the mode's fields that `old` left to their
    default and that kept their value marked unset again: a dump sets every field, and the run
    start reads `mode.model_fields_set` to tell a chosen `sides` from the dataset-order default
    (trainables/train/side_notes.py)."""
    if type(old.mode) is type(new.mode):
        kept = {f for f in new.mode.model_fields_set if f in old.mode.model_fields_set or getattr(new.mode, f) != getattr(old.mode, f)}  # fmt: skip
        object.__setattr__(new.mode, "__pydantic_fields_set__", kept)
    return new


def experiment_identity(exp: TrainExperiment | dict) -> str:
    """A stable id of what an experiment trains; where it writes (storage_path) and the test-only
    fault injection (debug: it changes when a run fails, never what it trains) are left out.

    Args:
        exp: the experiment, or its JSON data as a checkpoint manifest records it.
    """
    data = dict(experiment_json(exp) if isinstance(exp, TrainExperiment) else exp)
    data.pop("storage_path", None)
    data.pop("debug", None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def records_experiment(manifest: dict, exp: TrainExperiment) -> bool:
    """Whether a checkpoint manifest records `exp` (by identity): the one comparison the
    driver's rerun decision (trainables/train/run.py), Ray's workers' on-disk resume point and
    their check of what Ray restored all make, so they never disagree about a checkpoint.

    Args:
        manifest: a checkpoint's layerswap_train.json, as read.
        exp: the experiment as it is trained (with `--no-ray`, on its one worker).
    Returns:
        True when the manifest's experiment has `exp`'s identity.
    """
    return experiment_identity(manifest.get("experiment") or {}) == experiment_identity(exp)


def experiment_json(exp: TrainExperiment) -> dict:
    """The experiment as plain JSON data (what checkpoint manifests record)."""
    return exp.model_dump(mode="json")
