"""The merged folder: sharding, dtypes, loadability, recipe and model card, streaming details."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from merge_expect import (
    assert_state,
    expected_swap,
    mean_row_mav,
    merge,
    swap_fields,
)

from layerswap.spaces.recipe import load_recipe, parse_recipe, recipe_id
from layerswap.trainables.merge.engine import RECIPE_FILE, merge_to_disk
from layerswap.trainables.model_ids import content_recipe_id
from layerswap.trainables.outputs import read_marker

# --- sharding, dtypes ------------------------------------------------------------------------


def _shards(out: Path) -> list[Path]:
    return sorted(out.glob("*.safetensors"))


def test_sharded_input_and_sharded_output(sharded_family, family, tmp_path):
    fam = sharded_family
    out = tmp_path / "out"
    fields = swap_fields(fam, bottom=3, top=2, bottom_transition=1)
    got = merge(fields, out, max_shard_bytes=40_000)
    row = "LLLXTTTTTTLL"
    assert_state(got, expected_swap(fam, row, row, "X"))
    shards = _shards(out)
    assert len(shards) > 3
    assert not (out / "model.safetensors").exists()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(fam.names)
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    total = sum(t.numel() * t.element_size() for t in got.values())
    assert index["metadata"]["total_size"] == total
    # no shard above the limit unless it holds a single tensor larger than the limit
    from safetensors import safe_open

    for p in shards:
        with safe_open(p, "pt") as f:
            keys = list(f.keys())
        if len(keys) > 1:
            assert sum(got[k].numel() * got[k].element_size() for k in keys) <= 40_000
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for name, t in got.items():
        assert torch.equal(loaded[name], t), name
    # same seed: the sharded family holds the same weights as the single-file one
    ref = merge(swap_fields(family, bottom=3, top=2, bottom_transition=1), tmp_path / "ref")
    assert_state(got, ref)


def test_sharded_input_single_file_output(sharded_family, tmp_path):
    out = tmp_path / "out"
    got = merge(swap_fields(sharded_family, bottom=3, top=2), out)
    assert [p.name for p in _shards(out)] == ["model.safetensors"]
    assert not (out / "model.safetensors.index.json").exists()
    row = "LLLTTTTTTTLL"
    assert_state(got, expected_swap(sharded_family, row, row, "X"))


def test_bf16_is_preserved_and_averaged_in_float32(bf16_family, tmp_path):
    fam = bf16_family
    got = merge(swap_fields(fam, bottom=3, top=2, top_transition=2), tmp_path / "out")
    assert {t.dtype for t in got.values()} == {torch.bfloat16}
    row = "LLLTTTTTXXLL"
    assert_state(got, expected_swap(fam, row, row, "X"))
    name = "model.layers.8.mlp.down_proj.weight"
    a, b = fam.state("task")[name], fam.state("language")[name]
    assert torch.equal(got[name], (a.float() * 0.5 + b.float() * 0.5).to(torch.bfloat16))
    # the averaged embeddings are new values, not one expert's
    assert not torch.equal(
        got["model.embed_tokens.weight"], fam.state("task")["model.embed_tokens.weight"]
    )


def test_bf16_explicit_weights(bf16_family, tmp_path):
    fam = bf16_family
    fields = swap_fields(
        fam, bottom=3, top=2, bottom_transition=1, transition_weights={"task": 3, "language": 1}
    )
    got = merge(fields, tmp_path / "out")
    name = "model.layers.3.self_attn.q_proj.weight"
    a, b = fam.state("task")[name], fam.state("language")[name]
    want = (a.float() * 0.75 + b.float() * 0.25).to(torch.bfloat16)
    assert got[name].dtype == torch.bfloat16
    # float32 accumulation then one rounding: at most one bf16 step away, almost always equal
    torch.testing.assert_close(got[name], want, rtol=2**-7, atol=0)
    assert (got[name] == want).float().mean() > 0.99
    # computing in bf16 itself rounds the products first and lands elsewhere more often
    bf16_only = a * 0.75 + b * 0.25
    assert (got[name] != bf16_only).sum() > (got[name] != want).sum()


# --- the output folder -----------------------------------------------------------------------


def test_copied_experts_give_the_same_merge_id(family, tmp_path):
    """The same recipe over the same experts stored elsewhere names one id in both outputs."""
    moved = {r: shutil.copytree(family.paths[r], tmp_path / "elsewhere" / r) for r in family.paths}
    fields = swap_fields(family, bottom=3, top=2)
    there = {**fields, **{k: str(moved[r]) for k, r in (("task_expert", "task"), ("language_expert", "language"), ("base", "base"))}}  # fmt: skip
    merge_to_disk(parse_recipe(fields), tmp_path / "a")
    merge_to_disk(parse_recipe(there), tmp_path / "b")
    heads = [(tmp_path / o / RECIPE_FILE).read_text().splitlines()[0] for o in "ab"]
    assert heads[0] == heads[1] == f"# layerswap recipe {content_recipe_id(parse_recipe(fields))}"
    assert read_marker(tmp_path / "a")["identity"] == read_marker(tmp_path / "b")["identity"]


def test_output_is_a_complete_loadable_model(family, tmp_path):
    out = tmp_path / "merged"
    recipe = parse_recipe(swap_fields(family, bottom=3, top=2, bottom_transition=1))
    assert merge_to_disk(recipe, out) == out
    names = {p.name for p in out.iterdir()}
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert f in names
        assert (out / f).read_bytes() == (family.paths["task"] / f).read_bytes()
    assert {RECIPE_FILE, "README.md", "model.safetensors"} <= names
    assert not list(tmp_path.glob(".merged.*"))

    again = load_recipe(out / RECIPE_FILE)
    assert again == recipe and recipe_id(again) == recipe_id(recipe)
    card = (out / "README.md").read_text()
    assert card.startswith("---\n")
    front = yaml.safe_load(card.split("---")[1])
    assert "layerswap" in front["tags"]
    # a local base is no Hub model id: named in the body, never as the Hub's base_model
    assert "base_model" not in front and f"- base: `{family.ref('base')}`" in card
    rid = content_recipe_id(recipe)  # one id in the card, the recipe file and the marker
    assert f"# layerswap merge `{rid}`" in card and recipe_id(recipe) not in card
    assert (out / RECIPE_FILE).read_text().startswith(f"# layerswap recipe {rid}\n")
    assert read_marker(out)["identity"] == rid
    assert "| 3 | transition | transition |" in card

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    sd = model.state_dict()
    want = expected_swap(family, "LLLXTTTTTTLL", "LLLXTTTTTTLL", "X")
    for name, t in want.items():
        assert torch.equal(sd[name], t), name
    ids = tok("the math expert", return_tensors="pt")
    gen = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert gen.shape == (1, ids["input_ids"].shape[1] + 4)
    assert isinstance(tok.decode(gen[0]), str)


def test_overwrite_replaces_only_a_merged_model(family, tmp_path, nothing_written):
    from layerswap.trainables.outputs import MARKER, OutputError, read_marker

    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    fields = swap_fields(family, bottom=3, top=2)
    with pytest.raises(OutputError, match="already exists"):
        merge(fields, out)
    # a folder layerswap did not write is never replaced, even with overwrite
    with pytest.raises(OutputError, match="not written by layerswap"):
        merge(fields, out, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert not list(tmp_path.glob(".out.*"))

    (out / "keep.txt").unlink()  # an empty folder holds nothing to lose
    got = merge(fields, out, overwrite=True)
    row = "LLLTTTTTTTLL"
    assert_state(got, expected_swap(family, row, row, "X"))
    assert read_marker(out)["kind"] == "merge" and (out / MARKER).is_file()
    assert not list(tmp_path.glob(".out.*"))
    # and once more over a previous merge
    got = merge(swap_fields(family, bottom=1, top=1), out, overwrite=True)
    assert_state(got, expected_swap(family, "LTTTTTTTTTTL", "LTTTTTTTTTTL", "X"))
    assert not list(tmp_path.glob(".out.*"))


def test_overwrite_never_touches_an_input(family, tmp_path):
    from layerswap.trainables.outputs import OutputError

    fields = swap_fields(family, bottom=1, top=1)
    task = Path(family.ref("task"))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in task.iterdir())
    for out, why in ((task, "is the input"), (task.parent, "contains the input"), (task / "sub", "is inside the input")):  # fmt: skip
        with pytest.raises(OutputError, match=why):
            merge(fields, out, overwrite=True)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in task.iterdir()) == before


# --- streaming details -----------------------------------------------------------------------


def test_disk_magnitude_oracle_is_the_mean_row_mav(family):
    from layerswap.trainables.merge.engine import disk_mav_oracle, open_checkpoints

    base = family.state("base")
    t, g = family.ref("task"), family.ref("language")
    ckpts = open_checkpoints([t, g, family.ref("base")])
    try:
        mav = disk_mav_oracle(ckpts, family.ref("base"))
        want_t = mean_row_mav(family.state("task"), base)
        # Gaussian noise of std 0.02: E|x| = 0.02 * sqrt(2 / pi)
        assert want_t == pytest.approx(0.02 * (2 / torch.pi) ** 0.5, rel=0.05)
        assert mav(((t, 1.0),)) == pytest.approx(want_t, rel=1e-6)
        assert mav(((g, 1.0),)) == pytest.approx(
            mean_row_mav(family.state("language"), base), rel=1e-6
        )
        half = {
            n: 0.5 * family.state("task")[n].double() + 0.5 * family.state("language")[n].double()
            for n in base
        }
        assert mav(((t, 0.5), (g, 0.5))) == pytest.approx(mean_row_mav(half, base), rel=1e-6)
    finally:
        for ck in ckpts.values():
            ck.close()


def test_small_chunks_give_the_same_merge(family, tmp_path, monkeypatch):
    """Row-chunked streaming (tiny chunks) writes exactly what whole-tensor processing does."""
    import layerswap.trainables.merge.engine as merge_mod

    fields = swap_fields(
        family,
        bottom=3,
        top=2,
        bottom_transition=1,
        top_transition=1,
        transition_weights="magnitude",
    )
    whole = merge(fields, tmp_path / "whole")
    monkeypatch.setattr(merge_mod, "CHUNK_ELEMS", 100)  # a few rows of 32 at a time
    chunked = merge(fields, tmp_path / "chunked")
    assert_state(chunked, whole)
