"""Learning-rate schedules as pure functions of the step: linear, WSD, constant with warmup.

A pure function (no scheduler object) means nothing but the step needs saving to resume.
"""

from __future__ import annotations

from layerswap.spaces.train_settings import Hyper


def lr_at(h: Hyper, step: int, total: int) -> float:
    """Learning rate for the update made at 0-based `step` of `total`.

    Warmup ramps linearly to `h.lr` over `h.warmup_steps`; then `linear` decays to 0 at
    `total`, `wsd` holds until the last `wsd_decay_frac` of the steps and decays linearly to 0,
    `constant_with_warmup` holds.
    """
    if step < h.warmup_steps:
        return h.lr * (step + 1) / h.warmup_steps
    if h.schedule == "constant_with_warmup":
        return h.lr
    if h.schedule == "linear":
        return h.lr * max(0.0, (total - step) / max(1, total - h.warmup_steps))
    decay = max(1, round(h.wsd_decay_frac * total)) if h.wsd_decay_frac > 0 else 0
    start = max(h.warmup_steps, total - decay)
    if step < start:
        return h.lr
    return h.lr * max(0.0, (total - step) / max(1, total - start))
