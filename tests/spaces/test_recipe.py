"""Merge recipes as data: validation, stable hash ids, YAML round trip, partition shorthand."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from layerswap.spaces.recipe import (
    ExpertSoup,
    LayerSwapRecipe,
    RecipeError,
    SideWeights,
    SoupRecipe,
    TaskArithmeticRecipe,
    TiesRecipe,
    dump_recipe,
    load_recipe,
    parse_recipe,
    recipe_dict,
    recipe_id,
)

SWAP = {
    "method": "layer_swap",
    "task_expert": "/ckpt/math",
    "language_expert": "/ckpt/swahili",
    "base": "/ckpt/base",
    "bottom": 3,
    "top": 2,
    "bottom_transition": 1,
    "top_transition": 1,
}

EXAMPLES = {
    "layer_swap": SWAP,
    "layer_swap_full": {
        **SWAP,
        # both components have their own spec: the layer-level zones repeat the MLP's
        "bottom": 2,
        "top": 1,
        "top_transition": 0,
        "attention": "language",
        "mlp": {"bottom": 2, "top": 1, "bottom_transition": 1},
        "transition_weights": {"task": 3.0, "language": 1.0},
        "non_layer": "task",
        "language_expert": {"soup": ["/ckpt/sw1", "/ckpt/sw2"], "weights": [1.0, 2.0]},
        "revert": [{"layers": [0, 11], "components": ["mlp"]}, {"non_layer": True}],
    },
    "soup": {"method": "soup", "models": ["/a", "/b", "/c"], "weights": "magnitude", "base": "/0"},
    "soup_explicit": {"method": "soup", "models": ["/a", "/b"], "weights": [1.0, 3.0]},
    "task_arithmetic": {
        "method": "task_arithmetic",
        "base": "/0",
        "models": ["/a", "/b"],
        "weights": [1.0, 0.5],
        "scale": 0.7,
    },
    "ties": {"method": "ties", "base": "/0", "models": ["/a", "/b", "/c"], "density": 0.3},
    "revert_partition": {
        **SWAP,
        "revert": [{"partition": "A", "side": "task", "components": ["attention"]}],
    },
}


def _recipe(**over):
    return parse_recipe({**SWAP, **over})


# --- parsing -------------------------------------------------------------------------------


def test_methods_parse_into_their_types():
    assert isinstance(parse_recipe(EXAMPLES["layer_swap"]), LayerSwapRecipe)
    assert isinstance(parse_recipe(EXAMPLES["soup"]), SoupRecipe)
    assert isinstance(parse_recipe(EXAMPLES["task_arithmetic"]), TaskArithmeticRecipe)
    assert isinstance(parse_recipe(EXAMPLES["ties"]), TiesRecipe)
    full = parse_recipe(EXAMPLES["layer_swap_full"])
    assert isinstance(full.language_expert, ExpertSoup)
    assert full.transition_weights == SideWeights(task=3.0, language=1.0)


def test_defaults():
    r = parse_recipe({k: v for k, v in SWAP.items() if "transition" not in k})
    assert (r.bottom_transition, r.top_transition) == (0, 0)
    assert r.non_layer == "average"
    assert r.transition_weights == SideWeights(task=1.0, language=1.0)
    assert r.attention is None and r.mlp is None and r.revert == []
    assert parse_recipe(EXAMPLES["ties"]).model_weights == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("where", "data", "key"),
    [
        ("top level", {**SWAP, "bottm": 3}, "bottm"),
        ("top level", {**SWAP, "layers": [1, 2]}, "layers"),
        ("mlp zones", {**SWAP, "mlp": {"bottom": 1, "top": 1, "middle": 2}}, "middle"),
        (
            "revert",
            {**SWAP, "revert": [{"layers": [1], "component": ["mlp"]}]},
            "component",
        ),
        ("soup", {"method": "soup", "models": ["/a", "/b"], "temperature": 1}, "temperature"),
        (
            "transition weights",
            {**SWAP, "transition_weights": {"task": 1, "lang": 1}},
            "lang",
        ),
    ],
)
def test_unknown_keys_are_rejected_by_name(where, data, key):
    with pytest.raises(RecipeError) as e:
        parse_recipe(data)
    assert isinstance(e.value, ValueError)
    assert key in str(e.value), where
    assert "Extra inputs are not permitted" in str(e.value)


@pytest.mark.parametrize("field", ["bottom", "top", "bottom_transition", "top_transition"])
def test_negative_boundaries_are_rejected(field):
    with pytest.raises(RecipeError, match=field):
        _recipe(**{field: -1})
    with pytest.raises(RecipeError, match=f"mlp.*{field}"):
        _recipe(mlp={"bottom": 1, "top": 1, field: -2})


def test_task_arithmetic_accepts_negative_weights():
    # negation (forgetting a task) is a legitimate task-arithmetic weight
    r = parse_recipe({"method": "task_arithmetic", "base": "/0", "models": ["/a"], "weights": [-1]})
    assert r.model_weights == [-1.0]


def test_negative_revert_layer_rejected():
    with pytest.raises(RecipeError, match=r"revert.*-1"):
        _recipe(revert=[{"layers": [2, -1]}])


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"method": "merge_everything", "models": ["/a"]}, "method"),
        ({"method": "layer_swap", "task_expert": "/a", "bottom": 1, "top": 1}, "language_expert"),
        ({**SWAP, "non_layer": "mean"}, "non_layer"),
        ({**SWAP, "transition_weights": {"task": 0, "language": 0}}, "both be zero"),
        ({**SWAP, "transition_weights": {"task": -1, "language": 1}}, "task"),
        ({"method": "soup", "models": ["/a"]}, "models"),
        ({"method": "soup", "models": ["/a", "/b"], "weights": [1.0]}, "1 weights given for 2"),
        ({"method": "soup", "models": ["/a", "/b"], "weights": [1, -1]}, ">= 0"),
        ({"method": "soup", "models": ["/a", "/b"], "weights": "magnitude"}, "base"),
        ({**SWAP, "base": None, "transition_weights": "magnitude"}, "base"),
        (
            {**SWAP, "base": None, "task_expert": {"soup": ["/a", "/b"], "weights": "magnitude"}},
            "base",
        ),
        ({"method": "ties", "models": ["/a"], "density": 0.5}, "base"),
        ({"method": "ties", "base": "/0", "models": ["/a"], "density": 0}, "density"),
        ({"method": "ties", "base": "/0", "models": ["/a"], "density": 1.5}, "density"),
        (
            {"method": "ties", "base": "/0", "models": ["/a", "/b"], "weights": [1.0, -0.5]},
            r"weights must be >= 0",
        ),
        ({"method": "task_arithmetic", "base": "/0", "models": ["/a"], "weights": [1, 2]}, "2"),
        ({**SWAP, "base": None, "revert": [{"non_layer": True}]}, "revert needs `base`"),
        ({**SWAP, "revert": [{}]}, "selects nothing"),
        ({**SWAP, "revert": [{"partition": "A"}]}, "needs side"),
        ({**SWAP, "revert": [{"side": "task"}]}, "needs a partition"),
        ({**SWAP, "revert": [{"partition": "A", "side": "task", "layers": [1]}]}, "not both"),
        ({**SWAP, "partition": "D"}, "unknown 'D'"),
        ({**SWAP, "partition": "A", "bottom": 5}, "partition A sets bottom"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_invalid_recipes_raise_a_clear_valueerror(data, match):
    with pytest.raises(ValueError, match=match):
        parse_recipe(data)


# --- partitions ------------------------------------------------------------------------------


def _no_zones(d):
    return {
        k: v
        for k, v in d.items()
        if k not in ("bottom", "top", "bottom_transition", "top_transition")
    }


@pytest.mark.parametrize(
    ("name", "written_out"),
    [
        # A: attention all language; MLP of the first 6 and last 2 layers language.
        ("A", {"attention": "language", "mlp": {"bottom": 6, "top": 2}, "bottom": 6, "top": 2}),
        # B: first 8 and last 4 layers language.
        ("B", {"bottom": 8, "top": 4}),
        # C: first 6 and last 2 layers language.
        ("C", {"bottom": 6, "top": 2}),
    ],
)
def test_partition_equals_its_written_out_form(name, written_out):
    short = parse_recipe({**_no_zones(SWAP), "partition": name})
    long = parse_recipe({**_no_zones(SWAP), **written_out})
    assert short == long
    assert recipe_id(short) == recipe_id(long)
    assert "partition" not in recipe_dict(short)


def test_partition_a_component_zones():
    r = parse_recipe({**_no_zones(SWAP), "partition": "A"})
    assert r.component_zones("attention") == "language"
    mlp = r.component_zones("mlp")
    assert (mlp.bottom, mlp.top, mlp.bottom_transition, mlp.top_transition) == (6, 2, 0, 0)


def test_partition_with_matching_explicit_field_is_accepted():
    r = parse_recipe({**_no_zones(SWAP), "partition": "C", "bottom": 6})
    assert (r.bottom, r.top) == (6, 2)


def test_partitions_differ_from_each_other():
    ids = {recipe_id(parse_recipe({**_no_zones(SWAP), "partition": p})) for p in "ABC"}
    assert len(ids) == 3


# --- recipe id -------------------------------------------------------------------------------


def test_recipe_id_is_12_hex_and_stable_for_equal_recipes():
    a, b = parse_recipe(SWAP), parse_recipe(dict(SWAP))
    rid = recipe_id(a)
    assert len(rid) == 12 and int(rid, 16) >= 0
    assert rid == recipe_id(b) == recipe_id(a)
    # explicit defaults are the same recipe
    c = parse_recipe(
        {**SWAP, "non_layer": "average", "transition_weights": {"task": 1, "language": 1}}
    )
    assert recipe_id(c) == rid
    # ints and floats of equal value in float fields are the same recipe
    d = parse_recipe({**SWAP, "transition_weights": {"task": 1.0, "language": 1}})
    assert recipe_id(d) == rid


def test_recipe_id_ignores_key_order():
    reordered = dict(reversed(list(EXAMPLES["layer_swap_full"].items())))
    nested = {**EXAMPLES["layer_swap_full"], "mlp": {"bottom_transition": 1, "top": 1, "bottom": 2}}
    base = recipe_id(parse_recipe(EXAMPLES["layer_swap_full"]))
    assert recipe_id(parse_recipe(reordered)) == base
    assert recipe_id(parse_recipe(nested)) == base


@pytest.mark.parametrize(
    "change",
    [
        {"task_expert": "/ckpt/math2"},
        {"language_expert": "/ckpt/yoruba"},
        {"base": "/ckpt/base2"},
        {"base": None},
        {"bottom": 4},
        {"top": 3},
        {"bottom_transition": 0},
        {"top_transition": 2},
        {"attention": "task"},
        {"mlp": {"bottom": 1, "top": 1}},
        {"transition_weights": {"task": 2.0, "language": 1.0}},
        {"transition_weights": "magnitude"},
        {"non_layer": "language"},
        {"non_layer": "task"},
        {"revert": [{"layers": [0]}]},
        {"revert": [{"non_layer": True}]},
        {"language_expert": {"soup": ["/ckpt/swahili"]}},
    ],
)
def test_recipe_id_changes_with_any_field(change):
    assert recipe_id(parse_recipe({**SWAP, **change})) != recipe_id(parse_recipe(SWAP))


@pytest.mark.parametrize(
    ("data", "change"),
    [
        (EXAMPLES["soup"], {"weights": "uniform"}),
        (EXAMPLES["soup"], {"models": ["/a", "/c", "/b"]}),
        (EXAMPLES["soup_explicit"], {"weights": [1.0, 2.0]}),
        (EXAMPLES["ties"], {"density": 0.31}),
        (EXAMPLES["ties"], {"scale": 0.9}),
        (EXAMPLES["ties"], {"weights": [1.0, 1.0, 2.0]}),
        (EXAMPLES["task_arithmetic"], {"scale": 0.71}),
        (EXAMPLES["task_arithmetic"], {"method": "ties"}),
        (
            EXAMPLES["layer_swap_full"],
            {"revert": [{"layers": [0, 11], "components": ["attention"]}]},
        ),
    ],
)
def test_recipe_id_changes_for_other_methods(data, change):
    assert recipe_id(parse_recipe({**data, **change})) != recipe_id(parse_recipe(data))


def test_recipe_id_is_the_same_in_another_process():
    code = (
        "import json,sys; from layerswap.spaces.recipe import parse_recipe, recipe_id;"
        "print(recipe_id(parse_recipe(json.loads(sys.argv[1]))))"
    )
    import json

    data = json.dumps(EXAMPLES["layer_swap_full"])
    ids = {
        subprocess.run(
            [sys.executable, "-c", code, data],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert ids == {recipe_id(parse_recipe(EXAMPLES["layer_swap_full"]))}


# --- YAML ------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(EXAMPLES))
def test_yaml_round_trip(key, tmp_path):
    r = parse_recipe(EXAMPLES[key])
    text = dump_recipe(r, "0123456789ab")
    assert text.startswith("# layerswap recipe 0123456789ab\n")
    path = tmp_path / "r.yaml"
    path.write_text(text)
    back = load_recipe(path)
    assert back == r
    assert recipe_id(back) == recipe_id(r)
    assert type(back) is type(r)


def test_load_recipe_resolves_relative_paths_that_exist(tmp_path):
    (tmp_path / "experts" / "math").mkdir(parents=True)
    path = tmp_path / "r.yaml"
    data = {**SWAP, "task_expert": "experts/math", "language_expert": "org/model-id"}
    path.write_text(yaml.safe_dump(data))
    r = load_recipe(path)
    assert r.task_expert == str((tmp_path / "experts" / "math").resolve())
    assert r.language_expert == "org/model-id"  # a hub id stays as written


def test_load_recipe_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(RecipeError, match=r"nope\.yaml"):
        load_recipe(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: [unclosed\n")
    with pytest.raises(RecipeError, match=r"bad.yaml.*not valid YAML"):
        load_recipe(bad)
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump({**SWAP, "botom": 2}))
    with pytest.raises(RecipeError, match=r"(?s)extra.yaml.*botom"):
        load_recipe(extra)


def test_recipes_are_frozen():
    r = parse_recipe(SWAP)
    with pytest.raises(ValueError):
        r.bottom = 7  # type: ignore[misc]
