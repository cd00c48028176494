"""Which promoted models a resumed promotion keeps instead of evaluating again.

Promotion writes each model's raw lm-eval result per task (RUN/promotion/lm_eval/<model>/<task>.json)
as soon as that model is done, with `fingerprint(...)` under config.layerswap_promotion: what was
evaluated (the model's content id), on which task, with which few-shot count, item limit, token
budget, device and lm-eval version. A later promotion of the same run (`search --resume`, `demo --resume`)
reads a model back only when every task's file holds the fingerprint it would write now, so an
interrupted promotion of 8B models loses at most the model it was evaluating, and a changed
`promote` block (more items, another few-shot count) evaluates again. Run its tests:
.venv/bin/python -m pytest -q tests/search/test_promote_kept.py
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.trainables.model_ids import model_content_id

KEY = "layerswap_promotion"  # the fingerprint's key in a raw result's `config`


def _lm_eval_version() -> str | None:
    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return None


def fingerprint(
    exp: SearchExperiment, rid: str | None, what: object, task: str, shots: int | None, device: str
) -> dict:
    """What decides one model's result on one task, as JSON data.

    Args:
        exp: the search experiment (its `promote` block: limit and max_gen_toks).
        rid: the model's recipe id (content-based), None for a checkpoint evaluated as it is.
        what: the checkpoint reference or the recipe.
        task: the lm-eval task.
        shots: the few-shot count it is run at (None: the task's default).
        device: where it is evaluated ("cpu", "cuda"): kernels differ, and a leaderboard whose
            models were scored on different devices could differ by more than the models do.
    """
    model = rid if rid is not None else model_content_id(str(what))
    return {
        "model_id": model,
        "task": task,
        "num_fewshot": shots,
        "limit": exp.promote.limit,
        "max_gen_toks": exp.promote.max_gen_toks,
        "device": device,
        "lm_eval": _lm_eval_version(),
    }


def raw_path(pdir: Path, name: str, task: str) -> Path:
    """RUN/promotion/lm_eval/<model>/<task>.json: one model's raw lm-eval result on one task."""
    return pdir / "lm_eval" / name / f"{task}.json"


def kept_raws(pdir: Path, name: str, prints: dict[str, dict]) -> dict[str, dict] | None:
    """The raw results an earlier promotion wrote for model `name`, when every task's file holds
    the fingerprint it would be written with now; else None (the model is evaluated).

    Args:
        pdir: RUN/promotion.
        name: the model's name (its folder under lm_eval/).
        prints: task -> `fingerprint(...)` of this promotion.
    Returns:
        task -> raw result restricted to that task, as written; None when any is missing,
        unreadable, another evaluation's, or holds no score for its task.
    """
    raws = {}
    for task, want in prints.items():
        try:
            raw = json.loads(raw_path(pdir, name, task).read_text(encoding="utf-8"))
            if raw["config"][KEY] != want or task not in raw["results"]:
                return None
        except (OSError, ValueError, KeyError, TypeError):
            # Missing, half-copied, hand-edited or written before fingerprints: evaluated again,
            # as the cost of a wrong score kept would be a wrong leaderboard.
            return None
        raws[task] = raw
    return raws
