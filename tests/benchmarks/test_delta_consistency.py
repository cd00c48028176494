"""benchmarks/delta_consistency.py on hand-made checkpoints whose ΔW cosines are known exactly.

Run `.venv/bin/python -m pytest tests/benchmarks/test_delta_consistency.py -q`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import delta_consistency

LAYERS = 8
SHAPES = {"self_attn.q_proj": (6, 4), "self_attn.o_proj": (4, 6), "mlp.up_proj": (5, 4)}


def _state(seed: int | None = None, scale: float = 0.0, sign_by_layer=lambda layer: 1.0) -> dict:
    """A base (scale 0) or base + scale * sign(layer) * d, with d fixed per tensor; one 1-D
    norm per layer, which the analysis must skip."""
    g = torch.Generator().manual_seed(0)
    out = {"model.embed_tokens.weight": torch.randn(10, 4, generator=g)}
    for layer in range(LAYERS):
        out[f"model.layers.{layer}.input_layernorm.weight"] = torch.ones(4)
        for mod, shape in SHAPES.items():
            w = torch.randn(*shape, generator=g)
            d = torch.randn(*shape, generator=g)
            out[f"model.layers.{layer}.{mod}.weight"] = w + scale * sign_by_layer(layer) * d
    return out


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dc")
    made = {
        "base": _state(),
        "a": _state(scale=1e-3),
        "b": _state(scale=2e-3),  # same direction, twice as far
        # the opposite direction in the bottom quarter (layers 0-1) only
        "flip": _state(scale=1e-3, sign_by_layer=lambda layer: -1.0 if layer < 2 else 1.0),
    }
    paths = {}
    for name, state in made.items():
        paths[name] = root / name
        paths[name].mkdir()
        save_file(state, paths[name] / "model.safetensors")
    return paths


def test_cosines_and_mavs_per_region(ckpts):
    st = delta_consistency.pair_stats(ckpts["base"], ckpts["a"], ckpts["b"])
    # float32 checkpoints: w + 1e-3 * d rounds at ~1e-7 of w, i.e. ~1e-4 of ΔW itself
    for group in ("attention", "MLP"):
        for region, cos in st["cosine"][group].items():
            assert cos == pytest.approx(1.0, abs=1e-4), (group, region)
        assert all(b == pytest.approx(2 * a, rel=1e-3) for a, b in zip(st["mav_a"][group].values(), st["mav_b"][group].values(), strict=True))  # fmt: skip
    flip = delta_consistency.pair_stats(ckpts["base"], ckpts["a"], ckpts["flip"])["cosine"]
    assert flip["attention"]["bottom quarter"] == pytest.approx(-1.0, abs=1e-4)
    assert flip["MLP"]["middle half"] == pytest.approx(1.0, abs=1e-4)
    assert flip["MLP"]["top quarter"] == pytest.approx(1.0, abs=1e-4)


def test_bad_checkpoints_are_named(ckpts, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    state = _state(scale=1e-3)
    state["model.layers.3.mlp.up_proj.weight"] = torch.zeros(4, 5)  # transposed
    save_file(state, other / "model.safetensors")
    nan = tmp_path / "nan"
    nan.mkdir()
    state = _state(scale=1e-3)
    state["model.layers.5.self_attn.q_proj.weight"][2, 1] = float("nan")
    save_file(state, nan / "model.safetensors")
    cases = [
        (other, "tensor model.layers.3.mlp.up_proj.weight has shape (4, 5), the base (5, 4)"),
        (nan, "tensor model.layers.5.self_attn.q_proj.weight has non-finite values"),
        (tmp_path / "none", "not a checkpoint folder"),  # the merge engine's checkpoint reader
    ]
    for bad, why in cases:
        with pytest.raises(SystemExit) as e:
            delta_consistency.main(["--base", str(ckpts["base"]), "--pair", str(ckpts["a"]), str(bad)])  # fmt: skip
        assert e.value.code == 2
        out = capsys.readouterr()
        assert why in out.err and str(bad) in out.err
        assert out.out == ""  # no half table


def test_trains_the_experts_and_tables_every_pair_as_a_user_runs_it(tiny_world, run_bench):
    # the --world path end to end (world.sft at 2 steps): relative --world and --out
    run = run_bench("delta_consistency.py", "--world", "world", "--out", "dc", "--steps", "2", links={"world": tiny_world})  # fmt: skip
    assert sorted(p.name for p in (run.cwd / "dc").iterdir()) == ["language_seed0", "language_seed1", "math_seed0", "math_seed1"]  # fmt: skip
    rows = [line for line in run.stdout.splitlines() if line.startswith("| dc/")]
    assert len(rows) == 3 * 3, run.tail()  # three pairs, three readings each
    cells = [float(c) for line in rows for c in line.strip("| ").split(" | ")[3:]]
    assert len(cells) == 9 * 6 and all(abs(c) <= 1 for c in cells), run.tail()  # cosines, MAVs
    mavs = [float(c) for line in rows if "row MAV" in line for c in line.strip("| ").split(" | ")[3:]]  # fmt: skip
    assert all(m > 0 for m in mavs)  # two steps moved every region
