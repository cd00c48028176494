"""In-memory composition (`compose_recipe`) against the disk engine, and storage sharing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from layerswap.spaces.recipe import RecipeError, parse_recipe
from layerswap.trainables.merge.assembly import recipe_refs
from layerswap.trainables.merge.compose import compose_recipe, memory_mav_oracle
from layerswap.trainables.merge.engine import merge_to_disk

L = 12
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def load_dir(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(f))
    return out


def sources_for(fam, recipe) -> dict[str, dict[str, torch.Tensor]]:
    """{ref: state dict} for every checkpoint the recipe names, loaded fresh."""
    return {ref: load_dir(ref) for ref in recipe_refs(recipe)}


def swap(fam, **kw) -> dict:
    return {
        "method": "layer_swap",
        "task_expert": fam.ref("task"),
        "language_expert": fam.ref("language"),
        "base": fam.ref("base"),
        **kw,
    }


CASES = {
    "zones": lambda f: swap(f, bottom=3, top=2, bottom_transition=1, top_transition=2),
    "no transitions, non_layer language": lambda f: swap(f, bottom=4, top=1, non_layer="language"),
    "magnitude": lambda f: swap(
        f, bottom=3, top=2, bottom_transition=2, transition_weights="magnitude"
    ),
    "explicit weights": lambda f: swap(
        f, bottom=2, top=2, top_transition=1, transition_weights={"task": 1, "language": 4}
    ),
    "partition A + revert": lambda f: swap(
        f, partition="A", revert=[{"partition": "A", "side": "task"}, {"non_layer": True}]
    ),
    "partition C": lambda f: swap(f, partition="C"),
    "expert soups": lambda f: swap(
        f,
        task_expert={"soup": [f.ref("task"), f.ref("task2")], "weights": "magnitude"},
        language_expert={"soup": [f.ref("language"), f.ref("lang2")]},
        bottom=3,
        top=2,
        bottom_transition=1,
        transition_weights="magnitude",
    ),
    "soup magnitude": lambda f: {
        "method": "soup",
        "models": [f.ref("task"), f.ref("language"), f.ref("task2")],
        "weights": "magnitude",
        "base": f.ref("base"),
    },
    "soup explicit": lambda f: {
        "method": "soup",
        "models": [f.ref("task"), f.ref("language"), f.ref("lang2")],
        "weights": [1, 2, 3],
    },
    "ties": lambda f: {
        "method": "ties",
        "base": f.ref("base"),
        "models": [f.ref("task"), f.ref("language"), f.ref("task2")],
        "density": 0.25,
        "weights": [1.0, 0.5, 1.5],
    },
    "task arithmetic": lambda f: {
        "method": "task_arithmetic",
        "base": f.ref("base"),
        "models": [f.ref("task"), f.ref("language")],
        "scale": 0.6,
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_compose_equals_the_disk_merge(family, tmp_path, case):
    recipe = parse_recipe(CASES[case](family))
    merge_to_disk(recipe, tmp_path / "out")
    disk = load_dir(tmp_path / "out")
    mem = compose_recipe(recipe, sources_for(family, recipe), L)
    assert set(mem) == set(disk)
    for name, t in disk.items():
        assert mem[name].dtype == t.dtype and mem[name].shape == t.shape, name
        assert torch.equal(mem[name], t), name


@pytest.mark.parametrize("fixture", ["bf16_family", "tied_family"])
def test_compose_equals_disk_for_bf16_and_tied(fixture, request, tmp_path):
    fam = request.getfixturevalue(fixture)
    recipe = parse_recipe(swap(fam, bottom=3, top=2, bottom_transition=1, top_transition=1))
    merge_to_disk(recipe, tmp_path / "out")
    disk = load_dir(tmp_path / "out")
    mem = compose_recipe(recipe, sources_for(fam, recipe), L)
    assert set(mem) == set(disk)
    for name, t in disk.items():
        assert mem[name].dtype == fam.dtype
        assert torch.equal(mem[name], t), name


def test_tied_model_state_dicts_compose_as_their_files(tied_family, tmp_path):
    """`model.state_dict()` of a tied model names the embedding twice (`lm_head.weight` is it):
    composed with magnitude weights it equals the disk merge exactly, with the same names."""
    from transformers import AutoModelForCausalLM

    fam = tied_family
    kw = dict(bottom=3, top=2, bottom_transition=2, top_transition=1)
    recipe = parse_recipe(swap(fam, transition_weights="magnitude", **kw))
    merge_to_disk(recipe, tmp_path / "out")
    disk = load_dir(tmp_path / "out")
    models = {r: AutoModelForCausalLM.from_pretrained(r).state_dict() for r in recipe_refs(recipe)}
    assert "lm_head.weight" in models[fam.ref("base")] and "lm_head.weight" not in disk
    mem = compose_recipe(recipe, models, L)
    assert set(mem) == set(disk)
    assert all(torch.equal(mem[name], t) for name, t in disk.items())
    files = sources_for(fam, recipe)
    terms = ((fam.ref("task"), 1.0),)
    base = fam.ref("base")
    assert memory_mav_oracle(models, base)(terms) == memory_mav_oracle(files, base)(terms)


def test_taken_tensors_share_storage_averaged_do_not(family):
    recipe = parse_recipe(swap(family, bottom=3, top=2, bottom_transition=1, top_transition=1))
    src = sources_for(family, recipe)
    task, lang = src[family.ref("task")], src[family.ref("language")]
    mem = compose_recipe(recipe, src, L)
    row = "LLLXTTTTTXLL"  # docs/method.md with b=3, t_b=1, t_u=1, u=2 on 12 layers
    counts = {"L": 0, "T": 0, "X": 0}
    for name, t in mem.items():
        m = _LAYER.match(name)
        letter = row[int(m.group(1))] if m else "X"  # non-layer: averaged
        counts[letter] += 1
        if letter == "L":
            assert t.data_ptr() == lang[name].data_ptr(), name
            assert t is lang[name]
        elif letter == "T":
            assert t.data_ptr() == task[name].data_ptr(), name
        else:
            assert t.data_ptr() not in (task[name].data_ptr(), lang[name].data_ptr()), name
            assert t.untyped_storage().data_ptr() not in {
                task[name].untyped_storage().data_ptr(),
                lang[name].untyped_storage().data_ptr(),
            }
    assert counts == {"L": 5 * 9, "T": 5 * 9, "X": 2 * 9 + 3}


def test_reverted_tensors_share_storage_with_base(family):
    recipe = parse_recipe(
        swap(family, bottom=3, top=2, revert=[{"layers": [4]}, {"non_layer": True}])
    )
    src = sources_for(family, recipe)
    base = src[family.ref("base")]
    mem = compose_recipe(recipe, src, L)
    for name in (
        "model.layers.4.mlp.up_proj.weight",
        "model.embed_tokens.weight",
        "lm_head.weight",
    ):
        assert mem[name].data_ptr() == base[name].data_ptr()
    assert mem["model.layers.5.mlp.up_proj.weight"].data_ptr() == (
        src[family.ref("task")]["model.layers.5.mlp.up_proj.weight"].data_ptr()
    )


def test_memory_magnitude_oracle_is_the_mean_row_mav(family):
    base = family.state("base")
    t = family.state("task")
    rows = []
    for name, b in base.items():
        d = t[name].double() - b.double()
        rows.append(d.abs().mean().reshape(1) if d.dim() == 1 else d.abs().mean(dim=1))
    want = torch.cat(rows).mean().item()
    mav = memory_mav_oracle({"t": t, "b": base}, "b")
    assert mav((("t", 1.0),)) == pytest.approx(want, rel=1e-6)
    assert mav((("b", 1.0),)) == 0.0


def test_missing_source_is_named(family):
    recipe = parse_recipe(swap(family, bottom=3, top=2))
    src = sources_for(family, recipe)
    del src[family.ref("language")]
    with pytest.raises(RecipeError, match=re.escape(family.ref("language"))):
        compose_recipe(recipe, src, L)


def test_different_tensor_sets_are_named(family):
    recipe = parse_recipe(swap(family, bottom=3, top=2))
    src = sources_for(family, recipe)
    del src[family.ref("language")]["model.layers.2.mlp.up_proj.weight"]
    with pytest.raises(RecipeError, match=r"model\.layers\.2\.mlp\.up_proj\.weight"):
        compose_recipe(recipe, src, L)


def test_boundaries_deeper_than_the_model(family):
    recipe = parse_recipe(swap(family, bottom=7, top=6))
    with pytest.raises(RecipeError, match=r"(?s)bottom \(7\).*top \(6\).*12 layers"):
        compose_recipe(recipe, sources_for(family, recipe), L)


def test_compose_does_not_modify_its_sources(family):
    recipe = parse_recipe(CASES["expert soups"](family))
    src = sources_for(family, recipe)
    before = {ref: {n: t.clone() for n, t in sd.items()} for ref, sd in src.items()}
    compose_recipe(recipe, src, L)
    for ref, sd in src.items():
        for n, t in sd.items():
            assert torch.equal(t, before[ref][n])
