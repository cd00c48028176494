"""The merge-search experiment: experts, proxies, objective, space, budget, fidelity, promotion.

`load_search_experiment("search.yaml")` validates the YAML once (pydantic, extra="forbid"); run it with
`layerswap search search.yaml [--resume]`. Pure data: no torch, no ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, model_validator

from layerswap.spaces.base import BatchSize, Device, StrictModel, load_yaml, resolve_local, validate
from layerswap.spaces.search_space import SearchSpace


class RegistrySource(StrictModel):
    """Experts from RUN/experts/registry.parquet: the top_k of each kind by an indicator column."""

    registry: str
    top_k: int = Field(2, ge=1)
    language: str | None = None  # language experts of this language (default: the target's)
    task_indicator: str | None = None  # e.g. ind__world_mgsm_direct_en_dev (default: first ind__)
    language_indicator: str | None = None


class Proxy(StrictModel):
    """One proxy task and how it enters the objective: weight * (score - chance) / (best - chance).

    The task's reported metric (trainables/evaluate/scoring) is read on its own scale: per item
    it lies between `worst` and `best`, and `best` may be the lower end, for a lower-is-better
    metric such as lm-eval's multiple-choice `brier_score` (best 0, worst 2, chance 0.75 for four
    options). Accuracy-like metrics keep the defaults (worst 0, best 1).
    """

    task: str
    weight: float = Field(1.0, ge=0)
    chance: float = Field(0.0, allow_inf_nan=False)  # the score of guessing; normalises to 0
    best: float = Field(1.0, allow_inf_nan=False)  # the best per-item score; normalises to 1
    # the other end of the per-item range (bounds screening, search.trial)
    worst: float = Field(0.0, allow_inf_nan=False)
    num_fewshot: int = Field(0, ge=0)  # in-context examples (lm-eval num_fewshot)

    @model_validator(mode="after")
    def _scale(self) -> Proxy:
        lo, hi = sorted((self.worst, self.best))
        if lo == hi:
            raise ValueError(f"proxy {self.task}: best {self.best} equals worst {self.worst}")
        if not lo <= self.chance <= hi or self.chance == self.best:
            raise ValueError(
                f"proxy {self.task}: chance {self.chance} must lie between worst {self.worst} "
                f"and best {self.best}, and differ from best"
            )
        return self

    @property
    def lower_is_better(self) -> bool:
        return self.best < self.worst

    def normalise(self, score: float) -> float:
        """`score` on the objective's scale: chance 0, best 1."""
        return (score - self.chance) / (self.best - self.chance)

    def to_unit(self, score: float) -> float:
        """`score` on [0, 1] with 1 best: the scale of a per-item Hoeffding bound."""
        return (score - self.worst) / (self.best - self.worst)

    def from_unit(self, u: float) -> float:
        """Inverse of `to_unit`."""
        return self.worst + u * (self.best - self.worst)


class Fidelity(StrictModel):
    """Early rejection inside a trial (see search/search.py): screen a prefix, maybe stop.

    A trial scores `screen` of every proxy's items first; if even a Hoeffding upper bound (at
    confidence 1 - delta) of its full-fidelity objective is below the `keep_top`-th best full
    objective so far, it stops and is told to Optuna as PRUNED, never as a completed value.
    """

    screen: float | None = Field(0.25, gt=0, lt=1)
    delta: float = Field(0.05, gt=0, lt=1)
    keep_top: int = Field(3, ge=1)


class ProxyEvalSettings(StrictModel):
    limit: int | None = Field(None, ge=1)  # first N dev docs per proxy (None: all)
    max_gen_toks: int = Field(32, ge=1)
    # 1 reproduces lm-eval's HFLM at batch size 1 token for token; larger batches are padded,
    # which can move a float near-tie (see trainables/evaluate/proxy_lm.py).
    batch_size: BatchSize = "auto"


class SearchSettings(StrictModel):
    num_samples: int = Field(20, ge=1)
    seed: int = 0
    max_concurrent: int | None = Field(None, ge=1)  # default: cluster CPUs // cpus_per_trial
    cpus_per_trial: float = Field(1.0, gt=0)
    # GPUs per trial: a fraction shares one GPU between trials (0.5: two per GPU); 0: CPU only.
    gpus_per_trial: float = Field(0.0, ge=0)
    # Where trials hold the experts: "node" (once per node, in Ray's shared object store),
    # "process" (each trial process loads its own), "auto" (node when several trials share a
    # node). On a GPU the experts also stay on the device when they fit (trial results say).
    expert_store: Literal["auto", "node", "process"] = "auto"
    torch_threads: int = Field(1, ge=1)
    multi_objective: bool = False  # Pareto over the proxies instead of their weighted mean
    # Extra warm-start points (Optuna params), evaluated after the paper default.
    points_to_evaluate: list[dict] = Field(default_factory=list)
    fidelity: Fidelity = Fidelity()
    # Times Tune runs a trial again when its process or its node dies (a lost node, an OOM
    # kill); the retry lands on a surviving node. A trial's own errors are failed rows and are
    # never retried (search/trial.py never raises).
    max_failures: int = Field(2, ge=0)

    @model_validator(mode="after")
    def _whole_or_fraction(self) -> SearchSettings:
        g = self.gpus_per_trial
        if g > 1 and g != int(g):
            raise ValueError(f"gpus_per_trial {g}: a fraction of one GPU or a whole number")
        return self


# The reference models promotion evaluates beside the searched recipes.
Baseline = Literal["base", "experts", "soup_uniform", "soup_magnitude", "ties", "paper_default"]
BASELINES: tuple[str, ...] = get_args(Baseline)


class PromoteSettings(StrictModel):
    top_k: int = Field(3, ge=1)
    limit: int | None = Field(None, ge=1)  # lm-eval docs per task (None: all)
    max_gen_toks: int = Field(32, ge=1)
    batch_size: BatchSize = 16  # lm-eval HFLM batch size ("auto": lm-eval's own search)
    device: Device = "auto"
    # The target task's shots (None: the task's own default). 0 like the proxies' default, so
    # target and proxies share one lm-eval run per model.
    num_fewshot: int | None = Field(0, ge=0)
    baselines: list[Baseline] = Field(default_factory=lambda: list(BASELINES))
    ties_density: float = Field(0.2, gt=0, le=1)
    select_by: Literal["proxy", "target"] = "proxy"  # "target" picks the best on the test split
    write_best: bool = True


class SearchExperiment(StrictModel):
    """A merge search on one target language."""

    name: str = Field("search", pattern=r"^[A-Za-z0-9_.-]+$")
    language: str  # target language code, e.g. "xa" or "sw"
    base: str | None = None
    task_experts: list[str] = Field(default_factory=list)
    language_experts: list[str] = Field(default_factory=list)
    experts: RegistrySource | None = None
    world: str | None = None  # an embedded world folder: its lm-eval tasks are added
    include_path: list[str] = Field(default_factory=list)  # extra task YAML folders
    proxies: list[Proxy] | None = None  # default: world_proxies (target Belebele dev, Brier)
    target: str | None = None  # default: world_mgsm_direct_<language> (test split)
    space: SearchSpace = SearchSpace()
    search: SearchSettings = SearchSettings()
    proxy_eval: ProxyEvalSettings = ProxyEvalSettings()
    promote: PromoteSettings = PromoteSettings()

    @model_validator(mode="after")
    def _valid(self) -> SearchExperiment:
        explicit = bool(self.task_experts) or bool(self.language_experts)
        if explicit and self.experts is not None:
            raise ValueError("give either task_experts/language_experts or experts.registry")
        if self.experts is None and not (self.task_experts and self.language_experts):
            raise ValueError("task_experts and language_experts: at least one of each needed")
        if self.target_task in {p.task for p in self.proxy_list}:
            raise ValueError(f"target {self.target_task!r} must not be a proxy")
        for i, p in enumerate(self.proxies or []):
            if p.task.startswith("world_") and not p.task.endswith("_dev"):
                raise ValueError(
                    f"proxies[{i}].task {p.task!r}: a world test split; the search scores dev "
                    f"splits only (use {p.task}_dev)"
                )
        if "magnitude" in self.space.weighting and self.base is None:
            raise ValueError("space.weighting magnitude needs `base`")
        return self

    @property
    def proxy_list(self) -> list[Proxy]:
        if self.proxies is not None:
            return list(self.proxies)
        return world_proxies(self.language)

    @property
    def target_task(self) -> str:
        return self.target or f"world_mgsm_direct_{self.language}"


def world_readings(language: str) -> dict[str, Proxy]:
    """Every world dev reading a search may use as a proxy, by task, each on its own scale:
    `language`'s Belebele accuracy (chance 0.25), the same items' Brier score (lm-eval's
    brier_score: chance 0.75, best 0, worst 2) and English MGSM (exact match)."""
    readings = [
        Proxy(task=f"world_belebele_{language}_dev", chance=0.25),
        Proxy(task=f"world_belebele_brier_{language}_dev", chance=0.75, best=0.0, worst=2.0),
        Proxy(task="world_mgsm_direct_en_dev"),
    ]
    return {p.task: p for p in readings}


def world_proxies(language: str) -> list[Proxy]:
    """The default proxy on the embedded world: `language`'s Belebele dev, Brier-scored.

    Why not the follow-up paper's two indicators (target Belebele accuracy, English MGSM)? The
    paper reads them per expert, to choose experts (the expert registry does: search/pool.py).
    Across the merges of one pair of experts, measured on v4 seeds 0 and 1 (README, "The
    embedded world"): English MGSM falls as language layers come in while xa MGSM rises
    (Spearman with xa MGSM test -0.23 and -0.42), and xa Belebele accuracy saturates at 1.00
    for most swaps of seed 0; the Brier score of the same items keeps ranking them (+0.56,
    +0.45). The space's bounds keep the math expert's middle layers in every candidate.
    """
    return [world_readings(language)[f"world_belebele_brier_{language}_dev"]]


def heldout_task(task: str) -> str:
    """The test-split variant of a world dev task (`..._dev` -> `...`); others unchanged."""
    return task[: -len("_dev")] if task.endswith("_dev") else task


def resolve_paths(data: dict, root: Path) -> dict:
    """Input paths by the one path rule (spaces.base.resolve_local)."""
    out = dict(data)
    for key in ("base", "world"):
        if out.get(key) is not None:
            out[key] = resolve_local(out[key], root)
    for key in ("task_experts", "language_experts", "include_path"):
        if isinstance(out.get(key), list):
            out[key] = [resolve_local(p, root) for p in out[key]]
    if isinstance(out.get("experts"), dict) and "registry" in out["experts"]:
        out["experts"] = {**out["experts"], "registry": resolve_local(out["experts"]["registry"], root)}  # fmt: skip
    return out


def load_search_experiment(path: str | Path) -> SearchExperiment:
    """Read and validate a search experiment YAML (paths: spaces.base.resolve_local, against the
    file's folder, then the working directory; what exists in neither is kept, e.g. Hub ids).

    Raises:
        ValueError naming the file and every offending field.
    """
    path = Path(path)
    data = load_yaml(path, "experiment")
    if isinstance(data, dict):
        # Then what names a local path only from the working directory is made absolute too:
        # Tune runs each trial in a folder of its own.
        data = resolve_paths(resolve_paths(data, path.parent), Path.cwd())
    return validate(
        SearchExperiment,
        data,
        source=str(path),
        what="search experiment",
        not_a_mapping=f"{path}: expected a mapping",
    )
