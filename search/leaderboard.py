"""The promotion leaderboard: RUN/leaderboard.md, one row per evaluated model, best first, and
every model whose evaluation failed with the reason.

Written by search/promote.py; tests: tests/search/test_promote.py.
"""

from __future__ import annotations

from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.task_families import heldout_task


def leaderboard(
    exp: SearchExperiment,
    models: list,
    scores: dict,
    best: str | None,
    cands: dict,
    failed: dict[str, str] | None = None,
) -> str:
    """Markdown: model, kind, recipe id, proxy dev scores, proxy test scores, target test score.

    Args:
        exp: the search experiment.
        models: (name, kind, recipe id, what) of every model promotion evaluated.
        scores: {(model, task): score}.
        best: the selected model's name, if any.
        cands: {name: trials.parquet row} of the candidates.
        failed: {model: why its evaluation failed}.
    """
    failed = failed or {}
    proxies = [p.task for p in exp.proxy_list]
    down = [", lower is better" if p.lower_is_better else "" for p in exp.proxy_list]
    head = ["model", "kind", "recipe id", "search objective"]
    head += [f"{t} (dev{d})" for t, d in zip(proxies, down, strict=True)]
    head += [f"{heldout_task(t)} (test{d})" for t, d in zip(proxies, down, strict=True)]
    head += [f"**{exp.target_task} (target, test)**"]
    lines = [
        f"# Leaderboard: {exp.name} (target language {exp.language})",
        "",
        f"Candidates are the search's top {exp.promote.top_k} recipes by proxy objective (dev splits "
        f"only); the best model ({best or 'none'}) was selected by "
        f"{'the proxy objective' if exp.promote.select_by == 'proxy' else 'the target test score'}.",
        "",
        _objective_legend(exp),
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
    if failed:
        lines += ["", "Failed evaluations (no scores):", ""]
        lines += [f"- {name}: {why}" for name, why in failed.items()]
    return "\n".join(lines) + "\n"


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
