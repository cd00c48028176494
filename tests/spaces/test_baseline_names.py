"""spaces/baselines.py: promotion's names of the pool's experts and merged baselines read back
as what they are, by the one rule promotion (search/promote.py) and the analysis share.
Run: .venv/bin/python -m pytest -q tests/spaces/test_baseline_names.py
"""

from __future__ import annotations

from layerswap.spaces.baselines import expert_baseline, expert_name, merged_baseline, pair_name


def test_expert_names_round_trip():
    assert [expert_name("task", i) for i in range(3)] == ["math_expert", "math_expert_2", "math_expert_3"]  # fmt: skip
    assert expert_name("language", 1) == "language_expert_2"
    for side in ("task", "language"):
        for i in range(3):
            assert expert_baseline(expert_name(side, i)) == expert_name(side, 0)


def test_other_names_are_not_experts():
    for model in (
        "math_expert_x",
        "my_math_expert",
        "soup_uniform",
        pair_name("ties", 0, 1),
        "base",
    ):
        assert expert_baseline(model) is None
    assert merged_baseline(pair_name("ties", 1, 2)) == "ties"
    assert merged_baseline("math_expert_2") is None
