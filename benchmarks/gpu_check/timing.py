"""Forward-pass timing for the GPU check: every forward of a model recorded with its rows, real
tokens and KV-cache length, so prefill (whole prompts) and decoding steps are measured apart;
and the plan's FLOP rule applied to them. Used by evaluator.py (stage 2).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from gpu_check.common import sync


@dataclass
class Call:
    """One forward of the model: rows, real tokens per row, cached tokens before it, times."""

    rows: int
    tokens: list[int]
    past: int  # 0: a prefill (a whole prompt); > 0: a decoding step on a KV cache
    t0: float
    t1: float
    keep: int = 0  # logits_to_keep: positions per row the lm_head ran on (0: every one)


class ForwardLog:
    """`with ForwardLog(model, device) as log:` records every forward of `model` as a Call.

    Each forward is synchronised on both ends, so its time is the device's; the decoding
    loop's own host work then lies between one forward's end and the next one's start.
    """

    def __init__(self, model, device: str):
        self.model, self.device, self.calls = model, device, []

    def __enter__(self):
        self._hooks = [
            self.model.register_forward_pre_hook(self._pre, with_kwargs=True),
            self.model.register_forward_hook(self._post, with_kwargs=True),
        ]
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()

    def _pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("past_key_values", kwargs.get("cache"))  # transformers renames it
        past = cache.get_seq_length() if cache is not None else 0
        mask = kwargs.get("attention_mask")
        rows, width = ids.shape
        real = mask.sum(-1).tolist() if mask is not None and past == 0 else [width] * rows
        keep = kwargs.get("logits_to_keep", 0)
        self._keep = keep if isinstance(keep, int) else len(keep)  # a tensor: the kept indices
        sync(self.device)
        self._open = (rows, real, past, time.perf_counter())

    def _post(self, module, args, kwargs, output):
        sync(self.device)
        self.calls.append(Call(*self._open, time.perf_counter(), self._keep))


def prefill_flops(cost, row_tokens: list[int]) -> float:
    """FLOPs of prefilling rows of `row_tokens` real tokens by the plan's rule: per row,
    tokens x forward_flops(cost, mean causal context (n + 1) / 2)."""
    from layerswap.study.estimate import forward_flops

    return sum(n * forward_flops(cost, (n + 1) / 2) for n in row_tokens)


def head_skipped_flops(head_mm: int, row_tokens: list[int], keep: int) -> float:
    """lm_head FLOPs the plan's rule counts but a forward with logits_to_keep=`keep` does not
    run: 2 x head_mm for every real token of a row beyond its last `keep` (0: none skipped)."""
    if keep <= 0:
        return 0.0
    return sum(2.0 * head_mm * max(0, n - keep) for n in row_tokens)


def summarize(logs: list[list[Call]], cost, kv_per_token: int, head_mm: int = 0) -> dict:
    """Prefill FLOPs and seconds, and decoding steps, over the forward logs of several runs.

    Prefill FLOPs are the plan's rule (lm_head on every token, `prefill_flops`); the executed
    ones leave out the lm_head on the positions logits_to_keep dropped (`head_skipped_flops`,
    `head_mm`: the lm_head's in x out features).

    A decoding step's whole time runs from the previous forward's end to its own (the loop's
    host work included); its forward time is its own call's. Bytes a step must read: every
    weight plus the KV cache of its rows (padding included, the kernel reads it).
    """
    pre_s = pre_flops = pre_tokens = skipped = 0.0
    pre_rows = pre_calls = 0
    steps, fwds, rows, step_bytes = [], [], [], []
    for calls in logs:
        for i, c in enumerate(calls):
            if c.past == 0:
                pre_calls, pre_rows = pre_calls + 1, pre_rows + c.rows
                pre_s += c.t1 - c.t0
                pre_flops += prefill_flops(cost, c.tokens)
                skipped += head_skipped_flops(head_mm, c.tokens, c.keep)
                pre_tokens += sum(c.tokens)
            else:
                steps.append(c.t1 - calls[i - 1].t1)
                fwds.append(c.t1 - c.t0)
                rows.append(c.rows)
                step_bytes.append(cost.weight_bytes + c.rows * (c.past + 1) * kv_per_token)
    mean = statistics.fmean
    return {
        "prefill_calls": pre_calls, "prefill_rows": pre_rows, "prefill_tokens": int(pre_tokens),
        "prefill_s": pre_s, "prefill_flops": pre_flops,
        "prefill_flops_per_s": pre_flops / pre_s if pre_s else None,
        "prefill_executed_flops": pre_flops - skipped,
        "prefill_executed_flops_per_s": (pre_flops - skipped) / pre_s if pre_s else None,
        "decode_steps": len(steps),
        "decode_step_s": mean(steps) if steps else None,
        "decode_forward_s": mean(fwds) if fwds else None,
        "decode_rows": mean(rows) if rows else None,
        "decode_step_bytes": mean(step_bytes) if steps else None,
    }  # fmt: skip
