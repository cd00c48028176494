"""One merge-search trial as plain functions: compose a recipe in memory, score proxies on dev splits.

`TrialRunner(experiment, pool, include_path).run(recipe, reject_below=None) -> TrialResult`; the
Ray Tune wrapper (search/tune_trial.py) keeps one runner per worker process.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial

import torch

from layerswap.search.fidelity import Policy, hoeffding_upper, policy_of, rung_spans, stops
from layerswap.spaces.recipe import Recipe
from layerswap.spaces.search_experiment import Proxy, SearchExperiment
from layerswap.spaces.search_space import ExpertPool
from layerswap.trainables.devices import check_cpu_size
from layerswap.trainables.evaluate.lm_eval_api import single_configs, task_index
from layerswap.trainables.evaluate.proxy import ProxyEvaluator
from layerswap.trainables.evaluate.scoring import (
    aggregate_score,
    config_higher_is_better,
    task_higher_is_better,
)
from layerswap.trainables.evaluate.task_data import require_own_data
from layerswap.trainables.evaluate.tasks import write_world_tasks
from layerswap.trainables.merge.live import ExpertCache, LiveModel, Loader
from layerswap.trainables.storage import local_copy


@dataclass
class TrialResult:
    """What a trial reports. status: "ok" | "failed" | "pruned" (stopped after screening)."""

    status: str
    proxies: dict[str, float] = field(default_factory=dict)
    objective: float | None = None
    objectives: list[float] | None = None  # per-proxy normalised scores (multi-objective)
    fidelity: int = 0  # items scored per proxy (the largest proxy's count)
    upper_bound: float | None = None  # the last rung's Hoeffding bound on the full objective
    rungs: list[list] = field(default_factory=list)  # [items, objective] per rung scored
    items_scored: int = 0  # items scored over all proxies (what the trial cost)
    t_compose_s: float = 0.0
    t_eval_s: float = 0.0
    t_total_s: float = 0.0
    moved: int = 0  # tensors swapped into the live model
    t_move_s: float = 0.0  # of t_compose_s: copying expert tensors to the device
    device: str = "cpu"  # where the live model ran
    placement: str = ""  # where the experts were held (LiveModel.placement)
    error: str | None = None
    splits_read: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def combine(proxies: list[Proxy], scores: dict[str, float]) -> tuple[float, list[float]]:
    """Weighted mean of chance-normalised scores, and the per-proxy normalised scores."""
    norm = [p.normalise(scores[p.task]) for p in proxies]
    total = sum(p.weight for p in proxies) or 1.0
    return sum(p.weight * v for p, v in zip(proxies, norm, strict=True)) / total, norm


def check_direction(proxy: Proxy, metric: str, higher_is_better: bool) -> None:
    """Refuse a proxy whose scale points the wrong way for its lm-eval metric.

    Raises:
        ValueError: e.g. a `brier_score` task (lower is better) with best above worst.
    """
    if higher_is_better == proxy.lower_is_better:
        way = "higher" if higher_is_better else "lower"
        raise ValueError(
            f"proxy {proxy.task}: lm-eval's {metric} is {way}-is-better, but the proxy has best "
            f"{proxy.best} and worst {proxy.worst} (set best and worst the other way round)"
        )


def check_proxy_scales(experiment: SearchExperiment) -> None:
    """Before a search starts: every proxy's scale points the way its lm-eval metric does, the
    target is higher-is-better (promotion and analysis rank models by it larger-first), and no
    proxy reads the target's test data under another name (trainables/evaluate/task_data.py:
    same dataset_path, dataset_name and split, or the same data file).

    Reads the tasks' configs only (no data; world tasks written to a temporary folder, so
    nothing is written beside the run). The trials check again on the loaded tasks (TrialRunner:
    also for callers that skip the driver, such as the benchmarks).

    Raises:
        ValueError: naming the proxy (its metric, best and worst), a proxy that is a group or a
            tag, a proxy reading the target's test data (the shared split), or a
            lower-is-better target.
    """
    import tempfile
    from pathlib import Path

    proxies = experiment.proxy_list
    names = [p.task for p in proxies]
    with tempfile.TemporaryDirectory(prefix="layerswap-tasks-") as tmp:
        paths = list(experiment.include_path)
        if experiment.world is not None:
            write_world_tasks(Path(experiment.world), Path(tmp))
            paths.insert(0, tmp)
        index = task_index([*names, experiment.target_task], paths)
    configs = single_configs(index, [*names, experiment.target_task])
    default = "" if experiment.proxies is not None else " (the default)"
    fields = [(f"proxies[{i}].task{default}", name) for i, name in enumerate(names)]
    require_own_data(fields, experiment.target_task, index)
    for p in proxies:
        if configs[p.task] is None:
            raise ValueError(f"proxy {p.task}: a group or tag of tasks; a proxy is one task")
        check_direction(p, *config_higher_is_better(configs[p.task], p.task))
    target = configs[experiment.target_task]
    if target is not None:
        metric, up = config_higher_is_better(target, experiment.target_task)
        if not up:
            raise ValueError(
                f"target {experiment.target_task}: lm-eval's {metric} is lower-is-better; "
                "promotion ranks models by the target larger-first"
            )


class TrialRunner:
    """Expert cache + one live model + cached proxy evaluators, reused across trials.

    Args:
        experiment: the validated search experiment (proxies, fidelity, eval settings).
        pool: the experts (paths) the recipes refer to.
        include_path: task YAML folders holding the proxy tasks.
        device: where the live model runs ("cpu", "cuda").
        loader: where expert states come from (default: this process reads the files).
    """

    def __init__(
        self,
        experiment: SearchExperiment,
        pool: ExpertPool,
        include_path: list[str],
        *,
        device: str = "cpu",
        loader: Loader | None = None,
    ):
        from transformers import AutoTokenizer

        self.exp = experiment
        self.pool = pool
        torch.set_num_threads(experiment.search.torch_threads)
        self.cache = ExpertCache(pool.base, loader)
        self.tokenizer = AutoTokenizer.from_pretrained(str(local_copy(pool.task[0].path)))
        pe = experiment.proxy_eval
        names = [p.task for p in experiment.proxy_list]
        kw = dict(include_path=include_path, gen_kwargs={"max_gen_toks": pe.max_gen_toks})
        kw |= dict(batch_size=pe.batch_size, seed=experiment.search.seed)
        kw |= dict(num_fewshot={p.task: p.num_fewshot for p in experiment.proxy_list})
        full = ProxyEvaluator(names, self.tokenizer, limit=pe.limit, **kw)
        for p in experiment.proxy_list:
            check_direction(p, *task_higher_is_better(full.tasks[p.task].task))
        self.n_items = {t: len(c.items) for t, c in full.tasks.items()}
        self.policy = policy_of(experiment.search.fidelity, experiment.search.multi_objective)
        self.parts = _rung_evaluators(full, self.policy.shares(experiment.search.fidelity))
        # The full evaluator only listed the items (its reads are logged; it never scores).
        self._access = [full.access_log] if self.parts[0] is not full else []
        t0 = time.perf_counter()
        share = experiment.search.gpus_per_trial or 1.0
        self.live = LiveModel(self.cache, pool, device, gpu_share=share)
        n_params = sum(p.numel() for p in self.live.model.parameters())
        check_cpu_size(n_params, str(self.live.device), f"search trial of {pool.base or pool.task[0].path}")  # fmt: skip
        self.t_setup_s = time.perf_counter() - t0

    @property
    def model(self):
        return self.live.model

    def splits_read(self) -> set[tuple[str, str]]:
        """Every (task, split) any of the evaluators read (the target test split must not appear)."""
        out = {(a.task, a.split) for log in self._access for a in log}
        for ev in self.parts:
            out |= ev.splits_read()
        return out

    def load(self, recipe: Recipe) -> int:
        """Make the live model equal to `recipe` (see LiveModel.load); returns tensors moved."""
        return self.live.load(recipe)

    def _score(self, ev) -> dict[str, tuple[float, int]]:
        res = ev.score(self.model, 1.0)
        out = {}
        for task, items in res.items.items():
            out[task] = (aggregate_score(ev.tasks[task].task, res.aggregate[task]), len(items))
        return out

    def run(self, recipe: Recipe, gates: list[float | None] | None = None) -> TrialResult:
        """Compose, load and score one recipe; never raises (a failure is a failed result).

        Args:
            recipe: the candidate.
            gates: per non-final rung, the value the trial must reach there to go on
                (search.fidelity.gates; None: score every rung).
        Returns:
            TrialResult with proxy scores (every item unless pruned), rung values and timings.
        """
        t0 = time.perf_counter()
        res = TrialResult(status="ok", device=str(self.live.device))
        try:
            moving = self.live.t_move_s
            res.moved = self.load(recipe)
            res.t_compose_s = time.perf_counter() - t0
            res.t_move_s = self.live.t_move_s - moving
            res.placement = self.live.placement
            t1 = time.perf_counter()
            self._score_rungs(res, gates)
            if res.objective is None or not math.isfinite(res.objective):
                raise ValueError(f"non-finite objective {res.objective} (scores {res.proxies})")
            res.t_eval_s = time.perf_counter() - t1
        except Exception as e:  # a failed candidate must not stop the search
            res.status = "failed"
            res.objective = None
            res.error = f"{type(e).__name__}: {e}"[:2000]
            res.error += "\n" + traceback.format_exc(limit=3)[-1500:]
        res.t_total_s = time.perf_counter() - t0
        res.splits_read = sorted(self.splits_read())
        return res

    def _score_rungs(self, res: TrialResult, gates: list[float | None] | None) -> None:
        """Score the rungs' items in turn, stopping where the policy says (fills `res`)."""
        parts = [partial(self._score, ev) for ev in self.parts]
        score_rungs(res, self.exp, self.policy, self.n_items, gates, parts)


def score_rungs(
    res: TrialResult,
    exp: SearchExperiment,
    policy: Policy,
    n_items: dict[str, int],
    gates: list[float | None] | None,
    parts: list[Callable[[], dict[str, tuple[float, int]]]],
) -> None:
    """Score rung after rung until the last or until the policy stops the trial (fills `res`).

    A plain function so that benchmarks/search_replay.py replays a search's fidelity on a scored
    grid through the very rule a trial follows.

    Args:
        res: the trial's result (proxies, objective, rungs, items_scored, status are set).
        exp: the experiment (proxies and their weights and scales, fidelity delta).
        policy: the fidelity policy (search.fidelity.policy_of).
        n_items: items per proxy in all (the Hoeffding bound's population).
        gates: the driver's gates for this trial (search.fidelity.gates).
        parts: per rung, a function scoring that rung's items: {proxy: (mean score, items)}.
    """
    proxies = exp.proxy_list
    d = exp.search.fidelity.delta / len(proxies)  # union bound over proxies
    totals = {p.task: [0.0, 0] for p in proxies}  # proxy -> [sum of item scores, items]
    for rung, score_part in enumerate(parts):
        for task, (score, n) in score_part().items():
            totals[task][0] += score * n
            totals[task][1] += n
        means = {t: s / n for t, (s, n) in totals.items()}
        value, per_proxy = combine(proxies, means)
        res.proxies, res.fidelity = means, max(n for _, n in totals.values())
        res.items_scored = sum(n for _, n in totals.values())
        res.rungs.append([res.fidelity, value])
        if rung == len(parts) - 1:
            res.objective, res.objectives = value, per_proxy
            return
        # The bound is on each proxy's own item range, mapped to [0, 1] with 1 best
        # (a Brier score's optimistic side is its lower end).
        ub = {}
        for p in proxies:
            n, total = totals[p.task][1], n_items[p.task]
            ub[p.task] = p.from_unit(hoeffding_upper(p.to_unit(means[p.task]), n, total, d))
        res.upper_bound = combine(proxies, ub)[0]
        if stops(policy, rung, value, res.upper_bound, gates):
            res.status = "pruned"
            res.objective = value  # low fidelity: never told as a final value
            return


def _rung_evaluators(full: ProxyEvaluator, shares: list[float]) -> list[ProxyEvaluator]:
    """One evaluator per rung over the items that rung adds (search.fidelity.rung_spans), each
    item with the prompt `full` built for it: a few-shot prompt is lm-eval's only when built
    among the whole split's docs (ProxyEvaluator.restricted).

    Args:
        full: the evaluator over every item (its seeded order fixes which items each share takes).
        shares: the rungs' cumulative shares, the last 1.0.
    Returns:
        the evaluators in rung order; `[full]` when there is one rung.
    """
    if len(shares) == 1:
        return [full]
    parts = []
    for span in rung_spans(shares, {t: len(c.items) for t, c in full.tasks.items()}):
        ids = {}
        for t, (a, b) in span.items():
            c = full.tasks[t]
            ids[t] = [c.items[i].doc_id for i in c.order[a:b]]
        parts.append(full.restricted(ids))
    return parts
