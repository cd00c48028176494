"""Layer swaps on disk, tensor by tensor: zones, non-layer policies, weights, partitions, revert."""

from __future__ import annotations

import pytest
import torch
from merge_expect import (
    NON_LAYER,
    assert_state,
    expected_swap,
    inverse_weights,
    mean_row_mav,
    merge,
    swap_fields,
)

# --- zones, tensor by tensor -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("zones", "row"),
    [
        ({"bottom": 3, "top": 2}, "LLLTTTTTTTLL"),  # t = 0: no transition layer at all
        ({"bottom": 3, "top": 2, "bottom_transition": 1}, "LLLXTTTTTTLL"),  # layer b is X
        ({"bottom": 3, "top": 2, "top_transition": 1}, "LLLTTTTTTXLL"),  # layer L-u-1 is X
        ({"bottom": 2, "top": 1, "bottom_transition": 2, "top_transition": 3}, "LLXXTTTTXXXL"),
        ({"bottom": 0, "top": 0, "bottom_transition": 1, "top_transition": 1}, "XTTTTTTTTTTX"),
        ({"bottom": 5, "top": 3, "bottom_transition": 2, "top_transition": 2}, "LLLLLXXXXLLL"),
    ],
)
def test_layer_swap_zones_on_disk(family, tmp_path, zones, row):
    got = merge(swap_fields(family, **zones), tmp_path / "out")
    assert_state(got, expected_swap(family, row, row, "X"))


@pytest.mark.parametrize(("policy", "letter"), [("average", "X"), ("language", "L"), ("task", "T")])
def test_non_layer_policies(family, tmp_path, policy, letter):
    got = merge(swap_fields(family, bottom=4, top=2, non_layer=policy), tmp_path / "out")
    row = "LLLLTTTTTTLL"
    assert_state(got, expected_swap(family, row, row, letter))
    # make sure the three non-layer tensors really are what the policy says
    src = {"L": family.state("language"), "T": family.state("task")}
    for name in NON_LAYER:
        if letter == "X":
            assert not torch.equal(got[name], src["L"][name])
            assert not torch.equal(got[name], src["T"][name])
        else:
            assert torch.equal(got[name], src[letter][name])


@pytest.mark.parametrize("policy", ["average", "language", "task"])
def test_tied_embeddings(tied_family, tmp_path, policy):
    fam = tied_family
    assert "lm_head.weight" not in fam.names
    got = merge(
        swap_fields(fam, bottom=3, top=2, top_transition=1, non_layer=policy), tmp_path / "o"
    )
    row = "LLLTTTTTTXLL"
    letter = {"average": "X", "language": "L", "task": "T"}[policy]
    assert_state(got, expected_swap(fam, row, row, letter))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "o")
    assert model.config.tie_word_embeddings
    assert torch.equal(model.lm_head.weight.detach(), got["model.embed_tokens.weight"])


def test_explicit_transition_weights(family, tmp_path):
    fields = swap_fields(
        family,
        bottom=3,
        top=2,
        bottom_transition=1,
        top_transition=1,
        transition_weights={"task": 3, "language": 1},
    )
    got = merge(fields, tmp_path / "out")
    row = "LLLXTTTTTXLL"
    assert_state(got, expected_swap(family, row, row, "X", w_task=0.75), exact=False)
    # the average leans to the task expert, not the language expert
    name = "model.layers.3.mlp.up_proj.weight"
    t, g = family.state("task")[name], family.state("language")[name]
    assert (got[name] - t).abs().sum() < (got[name] - g).abs().sum()


def test_magnitude_transition_weights(family, tmp_path):
    base = family.state("base")
    m_task = mean_row_mav(family.state("task"), base)
    m_lang = mean_row_mav(family.state("language"), base)
    w_task, w_lang = inverse_weights([m_task, m_lang])
    # language noise is twice the task noise, so the task expert weighs about twice as much
    assert w_task == pytest.approx(2 / 3, abs=0.02)
    fields = swap_fields(
        family,
        bottom=3,
        top=2,
        bottom_transition=1,
        top_transition=1,
        transition_weights="magnitude",
    )
    got = merge(fields, tmp_path / "out")
    row = "LLLXTTTTTXLL"
    assert_state(got, expected_swap(family, row, row, "X", w_task=w_task), exact=False)
    # taken layers stay bit-exact
    assert torch.equal(
        got["model.layers.0.mlp.up_proj.weight"],
        family.state("language")["model.layers.0.mlp.up_proj.weight"],
    )
    assert w_lang == pytest.approx(1 - w_task)


# --- partitions and component zones ----------------------------------------------------------


@pytest.mark.parametrize(
    ("partition", "attention", "mlp"),
    [
        # A: all attention language; MLP of the first 6 and last 2 layers language
        ("A", "LLLLLLLLLLLL", "LLLLLLTTTTLL"),
        # B: first 8 and last 4 layers language (nothing left for math at 12 layers)
        ("B", "LLLLLLLLLLLL", "LLLLLLLLLLLL"),
        # C: first 6 and last 2 layers language
        ("C", "LLLLLLTTTTLL", "LLLLLLTTTTLL"),
    ],
)
def test_partitions(family, tmp_path, partition, attention, mlp):
    fields = swap_fields(family, partition=partition)
    got = merge(fields, tmp_path / "out")
    assert_state(got, expected_swap(family, attention, mlp, "X"))
    if partition == "A":
        # norms travel with their block: input_layernorm with attention, post-attn with MLP
        lang, task = family.state("language"), family.state("task")
        assert torch.equal(
            got["model.layers.7.input_layernorm.weight"],
            lang["model.layers.7.input_layernorm.weight"],
        )
        assert torch.equal(
            got["model.layers.7.post_attention_layernorm.weight"],
            task["model.layers.7.post_attention_layernorm.weight"],
        )


def test_component_zones_of_their_own(family, tmp_path):
    fields = swap_fields(
        family,
        bottom=2,
        top=2,
        attention={"bottom": 1, "top": 3, "bottom_transition": 1},
        mlp="task",
    )
    got = merge(fields, tmp_path / "out")
    assert_state(got, expected_swap(family, "LXTTTTTTTLLL", "TTTTTTTTTTTT", "X"))


# --- revert ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("revert", "attention", "mlp", "non_layer"),
    [
        ([{"layers": [0, 5, 11]}], "BLLTTBTTTTLB", "BLLTTBTTTTLB", "X"),
        ([{"layers": [1, 6], "components": ["mlp"]}], "LLLTTTTTTTLL", "LBLTTTBTTTLL", "X"),
        ([{"partition": "A", "side": "task"}], "LLLTTTTTTTLL", "LLLTTTBBBBLL", "X"),
        (
            [{"partition": "C", "side": "language", "components": ["attention"]}],
            "BBBBBBTTTTBB",
            "LLLTTTTTTTLL",
            "X",
        ),
        ([{"non_layer": True}], "LLLTTTTTTTLL", "LLLTTTTTTTLL", "B"),
        (
            [{"partition": "A", "side": "language"}, {"non_layer": True}],
            "BBBBBBBBBBBB",
            "BBBBBBTTTTBB",
            "B",
        ),
    ],
)
def test_revert_resets_to_base_bit_exactly(family, tmp_path, revert, attention, mlp, non_layer):
    got = merge(swap_fields(family, bottom=3, top=2, revert=revert), tmp_path / "out")
    assert_state(got, expected_swap(family, attention, mlp, non_layer))


def test_revert_after_a_soup(family, tmp_path):
    fields = {
        "method": "soup",
        "models": [family.ref("task"), family.ref("language")],
        "base": family.ref("base"),
        "revert": [{"layers": [2], "components": ["attention"]}, {"non_layer": True}],
    }
    got = merge(fields, tmp_path / "out")
    expected = expected_swap(family, "XXBXXXXXXXXX", "X" * 12, "B")
    assert_state(got, expected)
