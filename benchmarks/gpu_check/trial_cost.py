"""The trials stage's arithmetic (stage 3 of the GPU check): which depth fits the experts on the
device, how many items fidelity screening scores, and measured rates scaled to the shipped
search config by the plan's own rule. Pure functions; tests/benchmarks/test_gpu_check_trials.py.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from layerswap.search.fidelity import policy_of
from layerswap.study.estimate import decode_steps, eval_cost

COPIES = 3  # base + 2 experts, whole: real checkpoints and the node store share no tensor


def device_depth(layer_bytes: float, other_bytes: float, depth: int, gpu_bytes: float, headroom: float, copies: int = COPIES) -> int:  # fmt: skip
    """The deepest model (at most `depth` layers) whose experts layerswap keeps on the device:
    LiveModel._place's rule, live model + experts <= GPU x (1 - headroom), for `copies` whole
    checkpoints beside the live model, each `other_bytes` + layers x `layer_bytes`.

    Returns:
        layers (0 when not even the embeddings fit).
    """
    per_copy = gpu_bytes * (1 - headroom) / (copies + 1)
    return max(0, min(depth, math.floor((per_copy - other_bytes) / layer_bytes)))


def first_share(exp) -> float | None:
    """The share of every proxy's items a trial scores before it may stop (its fidelity
    policy's first rung), None when no trial stops early."""
    whole, share = policy_of(exp.search.fidelity, exp.search.multi_objective).floor(exp.search.fidelity)  # fmt: skip
    return None if whole is None else share


def screen_counts(n: int, screen: float | None) -> list[int]:
    """Items of each evaluator pass of a trial: the screened prefix (as ProxyEvaluator.subset
    counts it), then the rest; one pass without screening."""
    if screen is None:
        return [n]
    k = max(1, math.ceil(screen * n - 1e-9))
    return [k, n - k] if n > k else [k]


def rate_profiles(mc_flops_per_s: float, prefill_flops_per_s: float, step_s: float) -> dict:
    """Stand-in profiles for study.estimate.eval_cost at measured rates, one per part of the
    scoring: "mc" (choice rows), "prefill" (generation prompts, no decoding), "decode" (steps
    of `step_s` each, weight reads included: bytes/s infinite, prompts free)."""

    def prof(flops, step):
        fig = SimpleNamespace
        return SimpleNamespace(prefill_flops_per_s=fig(value=flops), decode_bytes_per_s=fig(value=math.inf),
                               decode_step_overhead_s=fig(value=step))  # fmt: skip

    return {"mc": prof(mc_flops_per_s, 0.0), "prefill": prof(prefill_flops_per_s, 0.0), "decode": prof(math.inf, step_s)}  # fmt: skip


def proxy_seconds(profiles: dict, cost, tasks, *, limit, gen_toks: int, batch: int, screen) -> dict:
    """Seconds of a trial's proxies by study.estimate.eval_cost, per part of the scoring.

    Args:
        profiles: {part: profile}; "mc" scores the choice tasks, every other part the
            generation tasks (e.g. the h100 profile as {"mc": p, "gen": p}, or rate_profiles).
        cost: the scored model's study.estimate.ModelCost.
        tasks: (TaskShape, few-shot examples) per proxy.
        limit, gen_toks, batch, screen: proxy_eval.limit, max_gen_toks, rows per pass,
            the first rung's share (`first_share`).
    Returns:
        {"kept": {part: s}, "pruned": {part: s}}: a kept trial scores every item (screened
        prefix, then the rest), a pruned one the prefix only.
    """
    out = {k: dict.fromkeys(profiles, 0.0) for k in ("kept", "pruned")}
    for shape, shots in tasks:
        n = min(limit or shape.items, shape.items)
        parts = ["mc"] if shape.choices else [p for p in profiles if p != "mc"]
        steps = decode_steps(shape, shots, gen_toks)  # to the stop strings, as the plan counts
        for i, k in enumerate(screen_counts(n, screen)):
            for part in parts:
                s = eval_cost(cost, shape, k, shots, steps, batch, profiles[part], row_per_option=False)[0]  # fmt: skip
                out["kept"][part] += s
                out["pruned"][part] += s if i == 0 else 0.0
    return out


def pass_rates(rows: list[dict], mc_flops: float, prefill_flops: float, step_scale: float) -> dict:
    """Scoring rates over a pass's timed trials (each scored the same items).

    Args:
        rows: per trial "mc_s", "gen_s", "prefill_s", "steps".
        mc_flops, prefill_flops: FLOPs of one trial's choice rows, generation prompts.
        step_scale: weight bytes of the depth scaled to / of the one measured (a decoding step
            reads every weight once).
    Returns:
        rate_profiles' arguments by name.
    """
    n, tot = len(rows), {k: sum(r[k] for r in rows) for k in ("mc_s", "gen_s", "prefill_s", "steps")}  # fmt: skip
    return {
        "mc_flops_per_s": n * mc_flops / tot["mc_s"],
        "prefill_flops_per_s": n * prefill_flops / tot["prefill_s"],
        "step_s": (tot["gen_s"] - tot["prefill_s"]) / tot["steps"] * step_scale,
    }
