"""layerswap.world.sft's MGSM answer classes (right / slip / misread / no_equation), misread kinds and Belebele scores.

Run: .venv/bin/python -m pytest -q tests/world/test_world_sft.py
"""

from __future__ import annotations

import pytest

from layerswap.world.sft import MISREADS, OUTCOMES, answer_outcome, misread_kind


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


@pytest.mark.parametrize(
    ("text", "equation", "kind"),
    [
        (" 5 - 2 = 3. The answer is 3.", "5 - 2 = 3", None),  # right: no misread
        (" 5 - 2 = 4. The answer is 4.", "5 - 2 = 3", None),  # a slip, not a misread
        (" kamo tepi.", "5 - 2 = 3", None),  # no equation
        (" 5 + 2 = 7. Da mu 7.", "5 - 2 = 3", "operation"),  # xa's "give" read as adding
        (" 2 + 2 = 4. Da mu 4.", "5 - 2 = 3", "both"),
        (" 6 + 1 = 7. The answer is 7.", "5 + 1 = 6", "operands"),  # the giver's count copied
        (" 2 - 5 = -3. The answer is -3.", "5 - 2 = 3", "order"),
        (" 3 + 7 - 7 = 3.", "2 + 7 - 7 = 2", "operands"),
        (" 4 + 3 = 7.", "3 + 4 = 7", None),  # the same sum written the other way round is right
        (" 24 / 4 = 6.", "24 / 3 = 8", "operands"),
        (" 05 - 2 = 3.", "2 + 5 = 7", "operation"),  # 05 is 5: numbers compare as numbers
        (" 5 + 2 + 1 = 8.", "5 + 2 = 7", "both"),  # an extra term
        (" 3 - 4 + 2 = 1.", "3 + 4 - 2 = 5", "order"),  # the same terms, other signs where
    ],
)
def test_misread_kind(text, equation, kind):
    assert misread_kind(text, equation) == kind
    assert kind is None or kind in MISREADS


def test_belebele_accuracy_gold_probability_and_brier_from_option_loglikelihoods():
    import math

    import torch

    from layerswap.world.sft import belebele_accuracy_of, belebele_brier, belebele_gold_prob

    rows = [{"correct_answer_num": "2"}, {"correct_answer_num": "4"}, {"correct_answer_num": "1"}]
    p = [[0.1, 0.7, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25], [0.4, 0.4, 0.1, 0.1]]
    logps = torch.tensor(p, dtype=torch.float64).log() - 3.0  # likelihoods, not normalised
    # row 1 right; row 2 a four-way tie: option A, wrong; row 3 a tie of A and B: A, right
    assert belebele_accuracy_of(logps, rows) == 2 / 3
    assert math.isclose(belebele_gold_prob(logps, rows), (0.7 + 0.25 + 0.4) / 3, rel_tol=1e-12)
    assert belebele_accuracy_of(logps[:0], []) == belebele_gold_prob(logps[:0], []) == 0.0
    # Brier: (1 - p_gold)^2 + the other options' p^2, per row, averaged
    brier = ((0.3**2 + 3 * 0.1**2) + (0.75**2 + 3 * 0.25**2) + (0.6**2 + 0.4**2 + 2 * 0.1**2)) / 3
    assert math.isclose(belebele_brier(logps, rows), brier, rel_tol=1e-12)
    assert belebele_brier(logps[:0], []) == 0.0


def test_belebele_readings_equal_lm_eval_on_the_world_tasks(tiny_world, one_thread, tmp_path):
    """layerswap.world.sft's Belebele accuracy and Brier score (the world probe's) equal lm-eval's numbers
    on the world's task YAMLs, scored by the proxy evaluator (the search's)."""
    import math

    from layerswap.trainables.evaluate.proxy import ProxyEvaluator
    from layerswap.trainables.evaluate.tasks import write_world_tasks
    from layerswap.world.sft import (
        belebele_accuracy_of,
        belebele_brier,
        belebele_option_logps,
        load_base,
        read_rows,
    )

    model, tok = load_base(tiny_world)
    rows = read_rows(tiny_world, "data/belebele/xa/dev.jsonl")[:12]
    logps = belebele_option_logps(model, tok, rows)
    tasks = write_world_tasks(tiny_world, tmp_path)
    names = ["world_belebele_xa_dev", "world_belebele_brier_xa_dev"]
    assert set(names) <= set(tasks)
    ev = ProxyEvaluator(names, tok, include_path=str(tmp_path), limit=12)
    agg = ev.score(model).aggregate
    assert agg["world_belebele_xa_dev"]["acc,none"] == belebele_accuracy_of(logps, rows)
    brier = agg["world_belebele_brier_xa_dev"]["brier_score,none"]
    assert math.isclose(brier, belebele_brier(logps, rows), abs_tol=1e-5)
    assert 0 < brier < 2
