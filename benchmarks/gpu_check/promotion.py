"""Stage 5 of the GPU check: does the shipped promotion fit on one GPU at its batch size?

The shipped promotion (spaces/examples/real_llama31_8b_{sw,bn,te}_search.yaml `promote:`,
search/promote.py's shot_groups) runs lm-eval's HFLM at batch_size 32 on the target's MGSM
8-shot (generate_until) and on the proxies' Belebele 5-shot (loglikelihood). HFLM's
loglikelihood takes log_softmax over every position of the padded batch and the whole
128,256-token vocabulary, so its memory grows with rows x tokens x vocabulary (issue 40).

This stage builds a random-weight 8B-shaped bf16 model on the GPU (tiny under --smoke) and calls
HFLM's public loglikelihood / generate_until with requests whose contexts tokenize to the
longest prompts' lengths (Belebele 5-shot ~2,100 tokens, Telugu ~2-3x that, MGSM 8-shot ~900).
Per case: fits or not (an out-of-memory error is the finding), peak memory
(torch.cuda.max_memory_allocated), seconds, and beside it the estimate promotion itself sizes
its batches by (trainables/evaluate/fit.py: `loglikelihood_memory`, `generate_memory`).

Run: python benchmarks/gpu_check/run.py [--smoke] --stages promotion --out DIR
"""

from __future__ import annotations

import time

from gpu_check.common import GIB, ROOT, Timer, free, peak_gib
from gpu_check.figures import Figure, Target, fmt, relative_error
from layerswap.trainables.devices import is_out_of_memory
from layerswap.trainables.evaluate.fit import generate_memory, loglikelihood_memory

TITLE = "Promotion memory at the shipped batch size"

SHIPPED = [ROOT / f"spaces/examples/real_llama31_8b_{lang}_search.yaml" for lang in ("sw", "bn", "te")]  # fmt: skip
# (case, request type, prompt tokens, rows) at the 8B shape; rows = batches x promote.batch_size.
# Belebele 5-shot with the Llama 3 tokenizer is ~2,100 tokens; Telugu text takes 2-3x as many.
# MGSM 8-shot is ~900 tokens; generation is kept to GEN_TOKENS new tokens (the shipped budget
# is 256): what a batch needs is its prefill and KV cache, which 16 tokens already hold.
GPU_CASES = [
    ("belebele 5-shot, one batch", "loglikelihood", 2100, 1),
    ("belebele 5-shot, two batches", "loglikelihood", 2100, 2),
    ("mgsm 8-shot generate", "generate_until", 900, 1),
    ("belebele 5-shot in Telugu, one batch", "loglikelihood", 5000, 1),  # last: it may not fit
]
SMOKE_CASES = [
    ("belebele 5-shot, one batch", "loglikelihood", 100, 1),
    ("belebele 5-shot, two batches", "loglikelihood", 100, 2),
    ("mgsm 8-shot generate", "generate_until", 48, 1),
    ("belebele 5-shot in Telugu, one batch", "loglikelihood", 200, 1),
]
GEN_TOKENS = {"gpu": 16, "smoke": 4}
SMOKE_BATCH = 2
ESTIMATE_TARGET = 0.10  # |relative error| of the estimate against the measured peak


# ------------------------------------------------------------------------ the estimate


def longest_fitting(shape, rows: int, capacity: int, *, b: int = 2) -> int:
    """The longest padded length (tokens) whose steady-state loglikelihood batches (the
    previous batch's log-softmax held, `loglikelihood_memory` with batches=2) fit in
    `capacity` bytes; 0 when not even one token does."""
    lo, hi = 0, 1
    while loglikelihood_memory(shape, rows, hi, batches=2, b=b)["peak"] <= capacity:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # peak grows with tokens: bisect the last length that fits
        mid = (lo + hi) // 2
        if loglikelihood_memory(shape, rows, mid, batches=2, b=b)["peak"] <= capacity:
            lo = mid
        else:
            hi = mid
    return lo


# ------------------------------------------------------------------------ the measurement


def shipped_promotion() -> dict:
    """The shipped real configs' promote settings and the lm-eval runs promotion makes of them
    (search/promote.py shot_groups: few-shot count -> tasks)."""
    from layerswap.search.promote import shot_groups
    from layerswap.spaces.search_experiment import load_search_experiment

    found = {}
    for path in SHIPPED:
        exp = load_search_experiment(path)
        p = exp.promote
        found[path.name] = {
            "batch_size": p.batch_size, "num_fewshot": p.num_fewshot,
            "max_gen_toks": p.max_gen_toks, "shot_groups": shot_groups(exp),
        }  # fmt: skip
    return found


def _model(ctx):
    """A random-weight bf16 model of the run's shape, made on the device."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device(ctx.device):
        model = LlamaForCausalLM._from_config(ctx.config(), dtype=torch.bfloat16)
    return model.eval()


def _texts(lm, tok, corpus: list[int], rows: int, tokens: int) -> list[str]:
    """`rows` different texts from the world corpus, each HFLM-tokenizing to `tokens` (decoded
    windows of the corpus, lengthened or cut until the count is right, 4 tries)."""
    ids = corpus * (tokens // len(corpus) + 2)
    texts = []
    for i in range(rows):
        start, n = (i * 7919) % len(corpus), tokens  # 7919: prime, so every window differs
        for _ in range(4):
            text = tok.decode(ids[start : start + n], skip_special_tokens=True)
            got = len(lm.tok_encode(text))
            if got == tokens:
                break
            n += tokens - got
        texts.append(text)
    return texts


def _requests(lm, tok, corpus: list[int], kind: str, rows: int, tokens: int, gen: int):
    """HFLM requests of one case, and the padded input length they give the model."""
    from lm_eval.api.instance import Instance

    texts = _texts(lm, tok, corpus, rows, tokens)
    if kind == "loglikelihood":  # 4-way choice: one request a row scores " A" (one token)
        reqs = [Instance(kind, {}, (t, " A"), i) for i, t in enumerate(texts)]
        padded = max(len(lm.tok_encode(t + " A")) for t in texts) - 1  # HFLM drops the last
    else:
        until = {"until": ["Question:"], "max_gen_toks": gen, "do_sample": False}
        reqs = [Instance(kind, {}, (t, dict(until)), i) for i, t in enumerate(texts)]
        padded = max(len(lm.tok_encode(t)) for t in texts)
    return reqs, padded


def _measure(ctx, lm, reqs: list, kind: str) -> tuple[bool, str | None, float, float | None]:
    """Run one case from a reset peak counter: (fits, error, seconds, peak GiB)."""
    free(ctx.device)
    fits, error = True, None
    t0 = time.perf_counter()
    try:
        with Timer(ctx.device):
            getattr(lm, kind)(reqs, disable_tqdm=True)
    except RuntimeError as e:  # torch.OutOfMemoryError is one
        # The finding: this batch does not fit, however the GPU said so (a kernel's own
        # allocation raises "CUDA error: out of memory", a plain RuntimeError); else a failure.
        if not is_out_of_memory(e):
            raise
        fits, error = False, str(e).splitlines()[0][:240]
    seconds, peak = time.perf_counter() - t0, peak_gib(ctx.device)
    free(ctx.device)
    return fits, error, seconds, peak


def _case(ctx, lm, tok, corpus, shape, case: tuple, batch: int) -> dict:
    """Measure one case and set the estimate beside it."""
    name, kind, tokens, batches = case
    gen = GEN_TOKENS["smoke" if ctx.smoke else "gpu"]
    rows = batch * batches
    reqs, padded = _requests(lm, tok, corpus, kind, rows, tokens, gen)
    fits, error, seconds, peak = _measure(ctx, lm, reqs, kind)
    if kind == "loglikelihood":
        est = loglikelihood_memory(shape, batch, padded, batches=batches)
    else:
        est = generate_memory(shape, batch, padded, gen)
    est_gib = {k: v / GIB for k, v in est.items()}
    err = relative_error(est_gib["peak"], peak) if fits and peak else None
    return {
        "case": name, "request": kind, "rows": rows, "batch_size": batch, "batches": batches,
        "padded_tokens": padded, "new_tokens": gen if kind == "generate_until" else None,
        "fits": fits, "error": error, "seconds": seconds, "peak_gib": peak,
        "estimate_gib": est_gib, "relative_error": err,
    }  # fmt: skip


def run(ctx) -> dict:
    import torch
    from lm_eval.models.huggingface import HFLM

    from layerswap.trainables.evaluate.lm_eval_api import lm_eval_output
    from layerswap.trainables.train.model_shape import model_shape

    shipped = shipped_promotion()
    sizes = {s["batch_size"] for s in shipped.values() if isinstance(s["batch_size"], int)}
    batch = SMOKE_BATCH if ctx.smoke else max(sizes)
    tok = ctx.tokenizer()
    corpus = tok((ctx.world / "corpus" / "pretrain.txt").read_text(), add_special_tokens=False).input_ids  # fmt: skip
    shape = model_shape(ctx.config())
    free(ctx.device)
    model = _model(ctx)
    weights = torch.cuda.memory_allocated() / GIB if ctx.device == "cuda" else None
    free_bytes = torch.cuda.mem_get_info()[0] if ctx.device == "cuda" else None
    lm_eval_output(False)  # lm-eval's INFO log off; its warnings stay
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=batch)
    cases = []
    for case in SMOKE_CASES if ctx.smoke else GPU_CASES:
        if not ctx.smoke and ctx.remaining() < 15:
            cases.append({"case": case[0], "skipped": f"{ctx.remaining():.0f} s left"})
            continue
        cases.append(_case(ctx, lm, tok, corpus, shape, case, batch))
        ctx.keep(case[0], lambda: _result(ctx, shipped, batch, shape, cases, weights, free_bytes))
    del lm, model
    free(ctx.device)
    return _result(ctx, shipped, batch, shape, cases, weights, free_bytes)


def _result(ctx, shipped: dict, batch: int, shape, cases: list[dict], weights, free_bytes) -> dict:
    """The stage's result from the cases measured so far. The capacity is what
    torch.cuda.mem_get_info says, the check's memory cap when there is one (run.py)."""
    import torch

    capacity = torch.cuda.mem_get_info()[1] if ctx.device == "cuda" else None
    res = _report(ctx, shipped, batch, shape, cases, capacity, weights)
    res["figures"] += _picked(cases, shape, batch, free_bytes)
    return res


def _picked(cases: list[dict], shape, batch: int, free_bytes: int | None) -> list[Figure]:
    """The batch promotion now runs each case at (trainables/evaluate/fit.py: the estimate above
    within the free memory, before any back-off), beside the shipped fixed batch."""
    from layerswap.trainables.evaluate.fit import RowShape, fitting_batch

    figs = []
    for c in cases:
        if "skipped" in c:
            continue
        kind = "loglikelihood" if c["request"] == "loglikelihood" else "generate"
        row = RowShape(kind, c["padded_tokens"], c["new_tokens"] or 0)
        got = fitting_batch([row], shape, free_bytes, batch) if free_bytes else None
        how = f"of {batch}, {free_bytes / GIB:.1f} GiB free beside the model" if free_bytes else "no GPU memory on CPU"  # fmt: skip
        figs.append(Figure(f"{c['case']}: batch promotion now picks", got, "rows", assumed=batch, note=how))  # fmt: skip
    return figs


def _case_figures(c: dict, capacity: int | None) -> list[Figure]:
    """A case's peak beside its estimate, and the estimate's error where the batch fitted."""
    e = c["estimate_gib"]
    parts = ", ".join(f"{k} {fmt(v)}" for k, v in e.items() if k != "peak" and v)
    shape = f"{c['rows']} rows x {c['padded_tokens']} tokens"
    if c["fits"]:
        how = f"fits, {c['seconds']:.1f} s"
    else:
        how = f"OUT OF MEMORY after {c['seconds']:.1f} s (peak before it)"
    if capacity:
        verdict = "fits" if e["peak"] * GIB <= capacity else "does not fit"
        how += f"; the estimate says it {verdict} in {capacity / GIB:.1f} GiB"
    figs = [Figure(f"{c['case']}: peak memory ({shape})", c["peak_gib"], "GiB", assumed=e["peak"],
                   note=f"{how}; estimate GiB: {parts}")]  # fmt: skip
    if c["fits"]:
        err = c["relative_error"]
        figs.append(Figure(
            f"{c['case']}: estimate's error", None if err is None else abs(err), "share",
            Target("<=", ESTIMATE_TARGET),
            note="no peak on CPU" if err is None else f"estimate {err:+.1%} vs measured",
        ))  # fmt: skip
    return figs


def _report(ctx, shipped: dict, batch: int, shape, cases: list[dict], capacity: int | None, weights: float | None) -> dict:  # fmt: skip
    """The stage's figures and notes."""
    measured = [c for c in cases if "skipped" not in c]
    figures = [f for c in measured for f in _case_figures(c, capacity)]
    longest = longest_fitting(shape, batch, capacity) if capacity else None
    figures.append(Figure(
        f"longest loglikelihood prompt that fits at batch {batch} (estimate)", longest, "tokens",
        note="loglikelihood_memory's steady state (previous batch's log-softmax held) within the "
             "GPU's total memory" if capacity else "no GPU memory to fit into on CPU",
    ))  # fmt: skip
    runs = "; ".join(
        f"{name}: batch {s['batch_size']}, "
        + ", ".join(f"{k}-shot {'+'.join(t)}" for k, t in s["shot_groups"])
        for name, s in shipped.items()
    )
    gen = next((c for c in measured if c["request"] == "generate_until"), None)
    notes = [
        f"the shipped promotion (search/promote.py shot_groups): {runs}",
        "HFLM's loglikelihood: logits [rows, tokens, vocab] in the model's dtype and their "
        "log_softmax beside them (softmax_dtype None); the previous batch's log-softmax is "
        "still referenced while the next batch runs (its loop variable), hence 'two batches'",
        f"shape {ctx.shape}, vocab {shape.vocab}, bf16, random weights made on {ctx.device}; "
        f"the texts are world-corpus windows whose token count HFLM's tok_encode checks",
    ]
    if weights is not None:
        est_w = sum(shape.params.values()) * 2 / GIB
        notes.append(f"weights on the GPU after building: {weights:.2f} GiB (estimate {est_w:.2f})")  # fmt: skip
    if gen is not None:
        full = generate_memory(shape, batch, gen["padded_tokens"], max(s["max_gen_toks"] for s in shipped.values()))  # fmt: skip
        notes.append(
            f"generate_until ran {gen['new_tokens']} new tokens, not the shipped max_gen_toks: a "
            f"batch's memory is its prefill and KV cache; at the shipped budget the estimate is "
            f"{fmt(full['peak'] / GIB)} GiB (KV cache {fmt(full['kv_cache'] / GIB)})"
        )
    notes += [f"{c['case']}: skipped, {c['skipped']}" for c in cases if "skipped" in c]
    notes += [f"{c['case']}: {c['error']}" for c in measured if c["error"]]
    if ctx.device != "cuda":
        notes.append("CPU run: no device memory to measure, peaks are None (the path is what runs)")
    return {"figures": figures, "notes": notes, "batch_size": batch, "cases": cases, "shipped": shipped}  # fmt: skip
