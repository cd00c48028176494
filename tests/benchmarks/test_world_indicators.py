"""benchmarks/world_indicators.py on the tiny world: merges scored from the registry's experts.

Run `.venv/bin/python -m pytest tests/benchmarks/test_world_indicators.py -q`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import world_indicators

from layerswap.experts.registry import read_registry, write_registry

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sweep(tiny_world, tmp_path_factory):
    """Three math and three xa language "experts" (the base shifted), one xb language expert,
    and their registry as search.registry writes it."""
    from layerswap.experts.registry import expert_row, write_registry
    from layerswap.world.sft import load_base

    out = tmp_path_factory.mktemp("sweep")
    rows = []
    for kind, lang, shifts in (("math", "en", (0.0, 0.01, 0.03)), ("language", "xa", (0.0, 0.02, 0.05)), ("language", "xb", (0.1,))):  # fmt: skip
        for i, shift in enumerate(shifts):
            model, _ = load_base(tiny_world)
            for p in model.parameters():
                p.data += shift
            name = f"{kind}{i}" if lang != "xb" else "xb0"
            model.save_pretrained(out / name)
            exp = {"name": name, "kind": kind, "language": lang, "mode": {"type": "full"}, "base": str(tiny_world / "base")}  # fmt: skip
            manifest = {"step": 10 * (i + 1), "samples": 160, "seed": 0, "hparams": {}}
            cols = {"ind__a": float(i), "n_items__a": 20, "ind__b": float(-i), "n_items__b": 20}
            rows.append(expert_row(exp, out / name, manifest, name, cols))
    reg = out / "registry.parquet"
    write_registry(reg, rows)
    return reg, out


def test_every_expert_is_merged_with_the_other_kinds_partner_and_scored(tiny_world, sweep, tmp_path, monkeypatch):  # fmt: skip
    import torch
    from safetensors.torch import load_file

    from layerswap.spaces.recipe import parse_recipe
    from layerswap.spaces.zones import paper_default
    from layerswap.trainables.merge.compose import compose_recipe
    from layerswap.world.sft import load_base

    reg, experts = sweep
    scored = []  # what each scoring call saw, and a distinct score per call

    def fake_correct(model, tok, rows, max_new_tokens=24, batch_size=32):
        scored.append({k: v.clone() for k, v in model.state_dict().items()})
        return [True] * len(scored) + [False] * (10 - len(scored))

    monkeypatch.setattr("layerswap.world.sft.mgsm_correct", fake_correct)
    out = tmp_path / "ind.json"
    partners = [experts / "math2", experts / "language2"]
    world_indicators.main(["--world", str(tiny_world), "--registry", str(reg), "--math", str(partners[0]), "--lang", str(partners[1]), "--json", str(out)])  # fmt: skip
    got = json.loads(out.read_text())
    names = [f"math{i}" for i in range(3)] + [f"language{i}" for i in range(3)]
    assert [Path(r["path"]).name for r in got["experts"]] == names  # xb's expert left out
    assert [r["merge_score"] for r in got["experts"]] == [pytest.approx(i / 10) for i in range(1, 7)]  # fmt: skip
    # each scored model is the paper default of that expert and the other kind's partner
    model, _ = load_base(tiny_world)
    depth = model.config.num_hidden_layers
    pdf = paper_default(depth)
    rec = parse_recipe({"method": "layer_swap", "task_expert": "math", "language_expert": "language", "bottom": pdf.bottom, "top": pdf.top})  # fmt: skip
    base = {k: v.clone() for k, v in model.state_dict().items()}
    for name, seen in zip(names, scored, strict=True):
        kind = "math" if name.startswith("math") else "language"
        states = {"base": base, "math": load_file(partners[0] / "model.safetensors"), "language": load_file(partners[1] / "model.safetensors")}  # fmt: skip
        states[kind] = load_file(experts / name / "model.safetensors")
        want = compose_recipe(rec, states, depth)
        assert all(torch.equal(seen[k], want[k]) for k in want), name


def test_correlations_are_each_kinds_spearman_of_its_indicators():
    rng = np.random.default_rng(0)
    rows = [{"kind": k, "merge_score": float(rng.random()), "ind__a": float(rng.random()), "ind__b": float(i)} for k in ("math", "language") for i in range(6)]  # fmt: skip
    got = world_indicators.correlations(rows, resamples=200)
    assert [(c["kind"], c["indicator"]) for c in got] == [("math", "a"), ("math", "b"), ("language", "a"), ("language", "b")]  # fmt: skip
    for c in got:
        mine = [r for r in rows if r["kind"] == c["kind"]]
        rho = stats.spearmanr([r[f"ind__{c['indicator']}"] for r in mine], [r["merge_score"] for r in mine]).statistic  # fmt: skip
        assert c["n"] == 6 and c["spearman"][0] == pytest.approx(rho)
        assert c["spearman"][1] <= c["spearman"][0] <= c["spearman"][2]


def test_a_file_that_is_not_a_registry_or_a_missing_folder_is_named(tmp_path, capsys):
    bad = tmp_path / "rows.parquet"
    pd.DataFrame([{"x": 1}]).to_parquet(bad)
    with pytest.raises(ValueError, match=r"rows\.parquet: expert registry is missing column"):
        world_indicators.registry_experts([bad])
    with pytest.raises(ValueError, match="no expert registry"):
        world_indicators.registry_experts([tmp_path / "missing.parquet"])
    with pytest.raises(SystemExit):
        world_indicators.parse_args(["--world", str(tmp_path), "--registry", str(bad), "--math", str(tmp_path / "nope"), "--lang", str(tmp_path)])  # fmt: skip
    assert "--math" in capsys.readouterr().err


def test_runs_as_a_user_runs_it_with_relative_paths(tiny_world, sweep, run_bench):
    _, experts = sweep
    run = run_bench(
        "world_indicators.py", "--world", "world", "--registry", "sweep/registry.parquet",
        "--math", "sweep/math2", "--lang", "sweep/language2", "--resamples", "50", "--json", "ind.json",
        links={"world": tiny_world, "sweep": experts},
    )  # fmt: skip
    got = json.loads((run.cwd / "ind.json").read_text())
    assert len(got["experts"]) == 6 and all(0 <= r["merge_score"] <= 1 for r in got["experts"])
    assert [(c["kind"], c["indicator"], c["n"]) for c in got["correlations"]] == [(k, i, 3) for k in ("math", "language") for i in ("a", "b")]  # fmt: skip


def test_a_registry_with_no_expert_to_merge_exits_2_naming_it(tiny_world, sweep, tmp_path, run_bench):  # fmt: skip
    reg, experts = sweep
    only_xb = tmp_path / "xb.parquet"
    write_registry(only_xb, [r for r in read_registry(reg).to_pylist() if r["language"] == "xb"])
    run = run_bench(
        "world_indicators.py", "--world", "world", "--registry", "xb.parquet", "--math", "sweep/math2",
        "--lang", "sweep/language2", expect=2, links={"world": tiny_world, "sweep": experts, "xb.parquet": only_xb},
    )  # fmt: skip
    assert "xb.parquet: no math or xa language expert" in run.stderr
