"""The `sweep:` block of a training experiment: an expert sweep over training hyperparameters.

Pure data (no torch, no ray). `SweepConfig.model_validate(yaml_dict)`; `experts/sweep.py` runs it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, model_validator

from layerswap.spaces.base import MAX_GEN_TOKS, MAX_TRIALS, BatchSize, Device, StrictModel
from layerswap.spaces.languages import LANGUAGES, WORLD_LANGUAGES, find_language
from layerswap.spaces.task_families import family, require_dev_task

ExpertKind = Literal["math", "language"]  # what an expert is for (a full/LoRA expert is its format)
EXPERT_KINDS: tuple[str, ...] = get_args(ExpertKind)


class Range(StrictModel):
    """A numeric range, sampled uniformly (or log-uniformly); ints for integer hyperparameters."""

    low: float
    """Lower bound (inclusive)."""
    high: float
    """Upper bound (inclusive)."""
    log: bool = False
    """Sample log-uniformly (needs low > 0), as for learning rates."""

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if not self.low <= self.high:
            raise ValueError(f"range low={self.low} must be <= high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log range needs low > 0, got low={self.low}")
        return self


class Choice(StrictModel):
    """A categorical choice among listed values."""

    choices: list[Any] = Field(min_length=1)
    """The values to choose among."""


Dim = Annotated[Range | Choice, Field(union_mode="left_to_right")]

# The ranges of the ICLR 2025 paper's Table 4 (the hyperparameters of its Llama 3.1 8B experts),
# as dotted paths into the experiment: learning rates 2e-8..2e-7, batch 4 or 8, weight decay
# 0.01..0.1, clip 0.5 or 1.0, warmup 300..1000 steps, beta2 0.99..0.999. They suit the real
# models; the embedded world's configs give their own `params` (tiny models want ~1e-4..1e-3).
TABLE4: dict[str, Range | Choice] = {
    "hyper.lr": Range(low=2e-8, high=2e-7, log=True),
    "hyper.batch_size": Choice(choices=[4, 8]),
    "hyper.weight_decay": Choice(choices=[0.01, 0.05, 0.1]),
    "hyper.grad_clip": Choice(choices=[0.5, 1.0]),
    "hyper.warmup_steps": Choice(choices=[300, 500, 1000]),
    "hyper.beta2": Choice(choices=[0.99, 0.995, 0.999]),
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def param_is_int(dim: Range | Choice, current: Any) -> bool:
    """Whether a parameter is sampled as an int: the experiment's value is one (or, when it is
    unset, a numeric range with integral bounds)."""
    if isinstance(dim, Choice):
        return False
    if current is None:
        return float(dim.low).is_integer() and float(dim.high).is_integer()
    return _is_int(current)


class SweepConfig(StrictModel):
    """An expert sweep: Tune trials over `params`, each checkpoint scored on its kind's indicators
    (`indicator_tasks`) into RUN/experts/registry.parquet."""

    num_samples: int = Field(4, ge=1, le=MAX_TRIALS)
    """Trials (training runs with sampled hyperparameters)."""
    seed: int = 0
    """Seeds the searcher; each trial's data seed derives from its parameters."""
    algorithm: Literal["optuna", "random"] = "optuna"
    """"optuna" (TPE, define-by-run) or "random"."""
    params: dict[str, Dim] = Field(default_factory=lambda: dict(TABLE4))
    """Ranges by dotted path into the experiment (`hyper.lr`, `mode.rank`), each {low, high[,
    log]} or {choices}; giving `params` replaces the default, the ICLR 2025 paper's Table 4."""
    indicators: list[str] | None = Field(None, min_length=1)
    """lm-eval task names each checkpoint is scored on, validation (dev) splits: never a world
    test split (None: the expert kind's defaults)."""
    global_mmlu: bool = False
    """Add Global-MMLU to a language expert's default indicators (real models only)."""
    metric: str | None = None
    """The indicator a trial reports to the searcher, a dev split like the indicators (None: the
    first indicator)."""
    max_concurrent: int = Field(1, ge=1)
    """Trials running at once."""
    checkpoints: Literal["all", "last"] = "all"
    """Score "all" of a trial's checkpoints or only its "last"."""
    top_k: int = Field(3, ge=1)
    """How many experts of each kind a merge search takes from the registry."""
    limit: int | None = Field(None, ge=1)
    """First N items of each indicator task (None: all)."""
    num_fewshot: int = Field(0, ge=0)
    """Few-shot examples in indicator prompts. Default 0-shot; the papers: MGSM 8-shot (ICLR)
    or 2-shot (follow-up), Belebele 5-shot (ICLR)."""
    max_gen_toks: int = Field(256, ge=1, le=MAX_GEN_TOKS)
    """Generation budget (tokens) of generate_until indicators such as MGSM."""
    backend: Literal["proxy", "lm_eval"] = "proxy"
    """"proxy" (the cached ProxyEvaluator, lm-eval's per-item predictions) or "lm_eval"."""
    device: Device = "auto"
    """Where checkpoints are scored: "auto" (the GPU when the trial's process sees one, else
    the CPU), "cpu" or "cuda"."""
    batch_size: BatchSize = 1
    """Rows per forward pass when scoring, or "auto"; 1 equals lm-eval's scores at batch size 1
    exactly (larger batches pad, which can move a float near-tie)."""
    executor: Literal["auto", "in_trial", "ray_train"] = "auto"
    """"in_trial" trains inside the Tune trial (1 CPU worker, no Ray Train start-up),
    "ray_train" nests the experiment's TorchTrainer, "auto" picks in_trial for one CPU worker."""
    cpus_per_trial: float = Field(1.0, gt=0)
    """CPUs a trial reserves (the nested TorchTrainer's workers reserve their own)."""
    world: str | None = None
    """Embedded-world folder whose dev tasks score the experts (None: the base model's parent
    folder when it holds world.json; otherwise lm-eval's built-in tasks)."""

    @model_validator(mode="after")
    def _metric_is_indicator(self) -> SweepConfig:
        if not self.params:
            raise ValueError("sweep.params: give at least one hyperparameter to vary")
        # The one dev-only rule (spaces/task_families.py): no test split tunes or ranks experts.
        for i, task in enumerate(self.indicators or []):
            require_dev_task(task, f"sweep.indicators[{i}]")
        if self.metric is not None:
            require_dev_task(self.metric, "sweep.metric")
        if self.metric is not None and self.indicators is not None:
            if self.metric not in self.indicators:
                raise ValueError(
                    f"sweep.metric {self.metric!r} is not one of sweep.indicators {self.indicators}"
                )
        return self

    def tasks_for(self, kind: ExpertKind, language: str, *, world: bool) -> list[str]:
        """The indicator tasks of an expert (explicit `indicators`, else the kind's defaults)."""
        if self.indicators is not None:
            return list(self.indicators)
        return indicator_tasks(kind, language, world=world, global_mmlu=self.global_mmlu)

    def metric_for(self, kind: ExpertKind, language: str, *, world: bool) -> str:
        """The task whose score a trial reports to the searcher."""
        tasks = self.tasks_for(kind, language, world=world)
        if self.metric is None:
            return tasks[0]
        if self.metric not in tasks:
            raise ValueError(f"sweep.metric {self.metric!r} is not one of the indicators {tasks}")
        return self.metric

    def int_params(self, experiment: dict) -> set[str]:
        """Dotted paths sampled as ints, checked against the experiment's values.

        Args:
            experiment: the experiment as JSON data (`TrainExperiment.model_dump(mode="json")`).
        Returns:
            the paths whose current value is an int (or unset with integral range bounds).
        Raises:
            ValueError: naming a path that is not a field, or an int field with fractional bounds.
        """
        out = set()
        for path, dim in self.params.items():
            node: Any = experiment
            for part in path.split("."):
                if not isinstance(node, dict) or part not in node:
                    raise ValueError(f"sweep.params: {path!r} is not a field of the experiment")
                node = node[part]
            if param_is_int(dim, node):
                if not (float(dim.low).is_integer() and float(dim.high).is_integer()):
                    raise ValueError(
                        f"sweep.params.{path}: integer field needs integer bounds, "
                        f"got {dim.low}..{dim.high}"
                    )
                out.add(path)
        return out

    def suggest(self, trial, int_params: set[str]) -> None:
        """Optuna define-by-run space (duck-typed `optuna.Trial`; used by OptunaSearch).

        Args:
            trial: the Optuna trial.
            int_params: dotted paths sampled as ints (see `param_is_int`).
        """
        for name, dim in self.params.items():
            if isinstance(dim, Choice):
                trial.suggest_categorical(name, list(dim.choices))
            elif name in int_params:
                trial.suggest_int(name, int(dim.low), int(dim.high), log=dim.log)
            else:
                trial.suggest_float(name, float(dim.low), float(dim.high), log=dim.log)


# Real-model indicator tasks per language code (ISO 639-1 or 639-3, as experiments write them):
# (Belebele FLORES code, Global-MMLU code), from the one language table (spaces/languages.py).
LANG_CODES: dict[str, tuple[str, str]] = {
    code: (lang.nllb, lang.gmmlu)
    for lang in LANGUAGES.values()
    for code in (lang.code, *lang.aliases)
}


def indicator_tasks(
    kind: ExpertKind, language: str, *, world: bool, global_mmlu: bool = False
) -> list[str]:
    """The merging indicators of an expert (follow-up paper §5), as lm-eval task names.

    A math expert is scored on English MGSM, a language expert on target-language Belebele
    (plus Global-MMLU when asked, real models only). World experts use the world's dev splits.
    Real models use lm-eval's built-in tasks; note that `mgsm_direct_en` shares its problems
    with the target-language MGSM test set, so pass `indicators:` explicitly (e.g. a GSM8K
    split) when that overlap matters.

    Args:
        kind: "math" or "language".
        language: the expert's language code (world: en/xa/xb; real: e.g. sw or swh).
        world: the embedded world (dev-split tasks) or real models (built-in tasks).
        global_mmlu: add global_mmlu_full_<code> for a real language expert.
    Returns:
        task names, the first one being the default sweep metric.
    """
    if kind not in EXPERT_KINDS:
        raise ValueError(f"unknown expert kind {kind!r} (expected 'math' or 'language')")
    if world:
        if language not in WORLD_LANGUAGES:
            raise ValueError(
                f"world language {language!r} unknown (have {sorted(WORLD_LANGUAGES)})"
            )
        if global_mmlu:
            raise ValueError("sweep.global_mmlu: the embedded world has no Global-MMLU")
        if kind == "math":
            return [family("mgsm").world_task("en", "dev")]
        return [family("belebele").world_task(language, "dev")]
    if kind == "math":
        return ["mgsm_direct_en"]
    if (lang := find_language(language)) is None:  # any spelling the language check accepts
        raise ValueError(
            f"language {language!r}: no default Belebele task (known: {sorted(LANG_CODES)}); "
            f"give sweep.indicators explicitly"
        )
    bele, gmmlu = lang.nllb, lang.gmmlu
    tasks = [f"belebele_{bele}"]
    if global_mmlu:
        tasks.append(f"global_mmlu_full_{gmmlu}")
    return tasks
