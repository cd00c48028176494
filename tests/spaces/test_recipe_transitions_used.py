"""A layer-level transition that no component uses is refused: with `attention` and `mlp` both
given their own spec (partition A), the layer-level zones merge nothing but are stored with the
model and hashed into its id, so `partition: A` + `bottom_transition: 2` claimed a swap that was
not made. The search's component form (layer-level zones repeating the MLP's) still decodes.

Run: .venv/bin/python -m pytest -q tests/spaces/test_recipe_transitions_used.py
"""

from __future__ import annotations

import pytest

from layerswap.spaces.recipe import parse_recipe
from layerswap.spaces.search_space import SearchSpace, decode
from layerswap.spaces.zones import layer_map

SWAP = {"method": "layer_swap", "task_expert": "/t", "language_expert": "/l"}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"partition": "A", "bottom_transition": 2}, "bottom_transition 2"),
        ({"partition": "A", "top_transition": 1}, "top_transition 1"),
        (
            {"bottom": 6, "top": 2, "bottom_transition": 1, "attention": "language",
             "mlp": {"bottom": 6, "top": 2}},
            "bottom_transition 1",
        ),
        (
            {"bottom": 1, "top": 1, "top_transition": 2, "attention": {"bottom": 2, "top": 1},
             "mlp": "task"},
            "top_transition 2",
        ),
    ],
)  # fmt: skip
def test_a_transition_no_component_uses_is_refused_by_name(fields, named):
    with pytest.raises(ValueError, match=f"{named} is used by no component"):
        parse_recipe({**SWAP, **fields})


def test_the_search_component_form_decodes_and_its_miscopy_is_refused():
    """decode writes the sampled zones both at layer level and in mlp: accepted, merged as said.
    The same recipe with the layer-level transitions not the MLP's is refused."""
    space = SearchSpace(granularity=["component"], attention=["language"])
    params = {"bottom": 2, "top": 1, "bottom_transition": 1, "top_transition": 1}
    r = decode({**params, "granularity": "component", "attention": "language"}, space, 12)
    letter = {"language": "L", "task": "T", "transition": "X"}
    assert "".join(letter[s] for s in layer_map(r, 12)["mlp"]) == "LLXTTTTTTTXL"
    data = r.model_dump(exclude_none=True)
    data["mlp"] = {**data["mlp"], "bottom_transition": 0}
    with pytest.raises(ValueError, match="bottom_transition 1 is used by no component"):
        parse_recipe(data)
