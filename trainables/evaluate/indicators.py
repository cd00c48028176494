"""Merging indicators of expert checkpoints (follow-up paper §5): scores on the kind's dev tasks.

`IndicatorScorer(tasks, tok, include_path=...).score_checkpoint(path)`; full checkpoints and PEFT
LoRA adapters alike. Backends: the cached ProxyEvaluator (default) or lm-eval itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from layerswap.spaces.task_families import INDICATOR_PREFIX as IND
from layerswap.spaces.task_families import N_ITEMS_PREFIX as N_ITEMS
from layerswap.spaces.task_families import is_world_task
from layerswap.trainables.evaluate.harness import (
    BatchSize,
    check_batch_size,
    evaluate,
    resolve_device,
)
from layerswap.trainables.evaluate.lm_eval_api import (
    include_list,
    single_configs,
    tag_members,
    task_index,
)
from layerswap.trainables.evaluate.proxy import ProxyEvaluator
from layerswap.trainables.evaluate.scoring import (
    aggregate_score,
    config_higher_is_better,
    leaf_tasks,
    pooled_score,
    task_higher_is_better,
    task_score,
)
from layerswap.trainables.evaluate.tasks import lm_eval_tasks_dir
from layerswap.trainables.merge.lora import is_lora_adapter

Backend = Literal["proxy", "lm_eval"]


@dataclass(frozen=True)
class IndicatorScores:
    """Scores per indicator task (lm-eval's reported metric) and the items each was scored on."""

    scores: dict[str, float]
    n_items: dict[str, int]
    seconds: float

    def columns(self) -> dict[str, Any]:
        """Registry columns: `ind__<task>` and `n_items__<task>`."""
        out: dict[str, Any] = {}
        for task in sorted(self.scores):
            out[f"{IND}{task}"] = float(self.scores[task])
            out[f"{N_ITEMS}{task}"] = int(self.n_items[task])
        return out


def adapter_base(path: str | Path, base: str | Path | None = None) -> str:
    """The base model of a LoRA adapter: `base` if given, else its adapter_config's."""
    if base is not None:
        return str(base)
    cfg = json.loads((Path(path) / "adapter_config.json").read_text())
    name = cfg.get("base_model_name_or_path")
    if not name:
        raise ValueError(f"{path}/adapter_config.json names no base_model_name_or_path; pass base")
    return str(name)


def load_model(
    path: str | Path,
    *,
    base: str | Path | None = None,
    trust_remote_code: bool = False,
    device: str = "auto",
):
    """A checkpoint as an in-memory causal LM in eval mode, on `device`.

    Weights keep the checkpoint's dtype (transformers' default, dtype "auto", as in
    `HFLM(pretrained=path)`), so scores match lm-eval's on the same device. A LoRA adapter is
    applied to its base unmerged, as lm-eval's `HFLM(peft=...)` runs it; the returned object is
    the base model with the adapter's layers injected, a plain transformers model for every
    caller.

    Args:
        path: HF checkpoint folder (safetensors) or PEFT LoRA adapter folder.
        base: the adapter's base model (default: the one in adapter_config.json).
        trust_remote_code: only when the user turned it on (experiment.trust_remote_code).
        device: "auto" (cuda when there is one), "cpu", "cuda", ... (harness.resolve_device).
    Returns:
        the model.
    """
    device = resolve_device(device)
    from transformers import AutoModelForCausalLM

    if is_lora_adapter(path):
        from peft import PeftModel

        model = AutoModelForCausalLM.from_pretrained(
            adapter_base(path, base), use_safetensors=True, trust_remote_code=trust_remote_code
        )
        model = PeftModel.from_pretrained(model, str(path)).get_base_model()
    else:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), use_safetensors=True, trust_remote_code=trust_remote_code
        )
    return model.to(device).eval()


def load_tokenizer(path: str | Path, *, base: str | Path | None = None):
    """The checkpoint's tokenizer, falling back to the (adapter's) base model's."""
    from transformers import AutoTokenizer

    path = Path(path)
    if (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(path))
    src = adapter_base(path, base) if is_lora_adapter(path) else base
    if src is None:
        raise ValueError(f"{path}: no tokenizer files; pass base")
    return AutoTokenizer.from_pretrained(str(src))


def refuse_lower_is_better(name: str, metric: str, higher_is_better: bool, leaf: str = "") -> None:
    """Indicators rank experts larger-first (the registry's top_k, sweeps, the search's pool):
    a lower-is-better metric such as brier_score would pick the worst experts.

    Raises:
        ValueError: naming the indicator, its task and metric.
    """
    if not higher_is_better:
        where = name if leaf in ("", name) else f"{name} (task {leaf})"
        raise ValueError(
            f"indicator {where}: lm-eval's {metric} is lower-is-better, and indicators rank "
            "experts larger-first; use a higher-is-better task (e.g. world_belebele_xa_dev)"
        )


class IndicatorScorer:
    """Scores checkpoints on fixed indicator tasks; prompts are built once (proxy backend).

    Args:
        tasks: lm-eval task, group or tag names (a group's or tag's score is the item-weighted
            mean of its tasks' scores, scoring.pooled_score, by either backend).
        tokenizer: the experts' shared tokenizer.
        include_path: folder(s) of task YAMLs (world tasks); None for built-in tasks only.
        limit: first N items of each (leaf) task; None for all.
        num_fewshot: few-shot examples (passed to both backends alike).
        max_gen_toks: generation budget of generate_until tasks.
        backend: "proxy" (ProxyEvaluator: lm-eval's per-item predictions, prompts cached) or
            "lm_eval" (simple_evaluate per checkpoint).
        device: where checkpoints are loaded and scored: "auto" (cuda when there is one,
            else cpu), "cpu" or "cuda" (see harness.resolve_device); resolved once, here.
        batch_size: rows per forward pass, an int or "auto" (the proxy backend's per-device
            search, or lm-eval's own with backend "lm_eval").
    """

    def __init__(
        self,
        tasks: list[str],
        tokenizer,
        *,
        include_path: str | Path | list | None = None,
        limit: int | None = None,
        num_fewshot: int = 0,
        max_gen_toks: int = 256,
        backend: Backend = "proxy",
        device: str = "auto",
        batch_size: BatchSize = 1,
    ):
        if not tasks:
            raise ValueError("no indicator tasks given")
        if backend not in ("proxy", "lm_eval"):
            raise ValueError(f"backend {backend!r} (expected 'proxy' or 'lm_eval')")
        self.device = resolve_device(device)
        self.batch_size = check_batch_size(batch_size)
        self.tasks = list(tasks)
        self.tokenizer = tokenizer
        self.include_path = include_path
        self.limit = limit
        self.num_fewshot = num_fewshot
        self.max_gen_toks = max_gen_toks
        self.backend = backend
        self._evals: dict[str, ProxyEvaluator] = {}
        self._tags: dict[str, list[str]] = {}  # lm_eval backend: tag -> members
        if backend == "proxy":
            paths = include_list(include_path)
            if any(not is_world_task(t) for t in self.tasks):
                paths.append(str(lm_eval_tasks_dir()))  # built-in tasks (ProxyEvaluator skips them)
            for name in self.tasks:
                self._evals[name] = ProxyEvaluator(
                    [name],
                    tokenizer,
                    include_path=paths,
                    limit=limit,
                    num_fewshot=num_fewshot,
                    gen_kwargs={"max_gen_toks": int(max_gen_toks)},
                    batch_size=self.batch_size,
                )
                for leaf, cache in self._evals[name].tasks.items():
                    refuse_lower_is_better(name, *task_higher_is_better(cache.task), leaf)
        else:  # lm-eval loads the tasks per run; their configs tell the direction now
            index = task_index(self.tasks, include_path)
            self._tags = tag_members(index)
            for name, cfg in single_configs(index, self.tasks).items():
                if cfg is not None and cfg.get("metric_list"):  # a group's leaves: per run
                    refuse_lower_is_better(name, *config_higher_is_better(cfg, name))

    def score(self, model) -> IndicatorScores:
        """Score an in-memory model on every indicator task, on the scorer's device.

        The model is moved there in place (`model.to(device)`) first, for both backends.

        Returns:
            IndicatorScores (lm-eval's reported metric per task, items scored).
        """
        t0 = time.perf_counter()
        model.to(self.device)  # the ProxyEvaluator runs the model where its parameters are
        scores: dict[str, float] = {}
        counts: dict[str, int] = {}
        if self.backend == "proxy":
            for name, ev in self._evals.items():
                res = ev.score(model)
                parts = [
                    (aggregate_score(ev.tasks[leaf].task, res.aggregate[leaf]), len(items))
                    for leaf, items in res.items.items()
                ]
                scores[name], counts[name] = pooled_score(parts), sum(n for _, n in parts)
        else:
            raw = evaluate(
                model,
                self.tasks,
                tokenizer=self.tokenizer,
                include_path=self.include_path,
                limit=self.limit,
                num_fewshot=self.num_fewshot,
                max_gen_toks=self.max_gen_toks,
                batch_size=self.batch_size,
                device=self.device,
            )
            for name in self.tasks:
                parts = [
                    (task_score(raw, leaf), _lm_eval_count(raw, leaf))
                    for leaf in leaf_tasks(raw, name, self._tags)
                ]
                scores[name], counts[name] = pooled_score(parts), sum(n for _, n in parts)
        return IndicatorScores(scores, counts, time.perf_counter() - t0)

    def score_checkpoint(self, path: str | Path, *, base: str | Path | None = None, trust_remote_code: bool = False) -> IndicatorScores:  # fmt: skip
        """Load a checkpoint (full or LoRA adapter, see `load_model`) and score it."""
        model = load_model(path, base=base, trust_remote_code=trust_remote_code, device=self.device)
        try:
            return self.score(model)
        finally:
            del model
            if self.device.startswith("cuda"):
                import torch

                torch.cuda.empty_cache()  # a sweep scores checkpoint after checkpoint


def _lm_eval_count(raw: dict, task: str) -> int:
    """Items lm-eval scored for a single task."""
    n = (raw.get("n-samples") or {}).get(task)
    if n is None:
        raise ValueError(f"task {task!r}: no sample count in these lm-eval results")
    return int(n["effective"])


def score_checkpoint(
    path: str | Path,
    tasks: list[str],
    *,
    include_path: str | Path | list | None = None,
    base: str | Path | None = None,
    backend: Backend = "proxy",
    **kwargs,
) -> IndicatorScores:
    """One-shot: score one checkpoint on `tasks` (see IndicatorScorer for the keyword args)."""
    tok = load_tokenizer(path, base=base)
    scorer = IndicatorScorer(tasks, tok, include_path=include_path, backend=backend, **kwargs)
    return scorer.score_checkpoint(path, base=base)
