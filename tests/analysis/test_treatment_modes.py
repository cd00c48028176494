"""The treatments table files every promoted model built from pool experts under its experts'
SFT type: the experts (math_expert_2 ...) and the merged baselines (soup_uniform_t2_l1 ...) as the
layer-swap candidates, by one rule (registry mode, else the pool's kind; mixed pair: full).

Run: .venv/bin/python -m pytest -q tests/analysis/test_treatment_modes.py
"""

from __future__ import annotations

import pandas as pd

from layerswap.analysis.load import load_run
from layerswap.analysis.treatments import treatment_tables, treatment_values
from layerswap.spaces.search_space import ExpertPool, ExpertRef

TASK = "world_mgsm_direct_xa"


def _run(root):
    """Task experts m1 (registry: lora) and m2 (registry: full), language expert l1 (no registry
    row; the pool says lora); a promotion of the experts, merged baselines and one candidate."""
    (root / "search").mkdir(parents=True)
    (root / "promotion").mkdir()
    (root / "experts").mkdir()
    pool = ExpertPool(
        task=[ExpertRef(path="/x/m1", expert_id="m1"), ExpertRef(path="/x/m2", expert_id="m2")],
        language=[ExpertRef(path="/x/l1", expert_id="l1", kind="lora")],
        base="/x/base",
    )
    (root / "search" / "pool.json").write_text(pool.model_dump_json())
    pd.DataFrame([dict(expert_id="m1", kind="math", language="en", mode="lora", base="b", ind__world_mgsm_direct_xa_dev=0.9),
                  dict(expert_id="m2", kind="math", language="en", mode="full", base="b", ind__world_mgsm_direct_xa_dev=0.8)]
                 ).to_parquet(root / "experts" / "registry.parquet")  # fmt: skip
    pd.DataFrame([dict(trial_id="t0", recipe_id="r0", task_expert_id="m1", language_expert_id="l1", status="ok", objective=0.5)]
                 ).to_parquet(root / "search" / "trials.parquet")  # fmt: skip
    values = {"base": 0.1, "math_expert": 0.3, "math_expert_2": 0.25, "language_expert": 0.2,
              "soup_uniform_t1_l1": 0.35, "soup_uniform_t2_l1": 0.32, "candidate_r0": 0.4}  # fmt: skip
    rows = [dict(model=m, kind="candidate" if m.startswith("candidate") else "baseline",
                 recipe_id="r0" if m.startswith("candidate") else None, task=TASK, split="test",
                 value=v, n_items=8) for m, v in values.items()]  # fmt: skip
    pd.DataFrame(rows).to_parquet(root / "promotion" / "results.parquet")
    return load_run(root)


def test_promoted_experts_and_merged_baselines_take_their_experts_mode(tmp_path):
    vals = treatment_values(_run(tmp_path))
    prom = vals[vals["source"] == "promotion"]
    got = {(t, m): v for t, m, v in zip(prom["treatment"], prom["mode"], prom["value"], strict=True)}  # fmt: skip
    assert got[("math-only", "lora")] == 0.3  # math_expert: m1, lora in the registry
    assert got[("math-only", "full")] == 0.25  # math_expert_2: m2, full
    assert got[("language-only", "lora")] == 0.2  # l1: no registry row, lora in the pool
    assert got[("model soup (uniform)", "lora")] == 0.35  # m1 + l1: both lora
    assert got[("model soup (uniform)", "full")] == 0.32  # m2 + l1: they differ
    assert got[("layer swap", "lora")] == 0.4  # the candidate, by the same rule
    # The LoRA math-only cell is the promoted expert's test score, not the registry's dev score.
    table1, _ = treatment_tables(vals)
    assert table1.loc["math-only", "lora"] == "0.300"
    assert not ((vals["source"] == "registry") & (vals["treatment"] == "math-only")).any()
