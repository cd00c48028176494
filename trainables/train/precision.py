"""Training precision: the experiment's `precision` policy resolved against the base's dtype.

`resolve_precision(exp)` reads the base's config (no weights) and returns a Policy; the loop keeps the
trainable weights (and so AdamW's moments) in `Policy.master`, runs forward passes under
`Policy.autocast(device)`, and writes HF weights in `Policy.save`. Why: pure bf16 AdamW rounds
away updates smaller than half a bf16 step of the weight (docs/guides/gpus.md: at LR 1e-7, 0.09 % of
a Llama's weights moved), and the papers train at 2e-8 to 2e-7.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from layerswap.spaces.train_experiment import TrainExperiment

# Below this share of trainable weights that one step of the peak LR can still move, bf16-pure
# warns: those weights stay at the base, to bf16 precision, however long the run.
PURE_FROZEN_WARN = 0.10


@dataclass(frozen=True)
class Policy:
    """What a run computes, steps and saves in.

    name: bf16-mixed | fp32 | bf16-pure (auto resolved).
    master: dtype of trainable weights and AdamW moments.
    frozen: dtype of frozen weights (mixed keeps the base's: they never step).
    compute: autocast dtype, or None to compute in the weights' own dtype.
    save: dtype of the HF weights a checkpoint holds.
    base: the base checkpoint's dtype.
    """

    name: str
    master: torch.dtype
    frozen: torch.dtype
    compute: torch.dtype | None
    save: torch.dtype
    base: torch.dtype

    def autocast(self, device: torch.device):
        """The forward pass's autocast context (a no-op without a compute dtype)."""
        if self.compute is None:
            return nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.compute)

    @property
    def keeps_master(self) -> bool:
        """Whether saved weights are coarser than the master weights (resume needs both)."""
        return self.save != self.master

    def saved(self, lora: bool) -> torch.dtype:
        """The dtype a checkpoint's weights are written in: `save` for HF weights; a LoRA
        adapter's masters' (PEFT writes the adapter as it trains, whatever `save` says)."""
        return self.master if lora else self.save

    def describe(self, lora: bool = False) -> dict:
        """The policy as the checkpoint manifest records it (`lora`: the weights are an adapter)."""
        return {
            "policy": self.name,
            "master_dtype": dtype_name(self.master),
            "frozen_dtype": dtype_name(self.frozen),
            "compute_dtype": dtype_name(self.compute or self.master),
            "checkpoint_dtype": dtype_name(self.saved(lora)),
            "base_dtype": dtype_name(self.base),
        }


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as HF configs and manifests write it ("bfloat16")."""
    return str(dtype).removeprefix("torch.")


def config_dtype(config) -> torch.dtype:
    """The dtype an HF config declares for its weights (fp32 when it declares none)."""
    dt = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    return getattr(torch, dt) if isinstance(dt, str) else dt


def base_dtype(base: str, trust_remote_code: bool = False) -> torch.dtype:
    """The dtype the base checkpoint's config declares (fp32 when it declares none)."""
    from transformers import AutoConfig

    return config_dtype(AutoConfig.from_pretrained(base, trust_remote_code=trust_remote_code))


def resolve_precision(exp: TrainExperiment, base: torch.dtype | None = None) -> Policy:
    """The experiment's precision policy for a base of dtype `base` (read from its config if None).

    Args:
        exp: the experiment (`exp.precision`).
        base: the base checkpoint's dtype.
    Returns:
        Policy.
    """
    base = base if base is not None else base_dtype(exp.base, exp.trust_remote_code)
    name = exp.precision.policy
    if name == "auto":
        name = "bf16-mixed" if base in (torch.bfloat16, torch.float16) else "fp32"
    if name == "bf16-mixed":
        master, frozen, compute = torch.float32, base, torch.bfloat16
    elif name == "fp32":
        master, frozen, compute = torch.float32, torch.float32, None
    else:  # bf16-pure
        master, frozen, compute = torch.bfloat16, torch.bfloat16, None
    save = torch.float32 if exp.precision.checkpoint_dtype == "fp32" else base
    return Policy(name, master, frozen, compute, save, base)


def apply_precision(model: nn.Module, policy: Policy) -> None:
    """Cast `model`'s parameters in place: trainable ones to `master`, frozen ones to `frozen`.

    Call after the mode has set requires_grad and before the optimizer (and any wrapper)
    sees the parameters. Buffers stay as loaded: HF keeps the rotary tables (inv_freq) in fp32
    even in a bf16 model, and in bf16 positions past a few hundred would rotate wrongly.
    """
    for p in model.parameters():
        want = policy.master if p.requires_grad else policy.frozen
        if p.dtype != want and p.is_floating_point():
            p.data = p.data.to(want)


# Elements per slice in unmovable_share: its temporaries cost ~20 bytes an element, so a whole
# 8B model's embedding (525M elements) at once took ~10 GB beside the model; a slice, ~320 MB.
_SHARE_CHUNK = 1 << 24


def unmovable_share(params: list[torch.Tensor], lr: float) -> float:
    """Share of the weights in `params` (bf16) that a step of size `lr` cannot change.

    AdamW moves a weight by at most about `lr` per step; a bf16 weight w rounds to its nearest
    representable neighbour, 2**(floor(log2|w|) - 7) away, so a change below half of that is
    lost. Zero weights always move. Counted slice by slice (`_SHARE_CHUNK` elements), on each
    tensor's own device.
    """
    lost = total = 0
    for p in params:
        flat = p.detach().flatten()
        for start in range(0, flat.numel(), _SHARE_CHUNK):
            w = flat[start : start + _SHARE_CHUNK].float().abs()  # (chunk,)
            _, exp = torch.frexp(w)  # w = m * 2**exp, m in [0.5, 1): floor(log2 w) = exp - 1
            half_step = torch.ldexp(torch.ones_like(w), exp - 9)
            lost += int(((w > 0) & (half_step > lr)).sum())
        total += flat.numel()
    return lost / max(1, total)


def warn_if_updates_vanish(model: nn.Module, policy: Policy, lr: float) -> float | None:
    """Under bf16-pure, warn when a step of the peak `lr` cannot move many trainable weights.

    Returns:
        The share of trainable weights a step cannot move (None for other policies).
    """
    if policy.master != torch.bfloat16:
        return None
    share = unmovable_share([p for p in model.parameters() if p.requires_grad], lr)
    if share > PURE_FROZEN_WARN:
        warnings.warn(
            f"precision bf16-pure at lr {lr:g}: a step is below half a bf16 rounding step for "
            f"{share:.1%} of the trainable weights, so their updates vanish; use precision "
            "bf16-mixed (fp32 master weights) to train at this learning rate",
            UserWarning,
            stacklevel=2,
        )
    return share
