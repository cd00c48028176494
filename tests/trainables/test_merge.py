"""The merge engine on disk (`merge_to_disk`), checked tensor by tensor.

Expected tensors are built here from the checkpoints (read with the safetensors library) and
the zone table of DESIGN.md §1 written out by hand, one letter per layer:
L = language expert, T = task expert, X = transition (weighted average), B = base.
Magnitude weights, TIES and task arithmetic have small reference implementations below.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from spaces.recipe import RecipeError, load_recipe, parse_recipe, recipe_id
from trainables.merge import RECIPE_FILE, merge_to_disk, read_recipe_of
from trainables.ops import delta_merge

L = 12
_ATTN = re.compile(r"^model\.layers\.(\d+)\.(self_attn\.|input_layernorm\.)")
_MLP = re.compile(r"^model\.layers\.(\d+)\.(mlp\.|post_attention_layernorm\.)")
NON_LAYER = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")


def slot(name: str) -> tuple[int | None, str | None]:
    """(layer, 'attention'|'mlp') by hand: norms travel with the block they feed."""
    for comp, rx in (("attention", _ATTN), ("mlp", _MLP)):
        m = rx.match(name)
        if m:
            return int(m.group(1)), comp
    assert "layers." not in name, name
    return None, None


def load_dir(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder, read with the safetensors library."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        part = load_file(f)
        assert not set(part) & set(out)
        out.update(part)
    return out


def merge(fields: dict, out: Path, **kw) -> dict[str, torch.Tensor]:
    merge_to_disk(parse_recipe(fields), out, **kw)
    return load_dir(out)


def swap_fields(fam, **kw) -> dict:
    return {
        "method": "layer_swap",
        "task_expert": fam.ref("task"),
        "language_expert": fam.ref("language"),
        "base": fam.ref("base"),
        **kw,
    }


def average(a: torch.Tensor, b: torch.Tensor, wa: float) -> torch.Tensor:
    """wa * a + (1 - wa) * b in float32, cast back to the inputs' dtype."""
    return (a.float() * wa + b.float() * (1 - wa)).to(a.dtype)


def expected_swap(
    fam, attention: str, mlp: str, non_layer: str, w_task: float = 0.5, states=None
) -> dict[str, torch.Tensor]:
    """Expected merged tensors from per-layer letters (one per layer) and a non-layer letter."""
    assert len(attention) == len(mlp) == L
    s = {"T": fam.state("task"), "L": fam.state("language"), "B": fam.state("base")}
    s.update(states or {})
    out = {}
    for name in fam.names:
        layer, comp = slot(name)
        letter = non_layer if layer is None else {"attention": attention, "mlp": mlp}[comp][layer]
        if letter == "X":
            out[name] = average(s["T"][name], s["L"][name], w_task)
        else:
            out[name] = s[letter][name]
    return out


def assert_state(got: dict, expected: dict, exact: bool = True) -> None:
    assert set(got) == set(expected)
    for name, want in expected.items():
        g = got[name]
        assert g.dtype == want.dtype and g.shape == want.shape, name
        if exact:
            assert torch.equal(g, want), f"{name} differs"
        else:
            torch.testing.assert_close(g, want, rtol=1e-6, atol=1e-7, msg=name)


def mean_row_mav(state: dict, base: dict) -> float:
    """Mean over all rows of all 1-D/2-D tensors of mean |delta| (a 1-D tensor is one row)."""
    rows = []
    for name, b in base.items():
        d = state[name].double() - b.double()
        if d.dim() == 1:
            rows.append(d.abs().mean().reshape(1))
        elif d.dim() == 2:
            rows.append(d.abs().mean(dim=1))
    return torch.cat(rows).mean().item()


def inverse_weights(mavs: list[float]) -> list[float]:
    inv = [1 / m for m in mavs]
    return [i / sum(inv) for i in inv]


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
    """TIES (Yadav et al. 2023) on one tensor, written independently of trainables.ops."""
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
    assert read_recipe_of(out) == (out / RECIPE_FILE).read_text()
    card = (out / "README.md").read_text()
    assert card.startswith("---\n")
    front = yaml.safe_load(card.split("---")[1])
    assert "layerswap" in front["tags"] and front["base_model"] == family.ref("base")
    assert recipe_id(recipe) in card
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


def test_read_recipe_of_a_plain_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=RECIPE_FILE):
        read_recipe_of(tmp_path)


def test_overwrite(family, tmp_path, nothing_written):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    fields = swap_fields(family, bottom=3, top=2)
    with pytest.raises(FileExistsError, match="already exists"):
        merge(fields, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert not list(tmp_path.glob(".out.*"))

    got = merge(fields, out, overwrite=True)
    assert not (out / "keep.txt").exists()
    row = "LLLTTTTTTTLL"
    assert_state(got, expected_swap(family, row, row, "X"))
    assert not list(tmp_path.glob(".out.*"))
    # and once more over a previous merge
    got = merge(swap_fields(family, bottom=1, top=1), out, overwrite=True)
    assert_state(got, expected_swap(family, "LTTTTTTTTTTL", "LTTTTTTTTTTL", "X"))
    assert not list(tmp_path.glob(".out.*"))


# --- errors: clear messages, nothing written -------------------------------------------------


def _variant(family, tmp_path, role="language", drop=(), add=None, change=None, config=None):
    from safetensors.torch import save_file

    state = dict(family.state(role))
    for name in drop:
        del state[name]
    state.update(add or {})
    for name, fn in (change or {}).items():
        state[name] = fn(state[name].clone())
    dst = tmp_path / f"bad-{role}"
    shutil.copytree(family.paths[role], dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    save_file({k: v.contiguous() for k, v in state.items()}, dst / "model.safetensors")
    return dst


def _swap_with_language(family, lang: Path, **kw) -> dict:
    return swap_fields(family, language_expert=str(lang), bottom=3, top=2, **kw)


def _expect_refusal(fields, out, nothing_written, exc, *needles):
    """The merge raises `exc` (a ValueError) whose message holds every needle; nothing written.

    Needles that are not paths are looked for in the message with the test's temporary
    folder blanked out (its name is the test's name and would match words like `header`).
    """
    with pytest.raises(exc) as e:
        merge(fields, out)
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    tmp = str(out.parent)
    bare = msg.replace(tmp, "<tmp>")
    for needle in needles:
        assert needle in (msg if needle.startswith(tmp) else bare), (needle, msg)
    nothing_written(out)
    return e.value


def test_different_architecture(family, tmp_path, nothing_written):
    name_re = re.compile(r"\.mlp\.(gate|up)_proj\.weight$")
    change = {}
    for n in family.names:
        if name_re.search(n):
            change[n] = lambda t: t[:48]
        elif n.endswith("mlp.down_proj.weight"):
            change[n] = lambda t: t[:, :48]
    lang = _variant(family, tmp_path, change=change, config={"intermediate_size": 48})
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        "intermediate_size",
        "48",
        str(lang),
    )


def test_different_shape(family, tmp_path, nothing_written):
    lang = _variant(family, tmp_path, change={"model.norm.weight": lambda t: t[:31]})
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        "model.norm.weight",
        "[31]",
        "[32]",
    )


def test_different_dtype(family, bf16_family, tmp_path, nothing_written):
    fields = swap_fields(family, language_expert=bf16_family.ref("language"), bottom=3, top=2)
    _expect_refusal(fields, tmp_path / "out", nothing_written, ValueError, "BF16", "F32")


def test_missing_tensor(family, tmp_path, nothing_written):
    lang = _variant(family, tmp_path, drop=["model.layers.5.mlp.up_proj.weight"])
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        "missing 1 tensor",
        "model.layers.5.mlp.up_proj.weight",
        str(lang),
    )


def test_extra_tensor(family, tmp_path, nothing_written):
    lang = _variant(family, tmp_path, add={"model.layers.5.mlp.extra.bias": torch.zeros(4)})
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        "extra",
        "model.layers.5.mlp.extra.bias",
    )


def _poison(value):
    def fn(t):
        t.view(-1)[7] = value
        return t

    return fn


@pytest.mark.parametrize(
    ("tensor", "value", "kw"),
    [
        # a tensor taken whole from the language expert
        ("model.layers.0.self_attn.q_proj.weight", float("nan"), {}),
        # the last tensor written: the refusal comes after other tensors were written
        ("model.layers.11.post_attention_layernorm.weight", float("inf"), {}),
        # an averaged tensor
        ("model.embed_tokens.weight", float("-inf"), {}),
        # found while measuring magnitudes, before anything is planned
        ("model.layers.6.mlp.down_proj.weight", float("nan"), {"transition_weights": "magnitude"}),
    ],
)
def test_nan_or_inf_in_an_input(family, tmp_path, nothing_written, tensor, value, kw):
    lang = _variant(family, tmp_path, change={tensor: _poison(value)})
    _expect_refusal(
        _swap_with_language(family, lang, **kw),
        tmp_path / "out",
        nothing_written,
        ValueError,
        tensor,
        "NaN or Inf",
        str(lang),
    )


def _copy(family, tmp_path, role="language") -> Path:
    dst = tmp_path / f"copy-{role}"
    shutil.copytree(family.paths[role], dst)
    return dst


def test_truncated_safetensors(family, tmp_path, nothing_written):
    lang = _copy(family, tmp_path)
    f = lang / "model.safetensors"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size - 100)
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        str(f),
        "model.norm.weight",
        "the file is truncated",
    )


@pytest.mark.parametrize("how", ["garbage json", "huge length", "not an object"])
def test_corrupt_header(family, tmp_path, nothing_written, how):
    lang = _copy(family, tmp_path)
    f = lang / "model.safetensors"
    raw = bytearray(f.read_bytes())
    if how == "garbage json":
        raw[8:20] = b"\xff\xfe{{{{garbage"[:12]
    elif how == "huge length":
        raw[0:8] = (2**40).to_bytes(8, "little")
    else:
        n = int.from_bytes(raw[:8], "little")
        raw[8 : 8 + n] = b"[" + b" " * (n - 2) + b"]"
    f.write_bytes(bytes(raw))
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        str(f),
        "safetensors header",
    )


class _Booby:
    """Unpickling this creates a folder: proof that a pickle was (or was not) loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_pickle_only_checkpoint_is_refused_unloaded(family, tmp_path, nothing_written, monkeypatch):
    lang = tmp_path / "pickled"
    lang.mkdir()
    shutil.copyfile(family.paths["language"] / "config.json", lang / "config.json")
    marker = tmp_path / "UNPICKLED"
    (lang / "pytorch_model.bin").write_bytes(pickle.dumps(_Booby(marker)))

    def boom(*a, **k):
        raise AssertionError("a pickle was loaded")

    monkeypatch.setattr(torch, "load", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        str(lang),
        "pytorch_model.bin",
        "pickle",
    )
    assert not marker.exists()


def test_missing_checkpoint_folder(family, tmp_path, nothing_written):
    _expect_refusal(
        _swap_with_language(family, tmp_path / "nowhere"),
        tmp_path / "out",
        nothing_written,
        ValueError,
        str(tmp_path / "nowhere"),
        "not found",
    )


def test_hub_id_offline(family, tmp_path, nothing_written, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fields = swap_fields(family, language_expert="no-such-org/no-such-model", bottom=3, top=2)
    _expect_refusal(
        fields, tmp_path / "out", nothing_written, ValueError, "no-such-org/no-such-model"
    )


def test_boundaries_deeper_than_the_model(family, tmp_path, nothing_written):
    fields = swap_fields(family, bottom=6, top=4, bottom_transition=2, top_transition=1)
    err = _expect_refusal(
        fields,
        tmp_path / "out",
        nothing_written,
        RecipeError,
        "bottom (6)",
        "bottom_transition (2)",
        "top_transition (1)",
        "top (4)",
        "13",
        "12 layers",
    )
    assert isinstance(err, ValueError)


def test_revert_layer_outside_the_model(family, tmp_path, nothing_written):
    fields = swap_fields(family, bottom=3, top=2, revert=[{"layers": [12]}])
    _expect_refusal(fields, tmp_path / "out", nothing_written, RecipeError, "[12]", "12 layers")


def test_unsupported_model_type(family, tmp_path, nothing_written):
    task = _variant(family, tmp_path, role="task", config={"model_type": "gpt2"})
    fields = swap_fields(family, task_expert=str(task), bottom=3, top=2)
    _expect_refusal(fields, tmp_path / "out", nothing_written, ValueError, "gpt2", "config.json")


# --- streaming details -----------------------------------------------------------------------


def test_disk_magnitude_oracle_is_the_mean_row_mav(family):
    from trainables.merge import disk_mav_oracle, open_checkpoints

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
    import trainables.merge as merge_mod

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
