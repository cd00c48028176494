"""A proxy's scale: chance, best and worst, validated once; lower-is-better metrics (Brier) too.

Run: .venv/bin/python -m pytest -q tests/spaces/test_search_experiment.py
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from layerswap.spaces.search_experiment import Proxy, world_proxies, world_readings


def test_accuracy_defaults_are_the_old_rule():
    p = Proxy(task="t", chance=0.25)
    assert not p.lower_is_better
    assert p.normalise(0.25) == 0 and p.normalise(1.0) == 1 and p.normalise(0.625) == 0.5
    assert p.to_unit(0.4) == 0.4 and p.from_unit(0.4) == 0.4


def test_brier_scale_points_down():
    p = Proxy(task="t", chance=0.75, best=0.0, worst=2.0)
    assert p.lower_is_better
    assert p.normalise(0.0) == 1 and p.normalise(0.75) == 0 and p.normalise(1.5) == -1
    assert (
        p.to_unit(0.0) == 1
        and p.to_unit(2.0) == 0
        and p.from_unit(p.to_unit(0.3)) == pytest.approx(0.3)
    )


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"chance": 1.0}, "chance 1.0 must lie between worst 0.0 and best 1.0"),
        ({"chance": -0.1}, "chance -0.1 must lie"),
        ({"chance": 0.75, "best": 0.0, "worst": 0.0}, "best 0.0 equals worst 0.0"),
        ({"chance": 2.5, "best": 0.0, "worst": 2.0}, "chance 2.5 must lie"),
        ({"chance": 0.0, "best": 0.0, "worst": 2.0}, "differ from best"),
    ],
)
def test_bad_scales_name_the_value(kw, words):
    with pytest.raises(ValidationError, match=words):
        Proxy(task="t", **kw)


def test_world_readings_and_the_default():
    readings = world_readings("xa")
    assert list(readings) == [
        "world_belebele_xa_dev",
        "world_belebele_brier_xa_dev",
        "world_mgsm_direct_en_dev",
    ]
    assert [p.lower_is_better for p in readings.values()] == [False, True, False]
    assert world_proxies("xa") == [readings["world_belebele_brier_xa_dev"]]


def test_infinite_or_nan_scales_are_refused():
    for field in ("chance", "best", "worst"):
        for bad in (float("inf"), float("nan")):
            with pytest.raises(ValidationError, match=field):
                Proxy(task="t", **{field: bad})


def test_a_trial_takes_one_gpu_at_most():
    """A trial scores one model on one device: a second GPU would be reserved and sit idle."""
    from layerswap.spaces.search_experiment import SearchSettings

    assert SearchSettings(gpus_per_trial=0.5).gpus_per_trial == 0.5
    assert SearchSettings(gpus_per_trial=1).gpus_per_trial == 1
    for g in (2, 1.5):
        with pytest.raises(ValueError, match=f"gpus_per_trial {float(g)}: a trial scores one model on one GPU"):  # fmt: skip
            SearchSettings(gpus_per_trial=g)
