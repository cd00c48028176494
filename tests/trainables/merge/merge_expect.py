"""Expectations for the merge-engine tests, computed independently of the engine.

The zone table of docs/method.md is written out by hand, one letter per layer:
L = language expert, T = task expert, X = transition (weighted average), B = base.
Checkpoints are read back with the safetensors library, not the engine's reader.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from layerswap.spaces.recipe import parse_recipe
from layerswap.trainables.merge.engine import merge_to_disk

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
