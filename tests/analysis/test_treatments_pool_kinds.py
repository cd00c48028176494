"""The treatments table files a layer swap of LoRA experts given as explicit paths (no expert
registry) under LoRA: the kind comes from the search's pool (RUN/search/pool.json), not "full".

Run: .venv/bin/python -m pytest -q tests/analysis/test_treatments_pool_kinds.py
"""

from __future__ import annotations

import json

import pandas as pd

from layerswap.analysis.load import load_run
from layerswap.analysis.treatments import treatment_values
from layerswap.search.pool import explicit_pool
from layerswap.spaces.search_space import expert_id

TASK = "world_mgsm_direct_xa"


def _run(root, adapters: bool):
    """A search over explicit experts (two checkpoints named samples_000000096), one promoted
    candidate; the experts are adapter folders or not."""
    experts = []
    for name in ("math_lora", "lang_lora"):
        d = root / "ckpt" / name / "checkpoints" / "samples_000000096"
        d.mkdir(parents=True)
        if adapters:
            (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
        experts.append(str(d))
    (root / "search").mkdir()
    (root / "promotion").mkdir()
    pool = explicit_pool([experts[0]], [experts[1]], str(root / "base"))
    (root / "search" / "pool.json").write_text(pool.model_dump_json())
    pd.DataFrame([dict(trial_id="t0", recipe_id="r0", task_expert_id=expert_id(pool, experts[0]),
                       language_expert_id=expert_id(pool, experts[1]), status="ok", objective=0.5)]
                 ).to_parquet(root / "search" / "trials.parquet")  # fmt: skip
    pd.DataFrame([dict(model="base", kind="baseline", recipe_id=None, task=TASK, split="test", value=0.2, n_items=8),
                  dict(model="candidate_r0", kind="candidate", recipe_id="r0", task=TASK, split="test", value=0.4, n_items=8)]
                 ).to_parquet(root / "promotion" / "results.parquet")  # fmt: skip
    return load_run(root)


def _swap_mode(vals: pd.DataFrame) -> str:
    (mode,) = vals.loc[vals["treatment"] == "layer swap", "mode"]
    return mode


def test_lora_pool_swap_is_filed_under_lora(tmp_path):
    assert _swap_mode(treatment_values(_run(tmp_path / "lora", adapters=True))) == "lora"
    assert _swap_mode(treatment_values(_run(tmp_path / "full", adapters=False))) == "full"
