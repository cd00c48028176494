"""The assembler alone (no files): which checkpoints each output tensor is made of."""

from __future__ import annotations

import pytest

from layerswap.spaces.recipe import RecipeError, parse_recipe
from layerswap.spaces.zones import layer_map, unused_sides
from layerswap.trainables.merge.arch import NON_LAYER, ArchitectureError, ParamSlot, param_slot
from layerswap.trainables.merge.assembly import build_assembly, recipe_refs
from layerswap.trainables.merge.terms import DeltaMerge, Linear

L = 12
ATTN = [
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "input_layernorm.weight",
]
MLP = [
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_attention_layernorm.weight",
]
NON = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]


def llama_names(n: int = L) -> list[str]:
    names = ["model.embed_tokens.weight"]
    for i in range(n):
        names += [f"model.layers.{i}.{p}" for p in ATTN + MLP]
    return [*names, "model.norm.weight", "lm_head.weight"]


def swap(**kw):
    data = {"method": "layer_swap", "task_expert": "T", "language_expert": "G"}
    return parse_recipe({**data, **kw})


LANG = Linear((("G", 1.0),))
TASK = Linear((("T", 1.0),))


def avg(wt=0.5, wl=0.5):
    return Linear((("T", wt), ("G", wl)))


def by_letter(letter, wt=0.5, wl=0.5):
    return {"L": LANG, "T": TASK, "X": avg(wt, wl), "B": Linear((("B", 1.0),))}[letter]


def check_layers(assembly, attention: str, mlp: str, non_layer: Linear, wt=0.5, wl=0.5):
    assert len(attention) == len(mlp) == L
    for i in range(L):
        for p in ATTN:
            assert assembly[f"model.layers.{i}.{p}"] == by_letter(attention[i], wt, wl), (i, p)
        for p in MLP:
            assert assembly[f"model.layers.{i}.{p}"] == by_letter(mlp[i], wt, wl), (i, p)
    for name in NON:
        assert assembly[name] == non_layer, name


# --- arch ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "slot"),
    [
        ("model.layers.3.self_attn.q_proj.weight", ParamSlot(3, "attention")),
        ("model.layers.3.input_layernorm.weight", ParamSlot(3, "attention")),
        ("model.layers.10.mlp.down_proj.weight", ParamSlot(10, "mlp")),
        ("model.layers.10.post_attention_layernorm.weight", ParamSlot(10, "mlp")),
        (
            "base_model.model.model.layers.2.self_attn.v_proj.lora_A.weight",
            ParamSlot(2, "attention"),
        ),
        ("model.embed_tokens.weight", NON_LAYER),
        ("model.norm.weight", NON_LAYER),
        ("lm_head.weight", NON_LAYER),
    ],
)
def test_param_slot(name, slot):
    assert param_slot(name) == slot


def test_param_slot_rejects_unknown_layer_parameters():
    with pytest.raises(ArchitectureError, match=r"model\.layers\.4\.router\.weight"):
        param_slot("model.layers.4.router.weight")


# --- layer swap assemblies ------------------------------------------------------------------------


def test_assembly_covers_every_name_in_order():
    names = llama_names()
    assembly = build_assembly(swap(bottom=3, top=2), names, L)
    assert list(assembly) == names


@pytest.mark.parametrize(
    ("zones", "row"),
    [
        ({"bottom": 3, "top": 2}, "LLLTTTTTTTLL"),
        ({"bottom": 3, "top": 2, "bottom_transition": 1}, "LLLXTTTTTTLL"),
        ({"bottom": 3, "top": 2, "top_transition": 1}, "LLLTTTTTTXLL"),
        ({"bottom": 2, "top": 1, "bottom_transition": 2, "top_transition": 3}, "LLXXTTTTXXXL"),
    ],
)
def test_layer_swap_zones(zones, row):
    assembly = build_assembly(swap(**zones), llama_names(), L)
    check_layers(assembly, row, row, avg())


@pytest.mark.parametrize(
    ("policy", "expected"), [("average", avg()), ("language", LANG), ("task", TASK)]
)
def test_non_layer_policies(policy, expected):
    assembly = build_assembly(swap(bottom=3, top=2, non_layer=policy), llama_names(), L)
    check_layers(assembly, "LLLTTTTTTTLL", "LLLTTTTTTTLL", expected)


def test_explicit_transition_weights_are_normalised():
    r = swap(bottom=3, top=2, bottom_transition=1, transition_weights={"task": 3, "language": 1})
    assembly = build_assembly(r, llama_names(), L)
    check_layers(assembly, "LLLXTTTTTTLL", "LLLXTTTTTTLL", avg(0.75, 0.25), 0.75, 0.25)


def test_zero_weight_side_makes_a_plain_take():
    r = swap(bottom=3, top=2, top_transition=1, transition_weights={"task": 0, "language": 2})
    assembly = build_assembly(r, llama_names(), L)
    assert assembly["model.layers.9.mlp.up_proj.weight"] == LANG
    assert assembly["model.layers.9.mlp.up_proj.weight"].take == "G"
    assert assembly["model.embed_tokens.weight"].take == "G"


@pytest.mark.parametrize(
    ("partition", "attention", "mlp"),
    [
        ("A", "L" * 12, "LLLLLLTTTTLL"),
        ("B", "L" * 12, "L" * 12),
        ("C", "LLLLLLTTTTLL", "LLLLLLTTTTLL"),
    ],
)
def test_partitions_norms_travel_with_their_block(partition, attention, mlp):
    assembly = build_assembly(swap(partition=partition), llama_names(), L)
    check_layers(assembly, attention, mlp, avg())
    if partition == "A":
        assert assembly["model.layers.7.input_layernorm.weight"] == LANG
        assert assembly["model.layers.7.post_attention_layernorm.weight"] == TASK


def test_magnitude_weights_are_inverse_mav_normalised():
    mavs = {(("T", 1.0),): 0.02, (("G", 1.0),): 0.04}
    calls = []

    def oracle(terms):
        calls.append(terms)
        return mavs[terms]

    r = swap(bottom=3, top=2, bottom_transition=1, base="B", transition_weights="magnitude")
    assembly = build_assembly(r, llama_names(), L, oracle)
    # 1/0.02 : 1/0.04 = 2 : 1
    wt, wl = 2 / 3, 1 / 3
    x = assembly["model.layers.3.self_attn.q_proj.weight"]
    assert [ref for ref, _ in x.terms] == ["T", "G"]
    assert x.terms[0][1] == pytest.approx(wt, abs=1e-12)
    assert x.terms[1][1] == pytest.approx(wl, abs=1e-12)
    assert assembly["model.norm.weight"] == x  # averaged non-layer uses the same weights
    assert set(calls) == set(mavs)


def test_magnitude_weights_undefined_when_an_expert_equals_base():
    r = swap(bottom=3, top=2, base="B", transition_weights="magnitude")
    with pytest.raises(RecipeError, match=r"magnitude weights undefined.*'G'"):
        build_assembly(r, llama_names(), L, lambda terms: 0.0 if terms[0][0] == "G" else 0.1)


def test_magnitude_without_oracle_is_an_error():
    r = swap(bottom=3, top=2, base="B", transition_weights="magnitude")
    with pytest.raises(RecipeError, match="base"):
        build_assembly(r, llama_names(), L)


def test_expert_soups_inside_a_layer_swap():
    r = swap(
        bottom=3,
        top=2,
        top_transition=1,
        task_expert={"soup": ["T1", "T2"]},
        language_expert={"soup": ["G1", "G2", "G3"], "weights": [2, 1, 1]},
        transition_weights={"task": 1, "language": 3},
    )
    assembly = build_assembly(r, llama_names(), L)
    task = dict(assembly["model.layers.5.mlp.up_proj.weight"].terms)
    lang = dict(assembly["model.layers.0.self_attn.q_proj.weight"].terms)
    trans = dict(assembly["model.layers.9.self_attn.q_proj.weight"].terms)
    assert task == pytest.approx({"T1": 0.5, "T2": 0.5})
    assert lang == pytest.approx({"G1": 0.5, "G2": 0.25, "G3": 0.25})
    assert trans == pytest.approx(
        {"T1": 0.125, "T2": 0.125, "G1": 0.375, "G2": 0.1875, "G3": 0.1875}
    )
    assert assembly["model.layers.5.mlp.up_proj.weight"].take is None


def test_soup_with_repeated_checkpoint_merges_its_terms():
    r = swap(bottom=1, top=1, bottom_transition=1, language_expert={"soup": ["T", "G"]})
    assembly = build_assembly(r, llama_names(), L)
    # transition = 0.5 T + 0.5 (0.5 T + 0.5 G) = 0.75 T + 0.25 G
    assert dict(assembly["model.layers.1.mlp.up_proj.weight"].terms) == pytest.approx(
        {"T": 0.75, "G": 0.25}
    )


# --- other methods ---------------------------------------------------------------------------


def test_soup_assemblies():
    names = llama_names()
    uni = build_assembly(parse_recipe({"method": "soup", "models": ["a", "b", "c"]}), names, L)
    assert all(
        dict(op.terms) == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}) for op in uni.values()
    )
    exp = build_assembly(
        parse_recipe({"method": "soup", "models": ["a", "b", "c"], "weights": [1, 2, 1]}), names, L
    )
    assert all(dict(op.terms) == {"a": 0.25, "b": 0.5, "c": 0.25} for op in exp.values())
    mag = build_assembly(
        parse_recipe({"method": "soup", "models": ["a", "b"], "weights": "magnitude", "base": "z"}),
        names,
        L,
        lambda terms: {"a": 1.0, "b": 3.0}[terms[0][0]],
    )
    assert dict(mag["lm_head.weight"].terms) == pytest.approx({"a": 0.75, "b": 0.25})


def test_delta_assemblies():
    names = llama_names()
    ties = build_assembly(
        parse_recipe(
            {"method": "ties", "base": "z", "models": ["a", "b"], "density": 0.4, "scale": 0.5}
        ),
        names,
        L,
    )
    assert set(ties.values()) == {DeltaMerge("z", ("a", "b"), (1.0, 1.0), 0.5, 0.4)}
    ta = build_assembly(
        parse_recipe(
            {"method": "task_arithmetic", "base": "z", "models": ["a", "b"], "weights": [1, 0.5]}
        ),
        names,
        L,
    )
    assert set(ta.values()) == {DeltaMerge("z", ("a", "b"), (1.0, 0.5), 1.0, None)}


# --- revert ----------------------------------------------------------------------------------


def test_revert_replaces_cells_with_base():
    r = swap(
        bottom=3,
        top=2,
        base="B",
        revert=[{"layers": [0, 4], "components": ["attention"]}, {"layers": [11]}],
    )
    assembly = build_assembly(r, llama_names(), L)
    check_layers(assembly, "BLLTBTTTTTLB", "LLLTTTTTTTLB", avg())


def test_revert_partition_side_and_non_layer():
    r = swap(
        bottom=3,
        top=2,
        base="B",
        revert=[{"partition": "A", "side": "task"}, {"non_layer": True}],
    )
    assembly = build_assembly(r, llama_names(), L)
    check_layers(assembly, "LLLTTTTTTTLL", "LLLTTTBBBBLL", Linear((("B", 1.0),)))


def test_revert_on_a_soup():
    r = parse_recipe(
        {
            "method": "soup",
            "models": ["a", "b"],
            "base": "z",
            "revert": [{"partition": "C", "side": "language", "components": ["mlp"]}],
        }
    )
    assembly = build_assembly(r, llama_names(), L)
    for i in range(L):
        expected = "z" if i in (0, 1, 2, 3, 4, 5, 10, 11) else None
        assert assembly[f"model.layers.{i}.mlp.up_proj.weight"].take == expected
        assert assembly[f"model.layers.{i}.self_attn.q_proj.weight"].take is None


# --- errors ----------------------------------------------------------------------------------


def test_tensor_beyond_the_configured_depth():
    with pytest.raises(RecipeError, match=r"model\.layers\.12\..*12"):
        build_assembly(swap(bottom=1, top=1), llama_names(13), L)


def test_zones_deeper_than_model():
    with pytest.raises(RecipeError, match=r"(?s)bottom \(9\).*top \(4\).*12 layers"):
        build_assembly(swap(bottom=9, top=4), llama_names(), L)


def test_recipe_refs_first_mention_order_without_duplicates():
    r = swap(
        bottom=1,
        top=1,
        base="B",
        task_expert={"soup": ["T1", "G"]},
        language_expert={"soup": ["G", "G2"]},
    )
    assert recipe_refs(r) == ["T1", "G", "G2", "B"]
    s = parse_recipe({"method": "ties", "base": "z", "models": ["a", "b"]})
    assert recipe_refs(s) == ["a", "b", "z"]


def test_linear_take():
    assert Linear((("a", 1.0),)).take == "a"
    assert Linear((("a", 0.5),)).take is None
    assert Linear((("a", 0.5), ("b", 0.5))).take is None


@pytest.mark.parametrize(
    ("zones", "unused"),
    [
        ({"partition": "B"}, ["task"]),  # first 8 + last 4 of 12 layers: no task layer
        ({"bottom": 0, "top": 0}, ["language"]),
        ({"bottom": 8, "top": 4, "mlp": "task"}, []),  # the MLPs are the task expert's
        ({"bottom": 6, "top": 4, "bottom_transition": 2}, []),  # averaged layers: both
        ({"partition": "C"}, []),
    ],
)
def test_sides_that_own_no_layer(zones, unused):
    assert unused_sides(layer_map(swap(**zones), L)) == unused
