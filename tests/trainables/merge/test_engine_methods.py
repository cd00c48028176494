"""Soups, expert soups, TIES and task arithmetic on disk, against reference implementations."""

from __future__ import annotations

import pytest
import torch
from merge_expect import (
    assert_state,
    inverse_weights,
    mean_row_mav,
    merge,
    slot,
    swap_fields,
)

from layerswap.spaces.recipe import RecipeError
from layerswap.trainables.merge.ops import delta_merge

# --- soups -----------------------------------------------------------------------------------


def _soup_expected(states: list[dict], weights: list[float]) -> dict:
    out = {}
    for name, t in states[0].items():
        acc = sum(s[name].double() * w for s, w in zip(states, weights, strict=True))
        out[name] = acc.to(t.dtype)
    return out


@pytest.mark.parametrize("weights", ["uniform", "magnitude", [1.0, 2.0, 5.0]])
def test_soup_of_three(family, tmp_path, weights):
    roles = ["task", "language", "task2"]
    states = [family.state(r) for r in roles]
    if weights == "uniform":
        w = [1 / 3] * 3
    elif weights == "magnitude":
        w = inverse_weights([mean_row_mav(s, family.state("base")) for s in states])
        assert w[0] > w[2] > w[1]  # noise 0.02 < 0.03 < 0.04
    else:
        w = [x / sum(weights) for x in weights]
    fields = {
        "method": "soup",
        "models": [family.ref(r) for r in roles],
        "weights": weights,
        "base": family.ref("base"),
    }
    got = merge(fields, tmp_path / "out")
    assert_state(got, _soup_expected(states, w), exact=False)


def test_magnitude_soup_refuses_a_member_equal_to_base(family, tmp_path, nothing_written):
    fields = {
        "method": "soup",
        "models": [family.ref("task"), family.ref("base")],
        "weights": "magnitude",
        "base": family.ref("base"),
    }
    with pytest.raises(RecipeError, match="magnitude weights undefined"):
        merge(fields, tmp_path / "out")
    nothing_written(tmp_path / "out")


def test_expert_soups_inside_a_layer_swap(family, tmp_path):
    """Language soup x task soup: each side is its soup, transitions average the two soups."""
    fields = swap_fields(
        family,
        task_expert={"soup": [family.ref("task"), family.ref("task2")]},
        language_expert={
            "soup": [family.ref("language"), family.ref("lang2")],
            "weights": [3.0, 1.0],
        },
        bottom=3,
        top=2,
        bottom_transition=1,
        top_transition=1,
    )
    got = merge(fields, tmp_path / "out")
    task_soup = _soup_expected([family.state("task"), family.state("task2")], [0.5, 0.5])
    lang_soup = _soup_expected([family.state("language"), family.state("lang2")], [0.75, 0.25])
    row = "LLLXTTTTTXLL"
    expected = {}
    for name in family.names:
        layer, _ = slot(name)
        letter = "X" if layer is None else row[layer]
        t, g = task_soup[name].double(), lang_soup[name].double()
        expected[name] = {"T": t, "L": g, "X": 0.5 * t + 0.5 * g}[letter].float()
    assert_state(got, expected, exact=False)


def test_magnitude_soup_expert_with_magnitude_transitions(family, tmp_path):
    base = family.state("base")
    t1, t2 = family.state("task"), family.state("task2")
    w1, w2 = inverse_weights([mean_row_mav(t1, base), mean_row_mav(t2, base)])
    task_soup = {n: t1[n].double() * w1 + t2[n].double() * w2 for n in base}
    lang = {n: v.double() for n, v in family.state("language").items()}
    wt, wl = inverse_weights([mean_row_mav(task_soup, base), mean_row_mav(lang, base)])
    fields = swap_fields(
        family,
        task_expert={"soup": [family.ref("task"), family.ref("task2")], "weights": "magnitude"},
        bottom=2,
        top=2,
        top_transition=2,
        transition_weights="magnitude",
    )
    got = merge(fields, tmp_path / "out")
    row = "LLTTTTTTXXLL"
    expected = {}
    for name in family.names:
        layer, _ = slot(name)
        letter = "X" if layer is None else row[layer]
        t, g = task_soup[name], lang[name]
        expected[name] = {"T": t, "L": g, "X": wt * t + wl * g}[letter].float()
    assert_state(got, expected, exact=False)


# --- TIES and task arithmetic ----------------------------------------------------------------


def ties_reference(base, models, weights, density, scale):
    """TIES (Yadav et al. 2023) on one tensor, written independently of trainables.merge.ops."""
    b = base.float()
    taus = []
    for m in models:
        d = (m.float() - b).flatten()
        k = density * d.numel()
        assert k == int(k), "pick densities that give whole counts"
        keep = torch.zeros(d.numel(), dtype=torch.bool)
        keep[d.abs().topk(int(k)).indices] = True
        taus.append(torch.where(keep, d, torch.zeros_like(d)).double())
    weighted_sum = sum(w * t for w, t in zip(weights, taus, strict=True))
    elected = torch.sign(weighted_sum)
    num = torch.zeros_like(weighted_sum)
    den = torch.zeros_like(weighted_sum)
    for w, t in zip(weights, taus, strict=True):
        agrees = (torch.sign(t) == elected) & (t != 0)
        num += torch.where(agrees, w * t, 0.0)
        den += torch.where(agrees, w, 0.0)
    merged = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)
    return (b.double() + scale * merged.view(base.shape)).to(base.dtype)


def task_arithmetic_reference(base, models, weights, scale):
    b = base.double()
    return (b + scale * sum(w * (m.double() - b) for w, m in zip(weights, models, strict=True))).to(
        base.dtype
    )


def test_ties_by_hand():
    base = torch.zeros(4)
    m1 = torch.tensor([1.0, -2.0, 3.0, 0.5])
    m2 = torch.tensor([-1.0, 1.5, 2.0, -4.0])
    # trimmed to 2 of 4: [0, -2, 3, 0] and [0, 0, 2, -4]; elected signs [0, -, +, -]
    out = delta_merge(base, [m1, m2], [1.0, 1.0], 1.0, 0.5)
    assert torch.equal(out, torch.tensor([0.0, -2.0, 2.5, -4.0]))
    out = delta_merge(base + 1, [m1 + 1, m2 + 1], [1.0, 3.0], 2.0, 0.5)
    # weighted: [0, -2, 3+6, -12]: disjoint means [0, -2, 9/4, -4], scaled by 2, plus 1
    assert torch.equal(out, torch.tensor([1.0, -3.0, 5.5, -7.0]))


@pytest.mark.parametrize(
    ("density", "weights", "scale"),
    [(0.5, None, 1.0), (0.25, [1.0, 0.5, 2.0], 0.8), (1.0, [0.3, 1.0, 1.0], 1.0)],
)
def test_ties_on_disk(family, tmp_path, density, weights, scale):
    roles = ["task", "language", "task2"]
    fields = {
        "method": "ties",
        "base": family.ref("base"),
        "models": [family.ref(r) for r in roles],
        "density": density,
        "scale": scale,
    }
    if weights is not None:
        fields["weights"] = weights
    got = merge(fields, tmp_path / "out")
    w = weights or [1.0, 1.0, 1.0]
    base = family.state("base")
    expected = {
        n: ties_reference(base[n], [family.state(r)[n] for r in roles], w, density, scale)
        for n in family.names
    }
    assert_state(got, expected, exact=False)
    # trimming really happened: some entries are exactly base
    if density < 1.0:
        assert (
            got["model.layers.4.mlp.up_proj.weight"] == base["model.layers.4.mlp.up_proj.weight"]
        ).any()


@pytest.mark.parametrize(("weights", "scale"), [(None, 1.0), ([1.0, -0.5], 0.7)])
def test_task_arithmetic_on_disk(family, tmp_path, weights, scale):
    roles = ["task", "language"]
    fields = {
        "method": "task_arithmetic",
        "base": family.ref("base"),
        "models": [family.ref(r) for r in roles],
        "scale": scale,
    }
    if weights is not None:
        fields["weights"] = weights
    got = merge(fields, tmp_path / "out")
    w = weights or [1.0, 1.0]
    base = family.state("base")
    expected = {
        n: task_arithmetic_reference(base[n], [family.state(r)[n] for r in roles], w, scale)
        for n in family.names
    }
    assert_state(got, expected, exact=False)
