"""The one rule for "the number that counts" of an lm-eval task, and where to read it.

A task is scored by its first metric under its preferred filter: MGSM -> ("exact_match",
"flexible-extract"), Belebele -> ("acc", "none"). The rule reads a task's `metric_list` and
`filter_list`, which lm-eval keeps both in its raw results (`raw["configs"][task]`) and on
its Task objects (`task.config`); every caller (lm-eval runs, the proxy evaluator, indicators,
promotion) goes through here.
"""

from __future__ import annotations

from typing import Any

# The filter whose score a task reports when it has several (mgsm: "flexible-extract").
PREFERRED_FILTERS = ("flexible-extract", "none")


def scoring_key(metric_list: list[dict] | None, filter_list: list[dict] | None, task: str) -> tuple[str, str]:  # fmt: skip
    """(metric, filter) of a task config: its first metric, under its preferred filter.

    Args:
        metric_list: the config's `metric_list` ([{"metric": ...}, ...]).
        filter_list: the config's `filter_list` ([{"name": ...}, ...]; none means "none").
        task: the task name, for the error.
    """
    if not metric_list:
        raise ValueError(f"task {task!r}: no metric_list in its config")
    filters = [f["name"] for f in filter_list or []] or ["none"]
    filt = next((name for name in PREFERRED_FILTERS if name in filters), filters[0])
    return metric_list[0]["metric"], filt


def score_key(raw: dict, task: str) -> tuple[str, str]:
    """(metric, filter) a task of an lm-eval result dict is scored by (see `scoring_key`)."""
    if task not in raw.get("configs", {}):
        raise ValueError(f"task {task!r} not in these results (have {sorted(raw['configs'])})")
    cfg = raw["configs"][task]
    return scoring_key(cfg.get("metric_list"), cfg.get("filter_list"), task)


def task_key(task: Any) -> tuple[str, str]:
    """(metric, filter) an lm-eval Task object is scored by (see `scoring_key`)."""
    cfg = task.config
    return scoring_key(cfg.metric_list, cfg.filter_list, cfg.task)


def task_score(raw: dict, task: str) -> float:
    """The task's reported score in an lm-eval result dict, e.g. MGSM exact_match, Belebele acc."""
    metric, filt = score_key(raw, task)
    return float(raw["results"][task][f"{metric},{filt}"])


def leaf_tasks(raw: dict, task: str, tags: dict[str, list[str]] | None = None) -> list[str]:
    """The single tasks of an lm-eval result that a name covers, in results order.

    Args:
        raw: an lm-eval result dict.
        task: a task, group (its `group_subtasks`, nested) or tag name.
        tags: {tag: member names} (lm-eval expands a tag into its members and records no trace
            of it in the results; see lm_eval_api.tag_members).
    """
    if task in raw.get("configs", {}):
        return [task]
    subs = (raw.get("group_subtasks") or {}).get(task) or (tags or {}).get(task)
    if not subs:
        raise ValueError(f"task {task!r} not in these lm-eval results")
    return [leaf for sub in subs for leaf in leaf_tasks(raw, sub, tags)]


def pooled_score(parts: list[tuple[float, int]]) -> float:
    """A score over several tasks: their item-weighted mean, as if their items were one task
    (a group or tag indicator, by either backend; lm-eval's weight_by_size group mean).

    Args:
        parts: (task's reported score, items it was scored on) per task.
    """
    if len(parts) == 1:
        return float(parts[0][0])  # the task's own number, not rounded through score * n / n
    n = sum(k for _, k in parts)
    if n <= 0:
        raise ValueError("no items scored")
    return float(sum(score * k for score, k in parts) / n)


def aggregate_score(task: Any, aggregate: dict[str, float]) -> float:
    """A Task's reported number from an aggregate keyed "metric,filter" (the proxy evaluator's)."""
    metric, filt = task_key(task)
    key = f"{metric},{filt}"
    if key not in aggregate:
        raise ValueError(f"{task.config.task}: no {key!r} in the proxy aggregate {sorted(aggregate)}")  # fmt: skip
    return float(aggregate[key])


def config_higher_is_better(cfg: dict, task: str) -> tuple[str, bool]:
    """(metric, whether larger is better) of a task config's reported metric: the config's own
    `higher_is_better` for it, else lm-eval's registry (True for acc and exact_match, False for
    brier_score); the same flags a loaded Task reports."""
    from lm_eval.api.registry import is_higher_better

    metric, _ = scoring_key(cfg.get("metric_list"), cfg.get("filter_list"), task)
    flag = cfg["metric_list"][0].get("higher_is_better")  # scoring_key's metric
    if flag is None:
        flag = is_higher_better(metric)
    return metric, True if flag is None else bool(flag)


def task_higher_is_better(task: Any) -> tuple[str, bool]:
    """(metric, whether larger is better) of a loaded lm-eval Task's reported metric, by the
    Task's own flags (the config's, else lm-eval's registry, as `config_higher_is_better`)."""
    metric, _ = task_key(task)
    return metric, bool(task.higher_is_better().get(metric, True))
