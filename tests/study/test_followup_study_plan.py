"""The follow-up paper's grid study (spaces/examples/real_followup_study.yaml) plans offline: four
bases sized from their configs in one study, every expert, sweep, search and promotion costed,
nothing unresolved; each search's pool counted at its top_k, 3 + 3 experts.

Run: .venv/bin/pytest -q tests/study/test_followup_study_plan.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.mark.slow  # plans the 28-entry study again (~15-25 s)
def test_a_search_counts_only_the_experts_of_its_own_base(monkeypatch, tmp_path):
    """Without Qwen's math entry, Qwen's searches have no math expert, whatever the other three
    models train: each is named as a problem, and no other search is."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = STUDY.read_text()
    entry = "  - {<<: *math, config: real_qwen25_7b_math_full.yaml}\n"
    assert text.count(entry) == 1
    study = tmp_path / "study.yaml"
    study.write_text(text.replace(entry, ""))
    for f in STUDY.parent.glob("real_*.yaml"):  # the configs it names, beside it
        (tmp_path / f.name).write_text(f.read_text())
    plan = plan_study(load_study(study))
    math = [p for p in plan.problems if "no math expert" in p]
    assert len(math) == 3 and all("Qwen/Qwen2.5-7B-Instruct" in p for p in math), plan.problems
    assert all("qwen25" in p for p in math), math
