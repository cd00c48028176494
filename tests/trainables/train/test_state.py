"""trainables/train/state.py: AdamW's state written at a checkpoint and read back on resume.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_state.py
"""

from __future__ import annotations

import pytest
import torch

from layerswap.trainables.train.state import load_optimizer, optimizer_tensors


def _stepped(fused: bool = False) -> tuple[torch.nn.Parameter, torch.optim.AdamW]:
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4, 4, generator=g))
    opt = torch.optim.AdamW([p], lr=1e-2, fused=fused)
    for _ in range(3):
        p.grad = torch.randn(4, 4, generator=g)
        opt.step()
    return p, opt


def test_resumed_moments_continue_exactly(tmp_path):
    """Restored into a fresh optimizer, the next step equals the uninterrupted one's."""
    from safetensors.torch import save_file

    p, opt = _stepped()
    f = tmp_path / "optimizer__all.safetensors"
    save_file(optimizer_tensors(opt, {id(p): "w"}), str(f))
    q = torch.nn.Parameter(p.detach().clone())
    fresh = torch.optim.AdamW([q], lr=1e-2)
    load_optimizer(fresh, [("w", q)], f)
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(fresh.state[q][key], opt.state[p][key]), key
    grad = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    p.grad, q.grad = grad.clone(), grad.clone()
    opt.step()
    fresh.step()
    assert torch.equal(p, q)


@pytest.mark.parametrize("fused", [True, False])
def test_step_lands_where_the_optimizer_steps_it(tmp_path, fused):
    """A fused AdamW (what run_setup._adamw builds on CUDA) steps with its `step` on the
    parameters' device: a CPU `step` beside CUDA moments fails its first fused step after a
    resume (pytorch#124133). `meta` stands in for the GPU (no CUDA here); a plain AdamW keeps
    `step` on the CPU, as torch's own load_state_dict does."""
    from safetensors.torch import save_file

    p, opt = _stepped()
    f = tmp_path / "optimizer__all.safetensors"
    save_file(optimizer_tensors(opt, {id(p): "w"}), str(f))
    q = torch.nn.Parameter(torch.empty(4, 4, device="meta"))
    fresh = torch.optim.AdamW([q], lr=1e-2, fused=fused)
    load_optimizer(fresh, [("w", q)], f)
    st = fresh.state[q]
    assert st["exp_avg"].device == st["exp_avg_sq"].device == q.device
    assert st["step"].device == (q.device if fused else torch.device("cpu"))
    assert st["step"].dtype == torch.float32


def test_state_for_an_unknown_parameter_is_refused(tmp_path):
    from safetensors.torch import save_file

    p, opt = _stepped()
    f = tmp_path / "optimizer__all.safetensors"
    save_file(optimizer_tensors(opt, {id(p): "gone"}), str(f))
    q = torch.nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"optimizer state for unknown parameter 'gone'"):
        load_optimizer(torch.optim.AdamW([q]), [("w", q)], f)
