"""Training experiments as validated data: base, datasets, mode, hyperparameters, scaling, storage.

Load with `load_train_experiment("spaces/examples/world_math_full.yaml")`; `layerswap train FILE` runs
it. Pure data: no torch, no ray. The modes and what they mean are in trainables/train/.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from layerswap.spaces.base import StrictModel, is_uri, load_yaml, resolve_local, validate
from layerswap.spaces.partitions import PARTITIONS, PartitionName
from layerswap.spaces.recipe import Side, Zones
from layerswap.spaces.sweep import ExpertKind, SweepConfig

Schedule = Literal["linear", "wsd", "constant_with_warmup"]
# Bounds on sizes that set memory or time before the first step: past these a run would exhaust
# memory building its batches or never end, not train (the limit is named in the message).
MAX_BATCH = 1_048_576  # samples per step (global batch, micro-batch)
MAX_SEQ_LEN = 1_048_576  # tokens per sample
MAX_STEPS = 1_000_000_000  # optimizer steps (max_steps, warmup_steps, log_every)
MAX_EPOCHS = 100_000
# AdamW divides lr by its bias correction (0.1 at step 1 with beta1 0.9): an lr near float32's
# largest number overflowed inside torch's optimizer; any lr above 1 is a typo already.
MAX_LR = 1_000.0
# Attention and MLP projections of the Llama/Qwen/Mistral families (rsLoRA on all of them).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


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
    """The language to read from a multilingual `source`."""
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
        return self

    @property
    def label(self) -> str:
        return self.path if self.path is not None else f"{self.source}:{self.language or ''}"


class PartitionSpec(StrictModel):
    """A custom partition in layer-swap vocabulary: layers [0, bottom) and [L-top, L) are the
    language side, the middle the task side; `attention`/`mlp` override per component (zones of
    their own, or a whole side). `non_layer` (embeddings, final norm, lm_head): which side owns
    them, or None = frozen for every side."""

    bottom: int = Field(ge=0)
    """Bottom layers on the language side."""
    top: int = Field(ge=0)
    """Top layers on the language side."""
    attention: Zones | Side | None = None
    """Attention's own zones (no transitions), or a whole side; None: the layer zones."""
    mlp: Zones | Side | None = None
    """The MLP's own zones (no transitions), or a whole side; None: the layer zones."""
    non_layer: Side | None = None
    """The side that owns embeddings, final norm and lm_head (None: frozen for every side)."""

    @model_validator(mode="after")
    def _no_transitions(self) -> PartitionSpec:
        for comp in ("attention", "mlp"):
            z = getattr(self, comp)
            if isinstance(z, Zones) and (z.bottom_transition or z.top_transition):
                raise ValueError(f"{comp}: a training partition has no transition zones")
        return self


def partition_spec(p: PartitionName | PartitionSpec) -> PartitionSpec:
    """A named partition (A, B, C of docs/method.md) as a PartitionSpec (non-layer frozen)."""
    return p if isinstance(p, PartitionSpec) else PartitionSpec(**PARTITIONS[p])


class LoraSpec(StrictModel):
    """Rank-stabilised LoRA (PEFT) on attention and MLP projections."""

    rank: int = Field(16, gt=0)
    """Adapter rank r."""
    alpha: float = Field(32.0, gt=0)
    """LoRA alpha: the update is scaled by alpha / sqrt(r) (rsLoRA) or alpha / r."""
    rslora: bool = True
    """Rank-stabilised scaling alpha / sqrt(r) instead of alpha / r."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input."""
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), min_length=1)
    """Module names that get adapters (default: every attention and MLP projection)."""


class FullMode(StrictModel):
    """Fine-tune every parameter."""

    type: Literal["full"]
    """Selects this mode (`mode: full` is shorthand)."""


class LoraMode(LoraSpec):
    """Train LoRA adapters on the frozen base (the fields of LoraSpec)."""

    type: Literal["lora"]
    """Selects this mode (`mode: lora` is shorthand)."""


class PartialMode(StrictModel):
    """Train only `train`'s side of `partition`; the rest stays bit-identical to base.
    `lora`: adapters only on the allocated partition's projections instead of full weights."""

    type: Literal["partial"]
    """Selects this mode."""
    partition: PartitionName | PartitionSpec
    """A named partition (A, B, C) or one of your own."""
    train: Side
    """The side of the partition that trains: "task" or "language"."""
    lora: LoraSpec | None = None
    """Train LoRA adapters on that side's projections instead of its full weights."""


class SimultaneousMode(StrictModel):
    """Alternate datasets every `k` steps; dataset i trains only side `sides[i]` of `partition`.
    Each side has its own AdamW; the idle side's moments do not move."""

    type: Literal["simultaneous"]
    """Selects this mode."""
    partition: PartitionName | PartitionSpec
    """A named partition (A, B, C) or one of your own."""
    k: int = Field(1, ge=1)
    """Steps on one dataset before switching to the other."""
    sides: tuple[Side, Side] = ("task", "language")
    """The side each of the two datasets trains, in dataset order."""
    lora: LoraSpec | None = None
    """Train LoRA adapters on each side's projections instead of its full weights."""

    @model_validator(mode="after")
    def _distinct(self) -> SimultaneousMode:
        if self.sides[0] == self.sides[1]:
            raise ValueError(
                f"sides: the two datasets must train different sides, got {self.sides}"
            )
        return self


class MixMode(StrictModel):
    """One run on the shuffled union of the datasets (all parameters, or LoRA)."""

    type: Literal["mix"]
    """Selects this mode (`mode: mix` is shorthand)."""
    lora: LoraSpec | None = None
    """Train LoRA adapters instead of every parameter."""


Mode = Annotated[
    FullMode | LoraMode | PartialMode | SimultaneousMode | MixMode, Field(discriminator="type")
]
# The training modes, in declaration order: the one list (trainables.train.modes.MODES keys them).
MODE_NAMES: tuple[str, ...] = tuple(
    get_args(m.model_fields["type"].annotation)[0] for m in get_args(get_args(Mode)[0])
)


class Hyper(StrictModel):
    """Optimisation. `batch_size` is global (samples per optimizer step over all workers)."""

    lr: float = Field(gt=0, le=MAX_LR)
    """Peak learning rate (AdamW)."""
    schedule: Schedule = "linear"
    """Learning-rate schedule after warmup: linear decay to 0, WSD (warmup-stable-decay) or
    constant."""
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    """Steps of linear warmup from 0 to `lr`."""
    wsd_decay_frac: float = Field(0.1, ge=0, le=1)
    """WSD: the final share of steps over which the learning rate decays to 0."""
    beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1."""
    beta2: float = Field(0.999, ge=0, lt=1)
    """AdamW beta2."""
    eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this (None: no clipping)."""
    batch_size: int = Field(8, gt=0, le=MAX_BATCH)
    """Global batch: samples per optimizer step over all workers."""
    max_steps: int | None = Field(None, gt=0, le=MAX_STEPS)
    """Optimizer steps to train; give this or `epochs`."""
    epochs: float | None = Field(None, gt=0, le=MAX_EPOCHS)
    """Passes over the training data (may be fractional); give this or `max_steps`."""
    seq_len: int = Field(1024, gt=1, le=MAX_SEQ_LEN)
    """Longest training sample in tokens; longer ones are truncated."""
    seed: int = 0
    """Seeds data order, the validation split and dropout."""
    val_share: float = Field(0.05, ge=0, lt=1)
    """Share of the data held out for validation loss at checkpoints."""
    log_every: int = Field(1, ge=1, le=MAX_STEPS)
    """Report metrics every N steps."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, more compute (big models)."""
    micro_batch_size: int | None = Field(None, gt=0, le=MAX_BATCH)
    """Samples per worker per forward pass; the worker's share of `batch_size` is accumulated
    over several passes (None: one pass per step)."""

    @model_validator(mode="after")
    def _length(self) -> Hyper:
        if (self.max_steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of max_steps or epochs")
        return self


Strategy = Literal["ddp", "fsdp"]


# CPUs a GPU worker reserves unless told: one thread starves a GPU worker's host side (data,
# and the optimizer step under cpu_offload); 8 fits every GPU node type cluster.yaml names
# (p5.48xlarge: 24 CPUs a GPU; g6e.12xlarge: 12).
GPU_WORKER_CPUS = 8.0


class Scaling(StrictModel):
    """Workers and how the model is spread over them.

    `ddp`: every worker holds the whole model and optimizer state. `fsdp`: FSDP2 shards weights,
    gradients and optimizer state over the workers (full-weight modes; LoRA stays on ddp).
    `cpu_offload` (fsdp): sharded weights and optimizer state live in CPU memory between uses.
    `accelerator_type`: Ray's GPU type label (e.g. "H100", "A10G"); Ray places workers only on
    such GPUs, and `layerswap train --plan` checks the memory plan against their size.
    """

    num_workers: int = Field(1, ge=1)
    """Training workers (processes); `hyper.batch_size` must divide evenly among them."""
    use_gpu: bool = False
    """Give each worker one GPU."""
    strategy: Strategy = "ddp"
    """"ddp" (every worker holds the whole model) or "fsdp" (FSDP2 shards it over workers)."""
    cpus_per_worker: float = Field(1.0, gt=0)
    """CPUs each worker reserves in Ray, and its torch threads (default: 1, or GPU_WORKER_CPUS
    with use_gpu: a GPU worker tokenizes, collates and, with cpu_offload, steps AdamW on them)."""
    cpu_offload: bool = False
    """fsdp: keep sharded weights and optimizer state in CPU memory between uses."""
    accelerator_type: str | None = None
    """Ray's GPU type label (e.g. "H100"): workers are placed only on such GPUs."""

    @model_validator(mode="before")
    @classmethod
    def _gpu_worker_cpus(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("use_gpu") and "cpus_per_worker" not in data:
            return {**data, "cpus_per_worker": GPU_WORKER_CPUS}
        return data

    @model_validator(mode="after")
    def _offload_needs_fsdp(self) -> Scaling:
        if self.cpu_offload and self.strategy != "fsdp":
            raise ValueError(f"cpu_offload: needs strategy fsdp (got {self.strategy!r})")
        return self


# What the optimizer steps on and what the forward pass computes in:
#   bf16-mixed  fp32 master weights and AdamW state, bf16 compute (autocast / FSDP2 param_dtype)
#   fp32        everything in fp32
#   bf16-pure   weights and AdamW state in bf16: half the memory, but updates smaller than a
#               weight's bf16 rounding step vanish (warned about at set-up)
#   auto        bf16-mixed for a bf16 or fp16 checkpoint, fp32 otherwise
PrecisionPolicy = Literal["auto", "bf16-mixed", "fp32", "bf16-pure"]


class Precision(StrictModel):
    """The training precision; `precision: bf16-mixed` is shorthand for `{policy: bf16-mixed}`.

    `checkpoint_dtype`: the dtype of the saved HF weights, `base` (the base checkpoint's) or
    `fp32` (keeps updates smaller than a bf16 step visible to merging). When the saved weights
    are coarser than the masters, the masters are kept beside them for resuming
    (trainer_state/), and the manifest says what was written.
    """

    policy: PrecisionPolicy = "auto"
    """"bf16-mixed" (fp32 masters, bf16 compute), "fp32", "bf16-pure" (bf16 weights and AdamW
    state) or "auto" (bf16-mixed for a bf16/fp16 checkpoint, else fp32)."""
    checkpoint_dtype: Literal["base", "fp32"] = "base"
    """dtype of the saved weights: the base checkpoint's, or fp32 (keeps updates smaller than a
    bf16 step visible to merging)."""


class Failure(StrictModel):
    """What Ray Train does when a worker dies."""

    max_failures: int = Field(0, ge=-1)
    """Restarts from the last checkpoint after a worker failure (-1: forever, Ray's convention)."""


class Debug(StrictModel):
    """Fault injection for tests: raise once at `fail_at_step` (the marker file makes it once)."""

    fail_at_step: int | None = Field(None, ge=0)
    """Raise once at this update (0-based); needs `fail_marker`."""
    fail_marker: str | None = None
    """File whose existence records that the failure happened, so it happens once."""
    kill_rank: int | None = Field(None, ge=0)
    """Instead of raising on every rank, this rank's process SIGKILLs itself (a lost worker)."""
    step_log: str | None = None
    """A JSON-lines file rank 0 appends {step, start, group, time, tokens} to after each step."""
    # A test can then act (remove a node, kill the driver) while a run is between checkpoints,
    # without racing a tiny model's fast steps.
    step_delay_s: float = Field(0.0, ge=0)
    """Seconds every rank sleeps after each update."""

    @model_validator(mode="after")
    def _marker(self) -> Debug:
        if self.fail_at_step is not None and self.fail_marker is None:
            raise ValueError("debug.fail_at_step needs debug.fail_marker (so it fails only once)")
        return self


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
    """The expert's language code (e.g. "en", "xa", "sw"); a search picks experts by it."""
    datasets: list[DatasetSpec] = Field(min_length=1, max_length=2)
    """The training data: one dataset, or two for the simultaneous and mix modes."""
    mode: Mode
    """What trains: full, lora, partial, simultaneous or mix (`mode: full` is shorthand)."""
    hyper: Hyper
    """Optimisation hyperparameters."""
    checkpoint_every_samples: int | None = Field(None, gt=0)
    """Save a checkpoint every N training samples, besides the final one (None: final only)."""
    keep_checkpoints: int | None = Field(None, ge=1)
    """Keep only the newest N checkpoints (None: all)."""
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
        data = _resolve(data, path.parent)
    return parse_train_experiment(data, source=str(path))


def _resolve(data: dict, root: Path) -> dict:
    """Local input paths (base, dataset files, a sweep's world) by spaces.base.resolve_local."""
    out = copy.deepcopy(data)
    out["base"] = resolve_local(out.get("base"), root)
    for ds in out.get("datasets") or []:
        if isinstance(ds, dict):
            if "path" in ds:
                ds["path"] = resolve_local(ds["path"], root)
            if isinstance(ds.get("data_files"), list):
                ds["data_files"] = [resolve_local(f, root) for f in ds["data_files"]]
    if isinstance(out.get("sweep"), dict) and out["sweep"].get("world"):
        out["sweep"]["world"] = resolve_local(out["sweep"]["world"], root)
    return out


def absolute_local_paths(exp: TrainExperiment, cwd: str | Path | None = None) -> TrainExperiment:
    """`exp` with relative local paths (base, dataset files, a sweep's world, storage) made
    absolute against `cwd` (default: the current folder), so workers started elsewhere (Ray,
    Tune trials in their own folders) find them. Hub ids and cloud URIs are kept as written."""
    root = Path(cwd) if cwd is not None else Path.cwd()
    data = _resolve(exp.model_dump(mode="json"), root)
    sp = data["storage_path"]
    if not is_uri(sp) and not Path(sp).is_absolute():
        data["storage_path"] = str((root / sp).resolve())
    return parse_train_experiment(data, source=exp.name)


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
    return parse_train_experiment(data, source=f"{exp.name} with {overrides}")


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


def experiment_json(exp: TrainExperiment) -> dict:
    """The experiment as plain JSON data (what checkpoint manifests record)."""
    return exp.model_dump(mode="json")
