"""The zone table of docs/method.md as pure functions: layer sources, depth checks, reverts.

Expectations are written out by hand, one letter per layer:
L = language expert, X = transition (weighted average), T = task expert.
"""

from __future__ import annotations

import pytest

from layerswap.spaces.recipe import RecipeError, RevertSpec, Zones, parse_recipe
from layerswap.spaces.zones import check_fits, layer_map, layer_source, reverted

LETTER = {"language": "L", "transition": "X", "task": "T"}


def _swap(**kw):
    data = {"method": "layer_swap", "task_expert": "/t", "language_expert": "/l", "base": "/b"}
    return parse_recipe({**data, **kw})


def _row(zones: Zones, n: int) -> str:
    return "".join(LETTER[layer_source(zones, n, i)] for i in range(n))


@pytest.mark.parametrize(
    ("b", "tb", "tu", "u", "n", "expected"),
    [
        # no transitions: [0,b) language, [b, L-u) task, [L-u, L) language
        (3, 0, 0, 2, 12, "LLLTTTTTTTLL"),
        (5, 0, 0, 2, 12, "LLLLLTTTTTLL"),
        # t_b > 0: layer b itself is a transition layer (the pseudocode's `or` never yields one)
        (3, 1, 0, 2, 12, "LLLXTTTTTTLL"),
        # t_u > 0: layer L-u-1 is a transition layer
        (3, 0, 1, 2, 12, "LLLTTTTTTXLL"),
        (3, 1, 1, 2, 12, "LLLXTTTTTXLL"),
        (3, 2, 2, 2, 12, "LLLXXTTTXXLL"),
        (4, 2, 1, 0, 12, "LLLLXXTTTTTX"),
        # no bottom / no top
        (0, 0, 0, 0, 12, "TTTTTTTTTTTT"),
        (0, 1, 0, 0, 12, "XTTTTTTTTTTT"),
        (0, 0, 1, 0, 12, "TTTTTTTTTTTX"),
        # zones exactly fill the depth: no task layer left
        (3, 1, 1, 2, 7, "LLLXXLL"),
        (8, 0, 0, 4, 12, "LLLLLLLLLLLL"),
        (6, 3, 3, 0, 12, "LLLLLLXXXXXX"),
        # the paper's 32-layer default b=5, u=2, t=0
        (5, 0, 0, 2, 32, "LLLLL" + "T" * 25 + "LL"),
    ],
)
def test_layer_source_follows_the_zone_table(b, tb, tu, u, n, expected):
    z = Zones(bottom=b, top=u, bottom_transition=tb, top_transition=tu)
    assert _row(z, n) == expected


def test_without_transitions_there_is_no_transition_layer():
    for b in range(0, 7):
        for u in range(0, 13 - b):
            row = _row(Zones(bottom=b, top=u), 12)
            assert "X" not in row
            assert row == "L" * b + "T" * (12 - b - u) + "L" * u


@pytest.mark.parametrize("layer", [-1, 12, 40])
def test_layer_source_out_of_range(layer):
    with pytest.raises(IndexError, match=str(layer)):
        layer_source(Zones(bottom=1, top=1), 12, layer)


def test_check_fits_names_fields_and_depth():
    check_fits(Zones(bottom=5, top=3, bottom_transition=2, top_transition=2), 12)  # == 12 fits
    with pytest.raises(RecipeError) as e:
        check_fits(Zones(bottom=5, top=3, bottom_transition=2, top_transition=3), 12)
    msg = str(e.value)
    for part in ("bottom (5)", "bottom_transition (2)", "top_transition (3)", "top (3)", "= 13"):
        assert part in msg
    assert "12 layers" in msg


def test_layer_map_applies_component_overrides():
    r = _swap(
        bottom=3,
        top=2,
        top_transition=1,
        attention="task",
        mlp={"bottom": 3, "top": 2, "top_transition": 1},
    )
    owner = layer_map(r, 12)
    assert "".join(LETTER[s] for s in owner["attention"]) == "T" * 12
    assert "".join(LETTER[s] for s in owner["mlp"]) == "LLLTTTTTTXLL"


@pytest.mark.parametrize(
    ("partition", "attention", "mlp"),
    [
        ("A", "L" * 12, "LLLLLLTTTTLL"),
        ("B", "L" * 12, "L" * 12),
        ("C", "LLLLLLTTTTLL", "LLLLLLTTTTLL"),
    ],
)
def test_partitions_on_12_layers(partition, attention, mlp):
    owner = layer_map(_swap(partition=partition), 12)
    assert "".join(LETTER[s] for s in owner["attention"]) == attention
    assert "".join(LETTER[s] for s in owner["mlp"]) == mlp


def test_partition_b_on_32_layers():
    owner = layer_map(_swap(partition="B"), 32)
    expected = "L" * 8 + "T" * 20 + "L" * 4
    assert "".join(LETTER[s] for s in owner["attention"]) == expected
    assert "".join(LETTER[s] for s in owner["mlp"]) == expected


def test_layer_map_rejects_zones_deeper_than_the_model():
    with pytest.raises(RecipeError, match=r"(?s)bottom \(8\).*top \(5\).*= 13.*12 layers"):
        layer_map(_swap(bottom=8, top=5), 12)
    # an override names its own field
    with pytest.raises(RecipeError, match=r"recipe\.mlp.*= 9.*8 layers"):
        layer_map(_swap(bottom=1, top=1, mlp={"bottom": 6, "top": 3}), 8)
    with pytest.raises(RecipeError, match="8 layers"):
        layer_map(_swap(partition="B"), 8)
    # layer-level zones that both components override are unused, but stored with the model
    with pytest.raises(RecipeError, match=r"recipe: bottom \(100\).*= 150.*6 layers"):
        layer_map(_swap(bottom=100, top=50, attention="task", mlp={"bottom": 1, "top": 1}), 6)


def _cells(pairs):
    return {(i, c) for i, c in pairs}


def test_reverted_explicit_layers_and_components():
    cells, non_layer = reverted([RevertSpec(layers=[0, 11], components=["mlp"])], 12)
    assert cells == {(0, "mlp"), (11, "mlp")}
    assert non_layer is False
    cells, _ = reverted([RevertSpec(layers=[3])], 12)
    assert cells == {(3, "attention"), (3, "mlp")}


def test_reverted_partition_side():
    # partition A, task side: MLP of layers 6..9 (attention is all language)
    cells, non_layer = reverted([RevertSpec(partition="A", side="task")], 12)
    assert cells == {(i, "mlp") for i in (6, 7, 8, 9)}
    assert not non_layer
    cells, _ = reverted([RevertSpec(partition="A", side="language")], 12)
    assert cells == {(i, "attention") for i in range(12)} | {
        (i, "mlp") for i in (0, 1, 2, 3, 4, 5, 10, 11)
    }
    cells, _ = reverted([RevertSpec(partition="C", side="language", components=["attention"])], 12)
    assert cells == {(i, "attention") for i in (0, 1, 2, 3, 4, 5, 10, 11)}


def test_reverted_non_layer_and_union():
    cells, non_layer = reverted(
        [RevertSpec(non_layer=True), RevertSpec(layers=[1], components=["attention"])], 12
    )
    assert non_layer is True
    assert cells == {(1, "attention")}


def test_reverted_rejects_layers_outside_the_model():
    with pytest.raises(RecipeError, match=r"\[12\].*12 layers"):
        reverted([RevertSpec(layers=[3, 12])], 12)
