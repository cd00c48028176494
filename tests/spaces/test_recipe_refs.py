"""Recipe references and content-keyed ids (spaces.recipe.model_refs, recipe_id's model_ids).

Pure: the content ids here are made-up strings; tests/trainables/test_model_ids.py computes real
ones from checkpoint folders. Run: .venv/bin/python -m pytest -q tests/spaces/test_recipe_refs.py
"""

from __future__ import annotations

import pytest
from test_recipe import EXAMPLES, SWAP

from layerswap.spaces.recipe import dump_recipe, model_refs, parse_recipe, recipe_id

REFS = {
    "layer_swap": ["/ckpt/math", "/ckpt/swahili", "/ckpt/base"],
    "layer_swap_full": ["/ckpt/math", "/ckpt/sw1", "/ckpt/sw2", "/ckpt/base"],
    "soup": ["/a", "/b", "/c", "/0"],
    "soup_explicit": ["/a", "/b"],
    "task_arithmetic": ["/a", "/b", "/0"],
    "ties": ["/a", "/b", "/c", "/0"],
    "revert_partition": ["/ckpt/math", "/ckpt/swahili", "/ckpt/base"],
}


def _ids(recipe, salt: str = "") -> dict[str, str]:
    return {r: f"sha256:{salt}{r.strip('/')}" for r in model_refs(recipe)}


@pytest.mark.parametrize("key", sorted(REFS))
def test_model_refs_names_every_checkpoint(key):
    assert model_refs(parse_recipe(EXAMPLES[key])) == REFS[key]


def test_model_refs_covers_both_soups_without_duplicates():
    r = parse_recipe(
        {**SWAP, "task_expert": {"soup": ["/t", "/g"]}, "language_expert": {"soup": ["/g", "/l"]}}
    )
    assert model_refs(r) == ["/t", "/g", "/l", "/ckpt/base"]


def test_no_base_no_base_ref():
    assert model_refs(parse_recipe({**SWAP, "base": None})) == ["/ckpt/math", "/ckpt/swahili"]


@pytest.mark.parametrize("key", sorted(REFS))
def test_content_ids_replace_the_paths(key):
    r = parse_recipe(EXAMPLES[key])
    assert recipe_id(r, _ids(r)) != recipe_id(r)  # the paths no longer enter the hash
    assert recipe_id(r, _ids(r)) != recipe_id(r, _ids(r, "x"))  # the content ids do


@pytest.mark.parametrize("key", sorted(REFS))
def test_same_content_elsewhere_same_id(key):
    """The same recipe over checkpoints stored under other paths, with the same content."""
    here = parse_recipe(EXAMPLES[key])
    data = {**EXAMPLES[key]}
    moved = {r: "/elsewhere" + r for r in model_refs(here)}
    for k in ("task_expert", "language_expert", "base"):
        v = data.get(k)
        if isinstance(v, str):
            data[k] = moved[v]
        elif isinstance(v, dict):
            data[k] = {**v, "soup": [moved[m] for m in v["soup"]]}
    if "models" in data:
        data["models"] = [moved[m] for m in data["models"]]
    there = parse_recipe(data)
    assert model_refs(there) == [moved[r] for r in model_refs(here)]
    assert recipe_id(there) != recipe_id(here)
    ids_there = {moved[r]: c for r, c in _ids(here).items()}
    assert recipe_id(there, ids_there) == recipe_id(here, _ids(here))


def test_parameters_still_count_with_content_ids():
    a, b = parse_recipe(SWAP), parse_recipe({**SWAP, "bottom": 4})
    assert recipe_id(a, _ids(a)) != recipe_id(b, _ids(b))


def test_soup_member_content_counts():
    r = parse_recipe(EXAMPLES["layer_swap_full"])
    ids = _ids(r)
    assert recipe_id(r, {**ids, "/ckpt/sw2": "sha256:other"}) != recipe_id(r, ids)


def test_no_mapping_is_the_path_hash():
    # The id of the recipe as written: pinned so that the no-mapping hash stays what it was.
    assert recipe_id(parse_recipe(SWAP)) == recipe_id(parse_recipe(SWAP), None) == "c13c170070a9"


def test_a_mapping_must_cover_every_reference():
    r = parse_recipe(SWAP)
    ids = _ids(r)
    del ids["/ckpt/base"]
    with pytest.raises(ValueError, match="/ckpt/base"):
        recipe_id(r, ids)


def test_dump_recipe_header_names_the_id_it_is_given():
    r = parse_recipe(SWAP)
    assert dump_recipe(r, "0123456789ab").startswith("# layerswap recipe 0123456789ab\n")
    assert dump_recipe(r).startswith("# layerswap recipe\n")  # no path-based id in any file
    assert "/ckpt/math" in dump_recipe(r, "0123456789ab")  # the YAML keeps the paths
