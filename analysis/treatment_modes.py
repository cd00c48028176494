"""Which row and SFT-type column (partial / LoRA / full) of the treatments table a model goes in:
registry experts by their own `mode`, and every promoted model built from pool experts (the
experts themselves, the merged baselines, the layer-swap candidates) by one rule over its
experts' modes (`pair_mode`).

Run: .venv/bin/python -m pytest -q tests/analysis/test_treatment_modes.py
"""

from __future__ import annotations

import pandas as pd

from layerswap.analysis.load import RunData, hparams, trial_by_recipe
from layerswap.spaces.baselines import MERGED_BASELINES, expert_name, one_pair, pair_name
from layerswap.spaces.search_space import ExpertPool, expert_id

MODES = ["partial", "lora", "full"]  # the paper's column order (Partial, LoRA, Full SFT)
POOL_JSON = "search/pool.json"  # the search's expert pool (search/search.py writes it)


def expert_mode(row: pd.Series) -> str:
    """The table column of a registry expert: its mode, with mix/simultaneous placed by their
    hparams (the paper puts data mixing under LoRA/Full and simultaneous SFT under the partial
    columns)."""
    mode = str(row.get("mode", "full"))
    if mode in MODES:
        return mode
    hp = hparams(row)
    lora = any(
        k in hp and hp[k] not in (None, False, 0) for k in ("lora", "lora_r", "lora_rank", "peft")
    )
    if mode == "simultaneous":
        return "partial"
    return "lora" if lora else "full"


def expert_row(row: pd.Series) -> str | None:
    """The table row of a registry expert (None: not one of the paper's SFT treatments)."""
    mode, kind = str(row.get("mode", "full")), str(row.get("kind", ""))
    if mode == "mix":
        return "data mixing"
    if mode == "simultaneous":
        return "simultaneous"
    return {"math": "math-only", "language": "language-only"}.get(kind)


def pair_mode(modes) -> str:
    """The one rule for a model built from pool experts: the mode its experts share (one
    expert: its own), "full" where none is known, where they differ, or where it is no column.

    Args:
        modes: the experts' modes (None: unknown).
    Returns:
        "partial", "lora" or "full".
    """
    ms = set(modes) - {None}
    return ms.pop() if len(ms) == 1 and next(iter(ms)) in MODES else "full"


def expert_modes(run: RunData) -> dict[str, str]:
    """expert id -> its mode: the registry's training mode, else the kind the search's pool
    recorded (RUN/search/pool.json: explicit experts have no registry row)."""
    modes = _pool_kinds(run)
    reg = run.registry
    if reg is not None and {"expert_id", "mode"} <= set(reg.columns):
        modes |= reg.drop_duplicates("expert_id").set_index("expert_id")["mode"].to_dict()
    return modes


def layer_swap_modes(run: RunData) -> dict[str, str]:
    """recipe_id -> its experts' mode (`pair_mode` of its task and language expert)."""
    trials = trial_by_recipe(run)
    if trials is None:
        return {}
    modes = expert_modes(run)
    sides = ("task_expert_id", "language_expert_id")
    return {rid: pair_mode(modes.get(tr.get(s)) for s in sides) for rid, tr in trials.iterrows()}


def promoted_experts(run: RunData) -> dict[str, tuple[str, ...]]:
    """Promotion's name of each model built from the pool's experts -> their expert ids: the
    experts (math_expert_2: the second task expert) and the merged baselines (soup_uniform_t2_l1:
    task expert 2 and language expert 1; unsuffixed in a pool of one pair). {} without a
    readable RUN/search/pool.json (the names then say nothing about which experts)."""
    pool = read_pool(run)
    if pool is None:
        return {}
    sides = {"task": pool.task, "language": pool.language}
    ids = {s: [expert_id(pool, r.path) for r in refs] for s, refs in sides.items()}
    out: dict[str, tuple[str, ...]] = {}
    for side, side_ids in ids.items():
        out |= {expert_name(side, i): (eid,) for i, eid in enumerate(side_ids)}
    for b in MERGED_BASELINES:
        if one_pair(len(ids["task"]), len(ids["language"])):
            out[b] = (ids["task"][0], ids["language"][0])
            continue
        for i, t in enumerate(ids["task"]):
            for j, lang in enumerate(ids["language"]):
                out[pair_name(b, i, j)] = (t, lang)
    return out


def promoted_modes(run: RunData) -> dict[str, str]:
    """Promotion's model name -> mode (`pair_mode` of its experts) for the pool's experts and
    merged baselines (`promoted_experts`); a name not listed has no known experts ("full")."""
    modes = expert_modes(run)
    return {m: pair_mode(modes.get(e) for e in eids) for m, eids in promoted_experts(run).items()}


def read_pool(run: RunData) -> ExpertPool | None:
    """RUN/search/pool.json, or None when the run has none or it does not read as a pool (an
    older schema)."""
    try:
        return ExpertPool.model_validate_json((run.root / POOL_JSON).read_text())
    except (OSError, ValueError):
        return None


def _pool_kinds(run: RunData) -> dict[str, str]:
    """expert id (as trials.parquet records it) -> kind ("full"/"lora") from RUN/search/pool.json."""
    pool = read_pool(run)
    if pool is None:
        return {}
    return {expert_id(pool, r.path): r.kind for r in (*pool.task, *pool.language)}
