"""The promotion leaderboard: RUN/leaderboard.md, one row per evaluated model, best first, every
model whose evaluation failed with the reason, and each merged baseline's best pair and mean over
the pool's (task, language) pairs (the ICLR paper's "best config, 9 pairs" and mean).

Written by search/promote.py; tests: tests/search/test_promote.py.
"""

from __future__ import annotations

import math

from layerswap.spaces.baselines import MERGED_BASELINES, expert_name, merged_baseline
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.task_families import heldout_task

# Merged baselines that `layerswap merge` does not build over LoRA adapters (trainables/merge/api.py
# refuses all but layer swaps); promotion composes them in memory.
ADAPTER_UNMERGEABLE = tuple(b for b in MERGED_BASELINES if b != "paper_default")
LORA_NOTE = (
    "The pool holds LoRA adapters: its soups and TIES were built in memory (the adapters' deltas "
    "composed on the base) and `layerswap merge` does not rebuild them (it refuses soups and TIES "
    "of adapters); fold the adapters into full models first (PEFT's merge_and_unload()) to write one."
)


def leaderboard(
    exp: SearchExperiment,
    models: list,
    scores: dict,
    best: str | None,
    cands: dict,
    failed: dict[str, str] | None = None,
    pairs: dict[str, str] | None = None,
    lora: bool = False,
    items: dict[str, tuple[int, int | None]] | None = None,
) -> str:
    """Markdown: model, kind, recipe id, proxy dev scores, proxy test scores, target test score.

    Args:
        exp: the search experiment.
        models: (name, kind, recipe id, what) of every model promotion evaluated.
        scores: {(model, task): score}.
        best: the selected model's name, if any.
        cands: {name: trials.parquet row} of the candidates.
        failed: {model: why its evaluation failed}.
        pairs: {"t1": task expert path, "l1": language expert path, ...} naming the experts the
            merged baselines' pair names and the expert rows (math_expert_2 is t2) refer to
            (None or {}: no legend).
        lora: whether the pool holds LoRA adapters (a note says its soups and TIES are not
            rebuilt by `layerswap merge`).
        items: {task: (items scored, items in its split or None)}; a column whose score rests
            on fewer items than its split has says how many in its header.
    Returns:
        The leaderboard's markdown.
    """
    failed = failed or {}
    proxies = [p.task for p in exp.proxy_list]
    down = [", lower is better" if p.lower_is_better else "" for p in exp.proxy_list]
    head = ["model", "kind", "recipe id", "search objective"]
    items = items or {}
    head += [f"{t} (dev{d}{_count(items, t)})" for t, d in zip(proxies, down, strict=True)]
    head += [
        f"{heldout_task(t)} (test{d}{_count(items, heldout_task(t))})"
        for t, d in zip(proxies, down, strict=True)
    ]
    head += [f"**{exp.target_task} (target, test{_count(items, exp.target_task)})**"]
    lines = [
        f"# Leaderboard: {exp.name} (target language {exp.language})",
        "",
        f"Candidates are the search's top {exp.promote.top_k} recipes by proxy objective (dev splits "
        f"only); the best model ({best or 'none'}) was selected by "
        f"{'the proxy objective' if exp.promote.select_by == 'proxy' else 'the target test score'}.",
        "",
        _objective_legend(exp),
        "",
        _search_items(exp),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    order = sorted(models, key=lambda m: -scores.get((m[0], exp.target_task), -1))
    for name, kind, rid, _ in order:
        obj = cands.get(name, {}).get("objective")
        label = f"**{name}** (best)" if name == best else name
        cells = [
            f"{label} (failed)" if name in failed else label,
            kind,
            rid or "",
            "" if obj is None else f"{obj:.4f}",
        ]
        cells += [f"{scores.get((name, t), float('nan')):.4f}" for t in proxies]
        cells += [f"{scores.get((name, heldout_task(t)), float('nan')):.4f}" for t in proxies]
        cells += [f"{scores.get((name, exp.target_task), float('nan')):.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _pair_summary(exp, models, scores, failed)
    lines += _expert_legend(pairs or {})
    if lora and any(merged_baseline(m[0]) in ADAPTER_UNMERGEABLE for m in models):
        lines += ["", LORA_NOTE]
    if failed:
        lines += ["", "Failed evaluations (no scores):", ""]
        lines += [f"- {name}: {why}" for name, why in failed.items()]
    return "\n".join(lines) + "\n"


def _pair_summary(exp, models: list, scores: dict, failed: dict) -> list[str]:
    """Per merged baseline evaluated on more than one expert pair: the pairs, the best pair and
    the mean over the pairs on the target (the ICLR paper's Table 1/2 aggregates); [] else."""
    groups: dict[str, list[str]] = {}
    for name, _kind, _rid, _ in models:
        fam = merged_baseline(name)
        if fam is not None and name != fam:
            groups.setdefault(fam, []).append(name)
    if not groups:
        return []
    out = [
        "",
        f"Merged baselines over the pool's expert pairs (`{exp.target_task}`, test; a failed "
        "pair is left out and counted):",
        "",
        "| baseline | pairs scored | mean over pairs | best pair | best pair's score |",
        "|---|---|---|---|---|",
    ]
    for fam, names in groups.items():
        got = {n: scores[(n, exp.target_task)] for n in names if (n, exp.target_task) in scores}
        got = {n: v for n, v in got.items() if n not in failed and not math.isnan(v)}
        if not got:
            out.append(f"| {fam} | 0 of {len(names)} | nan | | nan |")
            continue
        best = max(got, key=lambda n: (got[n], -names.index(n)))
        mean = sum(got.values()) / len(got)
        out.append(f"| {fam} | {len(got)} of {len(names)} | {mean:.4f} | {best} | {got[best]:.4f} |")  # fmt: skip
    return out


def _expert_legend(pairs: dict[str, str]) -> list[str]:
    """Which checkpoint each expert row and pair index is: "math_expert_2 = t2: `PATH`"; [] for
    a pool of one pair (its rows are math_expert and language_expert, its baselines unpaired)."""
    if not pairs:
        return []
    side = {"t": "task", "l": "language"}
    named = [f"{expert_name(side[k[0]], int(k[1:]) - 1)} = {k}: `{v}`" for k, v in pairs.items()]
    return ["", "Experts (row = pair index in the baselines' names: checkpoint): " + "; ".join(named)]  # fmt: skip


def _count(items: dict, task: str) -> str:
    """ ", 40 of 250 items" when promotion scored `task` on fewer items than its split has
    (promote.limit), ", 40 items" when the split's size is unknown; "" for the whole split."""
    n, total = items.get(task, (None, None))
    if n is None or (total is not None and n >= total):
        return ""
    return f", {n} of {total} items" if total is not None else f", {n} items"


def _search_items(exp) -> str:
    """Where the search objective's proxy scores come from, and why the dev columns may differ."""
    first = exp.proxy_eval.limit
    which = f"the first {first} dev items of each proxy" if first else "each proxy's dev items"
    return (
        f"The search objective rests on the search's own proxy scores ({which}, "
        "search/trials.parquet); the dev columns here are promotion's lm-eval runs on its own "
        "items, so the two can differ."
    )


def _objective_legend(exp) -> str:
    """What the "search objective" column is: each proxy rescaled so chance is 0 and the best
    score 1 (a lower-is-better metric such as a Brier score included), then weighted."""
    terms = [
        f"{p.weight:g} x ({p.task} - {p.chance:g}) / ({p.best:g} - {p.chance:g})"
        for p in exp.proxy_list
    ]
    total = sum(p.weight for p in exp.proxy_list)
    return (
        "Search objective (higher is better; 0 is chance, 1 the best score): "
        + " + ".join(terms)
        + (f", divided by {total:g}" if total != 1 else "")
        + ", on the dev split the search scored."
    )
