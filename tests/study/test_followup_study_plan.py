"""The follow-up paper's grid study (spaces/examples/real_followup_study.yaml) plans offline: four
bases sized from their configs in one study, every expert, sweep, search and promotion costed,
nothing unresolved; each search's pool counted at its top_k, 3 + 3 experts.

Run: .venv/bin/pytest -q tests/study/test_followup_study_plan.py
"""

from __future__ import annotations

from pathlib import Path

from layerswap import spaces
from layerswap.spaces.study import load_study
from layerswap.study.plan import plan_study

STUDY = Path(spaces.__file__).parent / "examples" / "real_followup_study.yaml"
BASES = (
    "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "CohereForAI/aya-expanse-8b",
    "tiiuae/Falcon3-7B-Instruct",
)


def test_followup_study_plans_every_model_and_language_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_study(STUDY)
    plan = plan_study(loaded)
    assert (plan.problems, plan.unknowns, plan.warnings) == ([], [], [])
    experts = [e.experiment.name for e in loaded.experts]
    searches = [s.experiment.name for s in loaded.searches]
    rows = {s.key: [r.name for r in s.rows] for s in plan.stages}
    assert rows == {"train": experts, "indicators": experts, "search": searches, "promotion": searches}  # fmt: skip
    assert len(experts) == 16 and len(searches) == 12
    assert all(r.hours and r.hours > 0 for s in plan.stages for r in s.rows)
    for base in BASES:  # each sized from its own config, not one base for all
        assert any(line.startswith(f"model {base}: ") for line in plan.resolved), base
    for row in next(s for s in plan.stages if s.key == "promotion").rows:
        assert "pool: 3 task x 3 language expert(s)" in row.notes, row.name
