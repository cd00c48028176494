"""Where a search trial's scoring time goes, for the GPU check's trials stage (trials.py): the
evaluator's multiple-choice and generation tasks, the generation prompts' prefill and the
decoding steps (`KindClock`), and the FLOPs of one scoring of an evaluator's items by the plan's
rule (`item_flops`). Not run on its own: `python benchmarks/gpu_check/run.py --stages trials`.
"""

from __future__ import annotations

import time

from gpu_check.common import sync
from layerswap.study.estimate import forward_flops


class KindClock:
    """Where an evaluator's scoring time goes: choice and generation tasks, the prefill of the
    generation prompts, and the decoding steps (counted with their rows).

    Wraps the evaluator's own per-kind methods (this instance's only) and hooks the model's
    forward: with a KV cache, a forward of several tokens is a prefill, of one a decoding step
    (choice rows run without a cache).
    """

    def __init__(self, ev, model, device: str):
        self.device = device
        self.take()
        for key, name in (("mc_s", "_score_mc"), ("gen_s", "_score_gen")):
            setattr(ev, name, self._timed(key, getattr(ev, name)))
        model.register_forward_pre_hook(self._pre, with_kwargs=True)
        model.register_forward_hook(self._post, with_kwargs=True)

    def take(self) -> dict:
        """What was counted since the last take; counting starts again."""
        old, self._t0 = getattr(self, "c", {}), None
        self.c = {"mc_s": 0.0, "gen_s": 0.0, "prefill_s": 0.0, "steps": 0, "step_rows": 0}
        return old

    def _timed(self, key: str, fn):
        def run(*args, **kwargs):
            sync(self.device)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sync(self.device)
                self.c[key] += time.perf_counter() - t0

        return run

    def _pre(self, module, args, kwargs):
        ids, self._t0 = kwargs.get("input_ids", args[0] if args else None), None
        if kwargs.get("use_cache") and ids.shape[1] > 1:
            sync(self.device)
            self._t0 = time.perf_counter()
        elif kwargs.get("use_cache"):
            self.c["steps"] += 1
            self.c["step_rows"] += ids.shape[0]

    def _post(self, module, args, kwargs, out):
        if self._t0 is not None:
            sync(self.device)
            self.c["prefill_s"] += time.perf_counter() - self._t0


def item_flops(ev, cost, max_length: int) -> tuple[float, float]:
    """(FLOPs of the choice rows, FLOPs of the generation prompts) of one scoring of `ev`'s
    items by the plan's rule (a row: prompt plus every option's tokens); prompts left-truncated
    to `max_length` less the new tokens, as ProxyEvaluator._score_gen does."""
    mc = gen = 0.0
    for c in ev.tasks.values():
        for it in c.items:
            if c.kind == "multiple_choice":
                n = len(it.ctx_ids) + sum(len(x) for x in it.cont_ids)
                mc += n * forward_flops(cost, n)
            else:
                n = min(len(it.ctx_ids), max_length - c.max_gen_toks)
                gen += n * forward_flops(cost, n)
    return mc, gen
