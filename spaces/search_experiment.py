"""The merge-search experiment: experts, proxies, objective, space, budget, fidelity, promotion.

`load_search_experiment("search.yaml")` validates the YAML once (pydantic, extra="forbid"); run it with
`layerswap search search.yaml [--resume]`. Pure data: no torch, no ray.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from layerswap.spaces.base import (
    MAX_GEN_TOKS,
    MAX_TRIALS,
    BatchSize,
    Device,
    StrictModel,
    load_yaml,
    resolve_local,
    validate,
)
from layerswap.spaces.search_space import SearchSpace
from layerswap.spaces.task_families import family, require_dev_task


class RegistrySource(StrictModel):
    """Experts from RUN/experts/registry.parquet: the top_k of each kind by an indicator column."""

    registry: str
    """The registry.parquet file (RUN/experts/registry.parquet) that expert sweeps wrote."""
    top_k: int = Field(2, ge=1)
    """Best experts taken of each kind."""
    language: str | None = None
    """Take language experts of this language (None: the search's target language)."""
    task_indicator: str | None = None
    """Indicator column ranking task experts, e.g. ind__world_mgsm_direct_en_dev, a dev split
    (never a world test split or the search's target; None: English MGSM dev when present, else
    the first indicator column that is neither)."""
    language_indicator: str | None = None
    """Indicator column ranking language experts, a dev split (None: the target's Belebele dev
    when present, else the first indicator column that is neither a world test split nor the
    search's target)."""

    @model_validator(mode="after")
    def _dev_indicators(self) -> RegistrySource:
        # A world test split never ranks experts; the search's target is checked by the search.
        for side, ind in self.indicators().items():
            require_dev_task(ind, f"experts.{side}_indicator")
        return self

    def indicators(self) -> dict[str, str]:
        """The indicators given, by side ("task", "language"), as written."""
        given = {"task": self.task_indicator, "language": self.language_indicator}
        return {side: ind for side, ind in given.items() if ind is not None}


class Proxy(StrictModel):
    """One proxy task and how it enters the objective: weight * (score - chance) / (best - chance).

    The task's reported metric (trainables/evaluate/scoring) is read on its own scale: per item
    it lies between `worst` and `best`, and `best` may be the lower end, for a lower-is-better
    metric such as lm-eval's multiple-choice `brier_score` (best 0, worst 2, chance 0.75 for four
    options). Accuracy-like metrics keep the defaults (worst 0, best 1).
    """

    task: str
    """The lm-eval task name (a dev split; world tasks end in `_dev`)."""
    weight: float = Field(1.0, ge=0)
    """Its weight in the objective's weighted mean."""
    chance: float = Field(0.0, allow_inf_nan=False)
    """The score of guessing; normalises to 0."""
    best: float = Field(1.0, allow_inf_nan=False)
    """The best per-item score; normalises to 1."""
    worst: float = Field(0.0, allow_inf_nan=False)
    """The other end of the per-item range (bounds early rejection, `search.fidelity`)."""
    num_fewshot: int = Field(0, ge=0)
    """In-context examples in each prompt (lm-eval num_fewshot). Default 0-shot; the papers:
    MGSM 8-shot (ICLR) or 2-shot (follow-up), Belebele 5-shot (ICLR)."""

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


FidelityPolicy = Literal["none", "screen", "halving"]


class Fidelity(StrictModel):
    """Early stopping inside a trial on growing shares of the proxies' items (search/fidelity.py).

    Every trial of a search scores the same items in the same seeded order, rung by rung; a trial
    that stops early is told to Optuna as PRUNED with its rung values as intermediate values, never
    as a completed value. "screen": after `screen` of the items, stop when even a Hoeffding upper
    bound (confidence 1 - delta) of the full objective is below the `keep_top`-th best full
    objective so far. "halving": successive halving over `rungs`; after each, go on only when the
    objective there is among the best 1/`eta` of the earlier trials' at that rung.
    """

    # halving by measurement: on the world grids it reached a top-5 % recipe with 0.39-0.66 of the
    # items plain TPE scored, same hit rate; screening never stopped a trial there
    # (benchmarks/search_replay.py, docs/guides/search.md).
    policy: FidelityPolicy = "halving"
    """How a trial may stop early: "halving" (successive halving), "screen" or "none" (every
    item)."""
    screen: float | None = Field(0.25, gt=0, lt=1)
    """"screen": share of every proxy's items scored first (None without a policy: "none")."""
    delta: float = Field(0.05, gt=0, lt=1)
    """"screen": the bound's confidence is 1 - delta."""
    keep_top: int = Field(3, ge=1)
    """"screen": a trial stops only when its bound is below the keep_top-th best full objective."""
    rungs: list[float] = Field(default_factory=lambda: [0.125, 0.25, 0.5], min_length=1)
    """"halving": the shares of items after which a trial may stop, increasing, each in (0, 1)."""
    eta: int = Field(3, ge=2)
    """"halving": the best 1/eta of the trials at a rung go on (decided once eta trials got there)."""

    @model_validator(mode="before")
    @classmethod
    def _screen_none_is_no_policy(cls, data):
        # `screen: null` meant "no early stop" before `policy` existed; it still does.
        if isinstance(data, dict) and "screen" in data and data["screen"] is None:
            policy = data.get("policy", "none")
            if policy == "screen":
                raise ValueError("fidelity: policy 'screen' needs a screen share, got screen: null")
            data = {**data, "policy": policy}
        return data

    @model_validator(mode="after")
    def _rungs_increase(self) -> Fidelity:
        r = self.rungs
        if any(not 0 < s < 1 for s in r) or any(a >= b for a, b in pairwise(r)):
            raise ValueError(f"fidelity.rungs must increase within (0, 1), got {r}")
        return self


class ProxyEvalSettings(StrictModel):
    """How trials score the proxies (the cached in-process evaluator)."""

    limit: int | None = Field(None, ge=1)
    """First N dev items of each proxy (None: all)."""
    max_gen_toks: int = Field(32, ge=1, le=MAX_GEN_TOKS)
    """Generation budget (tokens) of generate_until proxies."""
    # 1 reproduces lm-eval's HFLM at batch size 1 token for token; larger batches are padded,
    # which can move a float near-tie (see trainables/evaluate/proxy_lm.py).
    batch_size: BatchSize = "auto"
    """Rows per forward pass, or "auto" (the largest that fits the device)."""


class SearchSettings(StrictModel):
    """The Tune + Optuna run: budget, seed, resources per trial."""

    num_samples: int = Field(20, ge=1, le=MAX_TRIALS)
    """Trials (merge candidates scored), the paper default first."""
    seed: int = 0
    """Seeds the Optuna sampler."""
    max_concurrent: int | None = Field(None, ge=1)
    """Trials running at once (None: as many as the cluster's CPUs and GPUs hold, at most a
    quarter of num_samples: TPE proposes each trial from the results in so far, and with the whole
    budget at once it would propose every trial blind, i.e. search at random)."""
    reproducible: bool = True
    """Propose a batch of trials at a time (max_concurrent, else a quarter of num_samples; never
    the cluster's CPUs) and tell Optuna their results in trial order once all of them finished,
    so the same seed and config give the same trials and scores whatever order trials finish
    in and on any cluster; False: propose each trial as soon as a slot frees (no idle slot while
    a batch's slowest trial runs, but the search depends on the finishing order)."""
    cpus_per_trial: float = Field(1.0, gt=0)
    """CPUs a trial reserves."""
    gpus_per_trial: float = Field(0.0, ge=0)
    """GPUs a trial reserves: a fraction shares one GPU (0.5: two trials per GPU); 0: CPU only;
    at most 1 (a trial composes and scores one model on one device)."""
    # On a GPU the experts also stay on the device when they fit (trial results say).
    expert_store: Literal["auto", "node", "process"] = "auto"
    """Where trials hold the experts: "node" (once per node, in Ray's object store), "process"
    (each trial process loads its own), "auto" (node when several trials share a node)."""
    torch_threads: int = Field(1, ge=1)
    """torch CPU threads in each trial process."""
    multi_objective: bool = False
    """Search the Pareto front over the proxies instead of their weighted mean."""
    points_to_evaluate: list[dict] = Field(default_factory=list)
    """Extra warm-start points (Optuna params), evaluated after the paper default."""
    fidelity: Fidelity = Fidelity()
    """Early rejection of poor candidates inside a trial."""
    # A trial's own errors are failed rows and are never retried (search/trial.py never raises).
    max_failures: int = Field(2, ge=0)
    """Times Tune reruns a trial whose process or node died (a lost node, an OOM kill)."""

    @field_validator("gpus_per_trial")
    @classmethod
    def _one_device(cls, g: float) -> float:
        # A trial builds its model on one device (search/tune_trial.py: "cuda", the first GPU
        # Ray gave it): a second GPU would be reserved and sit idle, halving the trials at once.
        if g > 1:
            raise ValueError(f"gpus_per_trial {g}: a trial scores one model on one GPU; give it 1 at most (a fraction shares one GPU between trials)")  # fmt: skip
        return g


# The reference models promotion evaluates beside the searched recipes.
Baseline = Literal["base", "experts", "soup_uniform", "soup_magnitude", "ties", "paper_default"]
BASELINES: tuple[str, ...] = get_args(Baseline)


class PromoteSettings(StrictModel):
    """Promotion after the search: the best recipes and baselines evaluated with lm-eval."""

    top_k: int = Field(3, ge=1)
    """Best recipes (by proxy objective) merged and evaluated on the target."""
    limit: int | None = Field(None, ge=1)
    """lm-eval items per task (None: all)."""
    max_gen_toks: int = Field(32, ge=1, le=MAX_GEN_TOKS)
    """Generation budget (tokens) of generate_until tasks."""
    batch_size: BatchSize = 16
    """lm-eval HFLM batch size ("auto": lm-eval's own search)."""
    device: Device = "auto"
    """Where models are evaluated: "auto" (the GPU when there is one), "cpu" or "cuda"."""
    # 0 like the proxies' default, so target and proxies share one lm-eval run per model.
    num_fewshot: int | None = Field(0, ge=0)
    """Few-shot examples for the target task (None: the task's own default). Default 0-shot;
    the papers report MGSM 8-shot (ICLR) or 2-shot (follow-up)."""
    baselines: list[Baseline] = Field(default_factory=lambda: list(BASELINES))
    """Reference models evaluated beside the recipes."""
    baseline_pairs: Literal["all", "first"] = "all"
    """Expert pairs the merged baselines (soups, TIES, paper default) are built from: "all" (every
    task x language pair of the pool, as the ICLR paper's "best config, 9 pairs"; the leaderboard
    gives each one's best pair and mean) or "first" (the first task and language expert only)."""
    ties_density: float = Field(0.2, gt=0, le=1)
    """TIES density of the "ties" baseline."""
    select_by: Literal["proxy", "target"] = "proxy"
    """How the best model is chosen: by proxy objective, or "target" (the test split decides)."""
    write_best: bool = True
    """Write the chosen model to RUN/best."""


class SearchExperiment(StrictModel):
    """A merge search on one target language."""

    name: str = Field("search", pattern=r"^[A-Za-z0-9_.-]+$")
    """The search's name (the Optuna study's and Tune experiment's)."""
    language: str
    """Target language code, e.g. "xa" or "sw"."""
    base: str | None = None
    """The base checkpoint the experts share (needed by magnitude weighting and LoRA experts)."""
    task_experts: list[str] = Field(default_factory=list)
    """Task (math) expert checkpoints; or give `experts` instead."""
    language_experts: list[str] = Field(default_factory=list)
    """Language expert checkpoints; or give `experts` instead."""
    experts: RegistrySource | None = None
    """Take the experts from an expert registry instead of listing them."""
    world: str | None = None
    """An embedded world folder: its lm-eval tasks are added."""
    include_path: list[str] = Field(default_factory=list)
    """Extra lm-eval task YAML folders."""
    proxies: list[Proxy] | None = None
    """The dev tasks trials are scored on (None: the target's world Belebele dev, Brier score)."""
    target: str | None = None
    """The held-out test task promotion reports (None: world_mgsm_direct_<language>)."""
    space: SearchSpace = SearchSpace()
    """What the search may vary."""
    search: SearchSettings = SearchSettings()
    """Budget and resources of the Tune run."""
    proxy_eval: ProxyEvalSettings = ProxyEvalSettings()
    """How trials score the proxies."""
    promote: PromoteSettings = PromoteSettings()
    """What promotion evaluates after the search."""

    @model_validator(mode="after")
    def _valid(self) -> SearchExperiment:
        explicit = bool(self.task_experts) or bool(self.language_experts)
        if explicit and self.experts is not None:
            raise ValueError("give either task_experts/language_experts or experts.registry")
        if self.experts is None and not (self.task_experts and self.language_experts):
            raise ValueError("task_experts and language_experts: at least one of each needed")
        # The one dev-only rule (spaces/task_families.py), on all that guides the search.
        for i, p in enumerate(self.proxy_list):
            where = f"proxies[{i}].task" if self.proxies is not None else "proxies (the default)"
            require_dev_task(p.task, where, self.target_task)
        for side, ind in (self.experts.indicators() if self.experts else {}).items():
            require_dev_task(ind, f"experts.{side}_indicator", self.target_task)
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
        return self.target or family("mgsm").world_task(self.language)

    def explicit(self) -> SearchExperiment:
        """This experiment with its proxies spelled out (the world default resolved): what a
        search saves as RUN/search/experiment.json and what its identity hashes."""
        return self.model_copy(update={"proxies": self.proxy_list})


def world_readings(language: str) -> dict[str, Proxy]:
    """Every world dev reading a search may use as a proxy, by task, each on its own scale:
    `language`'s Belebele accuracy (chance 0.25), the same items' Brier score (lm-eval's
    brier_score: chance 0.75, best 0, worst 2) and English MGSM (exact match)."""
    bele, mgsm = family("belebele"), family("mgsm")
    readings = [
        Proxy(task=bele.world_task(language, "dev"), chance=0.25),
        Proxy(task=_brier(language), chance=0.75, best=0.0, worst=2.0),
        Proxy(task=mgsm.world_task("en", "dev")),
    ]
    return {p.task: p for p in readings}


def world_proxies(language: str) -> list[Proxy]:
    """The default proxy on the embedded world: `language`'s Belebele dev, Brier-scored.

    Why not the follow-up paper's two indicators (target Belebele accuracy, English MGSM)? The
    paper reads them per expert, to choose experts (the expert registry does: search/pool.py).
    Across the merges of one pair of experts, measured on v4 seeds 0 and 1
    (docs/world/index.md, "The search's proxy"): English MGSM falls as language layers come in
    while xa MGSM rises (Spearman with xa MGSM test -0.23 and -0.42), and xa Belebele accuracy
    saturates at 1.00 for most swaps of seed 0; the Brier score of the same items keeps ranking
    them (+0.56, +0.45). The space's bounds keep the math expert's middle layers in every
    candidate.
    """
    return [world_readings(language)[_brier(language)]]


def _brier(language: str) -> str:
    """`language`'s Brier-scored world Belebele dev task."""
    return family("belebele").world_task(language, "dev", stem="world_belebele_brier")


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
