"""world.sft's MGSM answer classes (right / slip / misread / no_equation).

Run: .venv/bin/python -m pytest -q tests/world/test_world_sft.py
"""

from __future__ import annotations

import pytest

from world.sft import OUTCOMES, answer_outcome


@pytest.mark.parametrize(
    ("text", "answer", "outcome"),
    [
        (" Step-by-Step Answer: 7 + 5 = 12. The answer is 12.", 12, "right"),
        (" 12", 12, "right"),  # a bare number is lm-eval's answer too
        (" Step-by-Step Answer: 7 + 5 = 13. The answer is 13.", 12, "slip"),
        (" 7 - 5 = 2. The answer is 2.", 12, "misread"),
        (" kamo tepi.", 12, "no_equation"),
        (" 3 * 4 - 2 = 9.", 10, "slip"),  # * before -
        (" 2 + 3 * 4 = 20.", 14, "slip"),
        (" 12 / 3 = 5.", 4, "slip"),
        (" 12 / 0 = 5.", 4, "misread"),  # no crash on a division by zero
        (" 30 / 4 = 7.", 7, "right"),
        (" 30 / 4 = 8.", 7, "misread"),  # 7.5 is not the answer
    ],
)
def test_answer_outcome(text, answer, outcome):
    assert answer_outcome(text, answer) == outcome
    assert outcome in OUTCOMES
