"""ΔW maps: a pair of tiny checkpoints where only known rows changed marks exactly those rows;
the suggested boundaries are right on a constructed case."""

from __future__ import annotations

import json

import numpy as np
import pytest
from analysis_synth import CHANGED_ROWS, LANG_LAYERS, LAYERS, MATH_LAYERS, tiny_base, write_changed

from layerswap.analysis.delta import (
    TYPES,
    DeltaMap,
    depth_regions,
    param_type,
    row_mav,
    suggest_boundaries,
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("delta")
    base = tiny_base(root)
    return {
        "base": base,
        "math": write_changed(base, root / "math", MATH_LAYERS),
        "lang": write_changed(base, root / "lang", LANG_LAYERS),
        "attn_only": write_changed(base, root / "attn", (1,), rows=(0,), types=("q", "v")),
    }


def test_param_type_names():
    assert param_type("model.layers.3.self_attn.q_proj.weight") == "q"
    assert param_type("model.layers.3.mlp.down_proj.weight") == "down"
    assert param_type("layers.0.attention.wk.weight") == "k"
    assert param_type("layers.0.feed_forward.w3.weight") == "up"
    assert param_type("model.layers.0.input_layernorm.weight") == "input_layernorm"


def test_marks_exactly_the_changed_rows(models):
    dm = row_mav(models["math"], models["base"])
    assert dm.num_layers == LAYERS and dm.types == list(TYPES)
    assert len(dm.mav) == LAYERS * len(TYPES)
    for (layer, t), rows in dm.mav.items():
        changed = set(np.flatnonzero(rows > 0))
        assert changed == (set(CHANGED_ROWS) if layer in MATH_LAYERS else set()), (layer, t)
    frac = dm.fractions(threshold=0.0)
    for (layer, t), rows in dm.mav.items():
        want = len(CHANGED_ROWS) / len(rows) if layer in MATH_LAYERS else 0.0
        assert frac[layer, dm.types.index(t)] == pytest.approx(want)
    # The default threshold is the 90th-percentile row MAV: under 10 % of rows changed here,
    # so it is 0 and the default marks exactly the changed rows.
    allrows = np.concatenate(list(dm.mav.values()))
    assert 0 < (allrows > 0).mean() < 0.1
    assert dm.threshold_auto() == 0.0
    np.testing.assert_array_equal(dm.fractions(), frac)
    # A threshold above every change marks nothing.
    assert np.nanmax(dm.fractions(threshold=10.0)) == 0.0


def test_only_the_changed_parameter_types(models):
    dm = row_mav(models["attn_only"], models["base"])
    frac = dm.fractions(threshold=0.0)
    nz = {(int(i), dm.types[j]) for i, j in zip(*np.nonzero(frac), strict=True)}
    assert nz == {(1, "q"), (1, "v")}
    assert set(np.flatnonzero(dm.mav[(1, "q")] > 0)) == {0}


def test_chunking_does_not_change_the_result(models):
    whole = row_mav(models["lang"], models["base"])
    chunked = row_mav(models["lang"], models["base"], chunk_elems=7)  # < one row: 1 row a step
    for key, rows in whole.mav.items():
        np.testing.assert_allclose(chunked.mav[key], rows, rtol=1e-6)


def test_row_mav_values(models):
    from safetensors.torch import load_file

    a = load_file(models["lang"] / "model.safetensors")
    b = load_file(models["base"] / "model.safetensors")
    name = "model.layers.5.mlp.up_proj.weight"
    want = (a[name].float() - b[name].float()).abs().mean(dim=1).numpy()
    got = row_mav(models["lang"], models["base"]).mav[(5, "up")]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_quantile_threshold_marks_the_top_rows():
    # One parameter with row MAVs 1..10: the 0.9 quantile is 9.1, so only row 10 passes; the
    # median 5.5 lets 6..10 pass.
    dm = DeltaMap("e", "b", 1, ["q"], {(0, "q"): np.arange(1.0, 11.0)})
    assert dm.threshold_auto() == pytest.approx(9.1)
    assert dm.fractions()[0, 0] == pytest.approx(0.1)
    assert dm.threshold_auto(0.5) == pytest.approx(5.5)
    assert dm.fractions(quantile=0.5)[0, 0] == pytest.approx(0.5)
    assert dm.fractions(threshold=0.0)[0, 0] == 1.0  # an absolute threshold wins
    np.testing.assert_allclose(dm.row_quantiles([0.1, 0.5]), [1.9, 5.5])


def test_depth_regions_by_quarter_and_group():
    types = ["q", "k", "v", "o", "gate", "up", "down"]
    frac = np.zeros((8, 7))  # 8 layers: quarters are layers 0-1, 2-5, 6-7
    frac[0:2, 0:4] = 0.4  # attention, bottom quarter
    frac[6:8, 4:7] = 0.8  # MLP, top quarter
    frac[3, 4] = 0.6  # one gate in the middle: 0.6 / (4 layers * 3 types)
    frac[:, 1] = np.nan  # a model without k: left out of the attention means
    reg = depth_regions(frac, types)
    assert reg["attention"] == {"bottom quarter": pytest.approx(0.4), "middle half": 0.0, "top quarter": 0.0}  # fmt: skip
    assert reg["MLP"] == {"bottom quarter": 0.0, "middle half": pytest.approx(0.05), "top quarter": pytest.approx(0.8)}  # fmt: skip
    # A group the model lacks entirely, and a model too shallow for a middle: NaN, not 0.
    only_attn = depth_regions(np.ones((2, 1)), ["q"])
    assert np.isnan(only_attn["MLP"]["top quarter"]) and np.isnan(only_attn["attention"]["middle half"])  # fmt: skip
    assert only_attn["attention"]["bottom quarter"] == 1.0
    # One layer is the bottom quarter only, not also the top.
    one = depth_regions(np.full((1, 1), 0.5), ["q"])["attention"]
    assert one["bottom quarter"] == 0.5 and np.isnan(one["top quarter"])


def test_suggested_boundaries_on_constructed_case(models):
    math = row_mav(models["math"], models["base"]).fractions()
    lang = row_mav(models["lang"], models["base"]).fractions()
    b = suggest_boundaries(lang, math)
    assert (b.bottom, b.top) == (2, 1)  # language changed layers 0, 1 and 5
    assert [d > 0 for d in b.dominance] == [i in LANG_LAYERS for i in range(LAYERS)]


def test_suggested_boundaries_rule():
    def frac(d):  # one type; language fraction d where positive, math fraction -d otherwise
        d = np.asarray(d, float)[:, None]
        return np.clip(d, 0, None), np.clip(-d, 0, None)

    lang, math = frac([0.9, 0.8, 0.7, -0.5, -0.6, -0.7, -0.4, 0.3])
    assert (lambda r: (r.bottom, r.top))(suggest_boundaries(lang, math)) == (3, 1)
    assert suggest_boundaries(lang, math).is_warm_start  # 4 of 8 layers to language
    # A small dip inside the bottom run does not cut it short: the sum decides.
    lang, math = frac([0.9, -0.1, 0.8, -0.5, -0.6, -0.7, -0.4, -0.3])
    assert (lambda r: (r.bottom, r.top))(suggest_boundaries(lang, math)) == (3, 0)
    # No language dominance anywhere: no language layers.
    lang, math = frac([-0.1] * 6)
    assert (lambda r: (r.bottom, r.top))(suggest_boundaries(lang, math)) == (0, 0)
    assert not suggest_boundaries(lang, math).is_warm_start  # no layers to language: no swap
    # Language everywhere: still keeps one math layer (b + u <= L - 1).
    lang, math = frac([0.2] * 6)
    r = suggest_boundaries(lang, math)
    assert r.bottom + r.top == 5
    assert not r.is_warm_start  # 5 of 6 layers to language: not a layer swap's split
    with pytest.raises(ValueError, match="shape"):
        suggest_boundaries(np.zeros((3, 2)), np.zeros((4, 2)))


def test_errors_name_the_folder(models, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    cfg = json.loads((models["base"] / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file

    state = load_file(models["base"] / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    state[name] = state[name][:-1].contiguous()
    save_file(state, other / "model.safetensors")
    with pytest.raises(ValueError, match=r"q_proj.*shape"):
        row_mav(other, models["base"])
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="LoRA"):
        row_mav(tmp_path / "lora", models["base"])


def test_a_non_finite_expert_is_refused_naming_tensor_and_row(models, tmp_path):
    # A NaN row would make the quantile threshold NaN and every map read "nothing changed".
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "diverged"
    bad.mkdir()
    (bad / "config.json").write_text((models["base"] / "config.json").read_text())
    state = load_file(models["base"] / "model.safetensors")
    name = "model.layers.3.mlp.down_proj.weight"
    state[name] = state[name].clone()
    state[name][2, 0] = float("nan")
    save_file(state, bad / "model.safetensors")
    with pytest.raises(ValueError, match=rf"{bad}: tensor '{name}' row 2 .*non-finite"):
        row_mav(bad, models["base"])


def test_an_expert_equal_to_its_base_almost_everywhere_is_flagged_as_rounded_away(models, tmp_path):  # fmt: skip
    """Few changed rows (the synthetic experts) is what bf16 rounding does to tiny updates."""
    import torch
    from safetensors.torch import load_file, save_file

    dm = row_mav(models["math"], models["base"])
    assert dm.elements > 0 and dm.unchanged_share > 0.95
    assert "rounded away" in dm.rounded_away() and "checkpoint_dtype: fp32" in dm.rounded_away()
    moved = tmp_path / "moved"
    moved.mkdir()
    for f in models["base"].iterdir():
        (moved / f.name).write_bytes(f.read_bytes())
    state = load_file(models["base"] / "model.safetensors")
    g = torch.Generator().manual_seed(0)
    save_file({k: v + 1e-2 * torch.randn(v.shape, generator=g).to(v.dtype) for k, v in state.items()}, moved / "model.safetensors")  # fmt: skip
    every = row_mav(moved, models["base"])
    assert every.unchanged_share < 0.01 and every.rounded_away() is None
