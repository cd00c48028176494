"""The merge-method registry covers every recipe model, once, under the method it declares."""

from __future__ import annotations

import typing

from layerswap.spaces.recipe import Recipe
from layerswap.trainables.merge.methods import METHODS


def test_every_recipe_model_has_one_entry_under_its_method():
    union = typing.get_args(
        typing.get_args(Recipe)[0]
    )  # Annotated[A | B | ..., Field] -> A, B, ...
    declared = {typing.get_args(m.model_fields["method"].annotation)[0]: m for m in union}
    assert set(METHODS) == set(declared)
    for name, entry in METHODS.items():
        assert entry.recipe is declared[name]
