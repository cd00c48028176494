"""Stage 2 of the GPU check: layerswap's cached evaluator against lm-eval's HFLM at the 8B shape.

A random-weight Llama-3.1-8B-shaped model (bf16, real 128,256 vocabulary, built on the GPU) is
scored as two candidates (the same model re-noised in place between them) on Belebele-format
multiple choice (5-shot) and MGSM-format generation (8-shot), the shipped search config's
few-shot counts (spaces/examples/real_llama31_8b_sw_search.yaml), by layerswap's ProxyEvaluator
and by lm_eval.simple_evaluate(HFLM(pretrained=model)) at batch 1 and 32 (and 8 when time
allows). The items are written here with passages long enough to give real prompt lengths in
the world tokenizer's tokens (5-shot Belebele ~2,100, 8-shot MGSM ~800). While the evaluator
scores, every forward of the model is timed (synchronised hooks), so prefill (whole prompts)
and decoding steps (one token on a KV cache) are measured apart.

Run: python benchmarks/gpu_check/run.py --stages evaluator --out DIR [--smoke]
The race itself is benchmarks/bench_eval.py's (its helpers are imported).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import bench_eval  # benchmarks/: the race's helpers; it puts the fixture folder on sys.path
from common import Timer, free, sync
from figures import Figure, Target, decode_bound_s, peak_share, share, speedup

TITLE = "Evaluator vs lm-eval HFLM at the 8B shape"

TASKS = bench_eval.TASKS  # ["mgsm_dev", "bele_dev"]: bench_eval's prediction readers know them
SHOTS = {"bele_dev": 5, "mgsm_dev": 8}  # real_llama31_8b_sw_search.yaml's proxies
# Prompt lengths of the real tasks in Llama-3 tokens: Belebele eng_Latn 5-shot ~2,100, MGSM
# en 8-shot ~700-900. Under smoke the tiny model's window is 256 positions.
# stage_s: the stage's share of the check's time (the batch-8 extra is timed only within it).
FULL = dict(n_bele=16, n_mgsm=8, bele_tokens=2100, mgsm_tokens=800, max_gen_toks=64, stage_s=90.0)
SMOKE = dict(n_bele=4, n_mgsm=4, bele_tokens=200, mgsm_tokens=240, max_gen_toks=8, stage_s=20.0)
HFLM_BATCHES = (1, 32)  # batch 1 is the reference the predictions are compared with
EXTRA_BATCH = 8  # timed too when the stage's time allows
CANDIDATES = 2
WORDS = (
    "the river city market farmer children school water mountain village road bread teacher "
    "morning family garden price number train station history people country music doctor "
    "island forest winter summer language government a of and in to was for on with"
).split()
BELE_TEMPLATE = "P: \nQ: \nA: \nB: \nC: \nD: \nAnswer: B\n\n"  # belebele's doc_to_text + target
MGSM_TEMPLATE = "Question: \nAnswer:12\n\n"


# ------------------------------------------------------------------------------ the items


def n_tokens(tok, text: str) -> int:
    """Tokens of `text` without special tokens."""
    return len(tok(text, add_special_tokens=False)["input_ids"])


def text_of_tokens(tok, n: int, rng) -> str:
    """Random words from WORDS whose encoding has at least `n` tokens (and, with a one-token
    word in WORDS, at most `n` + 1: the space before the first word may merge differently).

    Args:
        tok: the tokenizer that counts.
        n: tokens wanted.
        rng: a numpy Generator.
    """
    cost = {w: n_tokens(tok, " " + w) for w in WORDS}
    cheapest = min(WORDS, key=cost.get)
    words: list[str] = []
    est = 0
    while True:
        w = WORDS[int(rng.integers(len(WORDS)))]
        if est + cost[w] > n:  # the last word: the cheapest, so the text does not overshoot
            w = cheapest
        words.append(w)
        est += cost[w]
        # Byte-level BPE splits at spaces, so word costs add up; the whole text decides.
        if est >= n and n_tokens(tok, " ".join(words)) >= n:
            return " ".join(words)


def belebele_rows(tok, n: int, doc_tokens: int, seed: int) -> list[dict]:
    """`n` Belebele-schema rows of about `doc_tokens` tokens each, rendered with the template."""
    import numpy as np

    rng = np.random.default_rng(seed)
    q, a = max(1, doc_tokens // 12), max(1, doc_tokens // 40)
    passage = max(1, doc_tokens - n_tokens(tok, BELE_TEMPLATE) - q - 4 * a)
    return [
        {
            "flores_passage": text_of_tokens(tok, passage, rng) + ".",
            "question": text_of_tokens(tok, q, rng) + "?",
            **{f"mc_answer{j}": text_of_tokens(tok, a, rng) for j in range(1, 5)},
            "correct_answer_num": str(int(rng.integers(1, 5))),
        }
        for _ in range(n)
    ]


def mgsm_rows(tok, n: int, doc_tokens: int, seed: int, *, train: bool) -> list[dict]:
    """`n` MGSM-schema rows of about `doc_tokens` tokens each (train rows carry answers)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        a, b = int(rng.integers(1, 50)), int(rng.integers(1, 50))
        tail = f" {a} plus {b}?"
        body = max(1, doc_tokens - n_tokens(tok, MGSM_TEMPLATE + tail))
        q = text_of_tokens(tok, body, rng) + "." + tail
        rows.append(
            {
                "question": f"Question: {q}" if train else q,  # as in MGSM's train split
                "answer": f"Step-by-Step Answer: {a} plus {b} is {a + b}." if train else None,
                "answer_number": a + b,
                "equation_solution": f"{a} + {b} = {a + b}" if train else None,
            }
        )
    return rows


def write_tasks(root: Path, tok, sizes: dict) -> Path:
    """JSONL items and task YAMLs `bele_dev`, `mgsm_dev` (lm-eval's own configs, included)."""
    import yaml
    from proxy_fixtures import BELEBELE_EN, MGSM_EN

    root.mkdir(parents=True, exist_ok=True)

    def jsonl(name: str, rows: list[dict]) -> str:
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(root / name)

    bele_doc = sizes["bele_tokens"] // (SHOTS["bele_dev"] + 1)
    mgsm_doc = sizes["mgsm_tokens"] // (SHOTS["mgsm_dev"] + 1)
    bele = [belebele_rows(tok, SHOTS["bele_dev"], bele_doc, 1),
            belebele_rows(tok, sizes["n_bele"], bele_doc, 2)]  # fmt: skip
    mgsm = [mgsm_rows(tok, SHOTS["mgsm_dev"], mgsm_doc, 3, train=True),
            mgsm_rows(tok, sizes["n_mgsm"], mgsm_doc, 4, train=False)]  # fmt: skip
    # Few-shot examples in a split of their own, so any item count can take all the shots.
    data = {
        "bele_dev": (BELEBELE_EN, "fewshot", {"fewshot": jsonl("bele_fewshot.jsonl", bele[0]),
                                              "dev": jsonl("bele_dev.jsonl", bele[1])}),
        "mgsm_dev": (MGSM_EN, "train", {"train": jsonl("mgsm_train.jsonl", mgsm[0]),
                                        "dev": jsonl("mgsm_dev.jsonl", mgsm[1])}),
    }  # fmt: skip
    for task, (include, shots_split, files) in data.items():
        cfg = {
            "include": str(include), "task": task, "dataset_path": "json", "dataset_name": None,
            "dataset_kwargs": {"data_files": files}, "test_split": "dev",
            "fewshot_split": shots_split, "training_split": shots_split,
            "num_fewshot": SHOTS[task],  # HFLM reads it here; the evaluator is given SHOTS too
        }  # fmt: skip
        (root / f"{task}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return root


# ------------------------------------------------------------------------------ forward timing


@dataclass
class Call:
    """One forward of the model: rows, real tokens per row, cached tokens before it, times."""

    rows: int
    tokens: list[int]
    past: int  # 0: a prefill (a whole prompt); > 0: a decoding step on a KV cache
    t0: float
    t1: float


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
        sync(self.device)
        self._open = (rows, real, past, time.perf_counter())

    def _post(self, module, args, kwargs, output):
        sync(self.device)
        self.calls.append(Call(*self._open, time.perf_counter()))


def prefill_flops(cost, row_tokens: list[int]) -> float:
    """FLOPs of prefilling rows of `row_tokens` real tokens by the plan's rule: per row,
    tokens x forward_flops(cost, mean causal context (n + 1) / 2)."""
    from layerswap.study.estimate import forward_flops

    return sum(n * forward_flops(cost, (n + 1) / 2) for n in row_tokens)


def kv_bytes_per_token(shape) -> int:
    """KV-cache bytes of one token: keys and values of every layer's KV heads."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * shape.dtype.itemsize


def summarize(logs: list[list[Call]], cost, kv_per_token: int) -> dict:
    """Prefill FLOPs and seconds, and decoding steps, over the forward logs of several runs.

    A decoding step's whole time runs from the previous forward's end to its own (the loop's
    host work included); its forward time is its own call's. Bytes a step must read: every
    weight plus the KV cache of its rows (padding included, the kernel reads it).
    """
    pre_s = pre_flops = pre_tokens = 0.0
    pre_rows = pre_calls = 0
    steps, fwds, rows, step_bytes = [], [], [], []
    for calls in logs:
        for i, c in enumerate(calls):
            if c.past == 0:
                pre_calls, pre_rows = pre_calls + 1, pre_rows + c.rows
                pre_s += c.t1 - c.t0
                pre_flops += prefill_flops(cost, c.tokens)
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
        "decode_steps": len(steps),
        "decode_step_s": mean(steps) if steps else None,
        "decode_forward_s": mean(fwds) if fwds else None,
        "decode_rows": mean(rows) if rows else None,
        "decode_step_bytes": mean(step_bytes) if steps else None,
    }  # fmt: skip


def diff_share(mine: dict, ref: dict) -> tuple[int, int]:
    """(items whose prediction in `mine` differs from `ref`, items in `ref`)."""
    return sum(mine.get(k) != v for k, v in ref.items()), len(ref)


def best_batch(times: dict[int, list[float]]) -> int:
    """The batch size with the lowest median seconds."""
    return min(times, key=lambda b: statistics.median(times[b]))


# ------------------------------------------------------------------------------ the race


def _model(ctx):
    """The run's shape, random weights, built directly on the device (bf16 on a GPU)."""
    import torch
    from transformers import LlamaForCausalLM

    dtype = torch.bfloat16 if ctx.device == "cuda" else torch.float32
    cfg = ctx.config()
    cfg.dtype = dtype  # model_cost counts the weight bytes in the config's dtype
    with torch.device(ctx.device):
        model = LlamaForCausalLM._from_config(cfg, dtype=dtype)
    return model.eval(), cfg


def _warm_up(model, device: str) -> None:
    """One forward with a cache and one decoding step: start-up costs go to no contender."""
    import torch

    with torch.inference_mode():
        ids = torch.ones(1, 64, dtype=torch.long, device=device)
        out = model(input_ids=ids, use_cache=True)
        model(input_ids=ids[:, :1], past_key_values=out.past_key_values, use_cache=True)
    sync(device)


def _hflm(model, tok, tm, batch: int, gen: dict, device: str) -> tuple[float, dict]:
    """Seconds of one simple_evaluate(HFLM(pretrained=model)) over TASKS, and its predictions."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    with Timer(device) as t:
        out = lm_eval.simple_evaluate(
            model=HFLM(pretrained=model, tokenizer=tok, batch_size=batch, device=device),
            tasks=TASKS, task_manager=tm, log_samples=True, gen_kwargs=dict(gen),
            bootstrap_iters=0, cache_requests=False, verbosity="ERROR",
        )  # fmt: skip
    return t.s, bench_eval._hflm_predictions(out)


def _fits(ctx, run_hflm, b: int):
    """`run_hflm(b)`, or None when batch `b` runs out of device memory (that is the finding)."""
    import torch

    from layerswap.trainables.evaluate.proxy_lm import is_oom

    try:
        return run_hflm(b)
    except (RuntimeError, torch.OutOfMemoryError) as e:
        if b == HFLM_BATCHES[0] or not is_oom(e):  # no reference without batch 1
            raise
    free(ctx.device)  # out of the except block: the traceback's tensors are gone
    return None


def _race(ctx, model, tok, ev, tm, sizes: dict, t_start: float) -> dict:
    """Each candidate by the evaluator (forwards logged), then by HFLM at each batch size."""
    gen = {"max_gen_toks": sizes["max_gen_toks"]}
    ours, logs, theirs, no_fit = [], [], {b: [] for b in HFLM_BATCHES}, []
    differ = total = 0
    extra = f"HFLM batch {EXTRA_BATCH} not timed: the stage's time would not allow it"

    def run_hflm(b: int):
        return _hflm(model, tok, tm, b, gen, ctx.device)

    for i in range(CANDIDATES):
        if i:
            bench_eval.renoise(model, i)
        t_cand = time.perf_counter()
        with ForwardLog(model, ctx.device) as log, Timer(ctx.device) as t:
            res = ev.score(model)
        ours.append(t.s)
        logs.append(log.calls)
        for b in list(theirs):
            got = _fits(ctx, run_hflm, b)
            if got is None:
                no_fit.append(b)
                del theirs[b]
                continue
            theirs[b].append(got[0])
            if b == HFLM_BATCHES[0]:  # the exact reference: HFLM one request at a time
                d, n = diff_share(bench_eval._predictions(res), got[1])
                differ, total = differ + d, total + n
        if i == 0:
            # A guess for the decision only: batch 8 costs about the mean of batches 1 and 32.
            guess = statistics.fmean(ts[0] for ts in theirs.values())
            need = (CANDIDATES - 1) * (time.perf_counter() - t_cand) + CANDIDATES * guess
            left = min(sizes["stage_s"] - (time.perf_counter() - t_start), ctx.remaining())
            if need > left:
                extra += f" (~{need:.0f} s more, {left:.0f} s left)"
            elif (got := _fits(ctx, run_hflm, EXTRA_BATCH)) is None:
                no_fit.append(EXTRA_BATCH)
                extra = f"HFLM batch {EXTRA_BATCH} tried too"
            else:
                theirs[EXTRA_BATCH] = [got[0]]
                extra = f"HFLM batch {EXTRA_BATCH} timed too ({need:.0f} s of {left:.0f} s left)"
    return {
        "ours": ours, "theirs": theirs, "logs": logs, "differ": differ, "total": total,
        "extra_note": extra, "out_of_memory": no_fit,
    }  # fmt: skip


def _prompt_tokens(ev) -> dict:
    """Mean and max prompt tokens (few-shot examples included) per task, as the evaluator
    tokenized them."""
    out = {}
    for name, c in ev.tasks.items():
        lens = [len(it.ctx_ids) for it in c.items]
        out[name] = {"mean": statistics.fmean(lens), "max": max(lens), "items": len(lens)}
    return out


# ------------------------------------------------------------------------------ figures


def _speed_figures(race: dict) -> list[Figure]:
    """Seconds per candidate of each contender, the speed-ups, and the predictions that differ."""
    med = statistics.median
    n = len(race["ours"])
    ours = med(race["ours"])
    theirs = {b: med(ts) for b, ts in sorted(race["theirs"].items())}
    best = best_batch(race["theirs"])
    figs = [Figure("evaluator seconds per candidate", ours, "s", note=f"median of {n}")]
    for b, s in theirs.items():
        k = len(race["theirs"][b])
        figs.append(Figure(f"HFLM batch {b} seconds per candidate", s, "s", note=f"median of {k}"))
    set_up = "same items and model; HFLM's time includes simple_evaluate's task set-up"
    differ = f"{race['differ']} of {race['total']} items over {n} candidates"
    return [
        *figs,
        Figure(
            f"evaluator speed-up vs HFLM at its best batch ({best})",
            speedup(theirs[best], ours), "x", Target(">=", 2.0), note=set_up,
        ),
        Figure("evaluator speed-up vs HFLM batch 1", speedup(theirs[1], ours), "x"),
        Figure(
            "share of predictions differing from HFLM batch 1",
            share(race["differ"], race["total"]), "share", Target("<=", 0.01), note=differ,
        ),
    ]  # fmt: skip


def _device_figures(ctx, s: dict, cost, prof) -> list[Figure]:
    """Prefill FLOP/s and decoding steps of the evaluator, against the GPU and the profile."""
    flops, step, fwd = s["prefill_flops_per_s"], s["decode_step_s"], s["decode_forward_s"]
    bound = decode_bound_s(s["decode_step_bytes"], ctx.bandwidth) if step else None
    plan_step = (
        cost.weight_bytes / prof.decode_bytes_per_s.value + prof.decode_step_overhead_s.value
    )
    cpu = "" if ctx.peak_flops else "; no GPU datasheet figure: not computed"
    mfu = peak_share(flops, ctx.peak_flops) if flops else None
    steps = f"mean of {s['decode_steps']} steps of {s['decode_rows'] or 0:.1f} rows"
    return [
        Figure(
            "evaluator prefill FLOP/s", flops, "FLOP/s", assumed=prof.prefill_flops_per_s.value,
            note=f"{s['prefill_tokens']} tokens in {s['prefill_calls']} forwards, plan's rule",
        ),
        Figure(
            "evaluator prefill share of bf16 peak", mfu, "share", Target(">=", 0.5),
            note="of the datasheet dense bf16 peak" + cpu,
        ),
        Figure(
            "evaluator decoding step", step, "s", assumed=plan_step,
            note=f"{steps}, the loop's host work included; assumed: the plan's step",
        ),
        Figure(
            "decoding step / memory-bandwidth bound", step / bound if step and bound else None,
            "x", Target("<=", 2.0), note="bound: weights and the rows' KV cache read once" + cpu,
        ),
        Figure(
            "decode bytes/s (weight bytes / decoding forward)",
            cost.weight_bytes / fwd if fwd else None, "B/s", assumed=prof.decode_bytes_per_s.value,
        ),
        Figure(
            "decode step overhead (whole step - forward)", max(step - fwd, 1e-4) if step else None,
            "s", assumed=prof.decode_step_overhead_s.value, note="the loop's host work per step",
        ),
    ]  # fmt: skip


def _throughput(s: dict, cost, shape_txt: str) -> dict:
    """The profile figures this stage measures (GPU runs only), with their provenance."""
    step, fwd, wb = s["decode_step_s"], s["decode_forward_s"], cost.weight_bytes
    out = {"prefill_flops_per_s": {
        "value": s["prefill_flops_per_s"], "unit": "FLOP/s", "shape": shape_txt,
        "result": f"layerswap's evaluator: {s['prefill_calls']} prefill forwards, "
        f"{s['prefill_rows']} rows, {s['prefill_tokens']} real tokens in {s['prefill_s']:.3f} s",
        "derivation": f"sum over rows of n x forward_flops(model_cost, (n + 1) / 2) = "
        f"{s['prefill_flops']:.4g} FLOPs (lm_head on every token, the plan's rule) / that time",
    }}  # fmt: skip
    if step:
        res = (f"layerswap's evaluator: {s['decode_steps']} decoding steps of "
               f"{s['decode_rows']:.1f} rows on average: forward {fwd * 1e3:.2f} ms, whole step "
               f"{step * 1e3:.2f} ms")  # fmt: skip
        out["decode_bytes_per_s"] = {
            "value": wb / fwd, "unit": "B/s", "shape": shape_txt, "result": res,
            "derivation": f"{wb:.4g} weight bytes / the mean decoding forward; the rest of a "
            "step is decode_step_overhead_s, so bytes / this + overhead = the measured step",
        }  # fmt: skip
        out["decode_step_overhead_s"] = {
            "value": max(step - fwd, 1e-4), "unit": "s/step", "shape": shape_txt, "result": res,
            "derivation": "whole step - forward (the loop's host work), floored at 0.1 ms",
        }  # fmt: skip
    return out


# ------------------------------------------------------------------------------ the stage


def run(ctx) -> dict:
    """The stage (see the module docstring): its figures, notes and raw numbers."""
    import tempfile

    from layerswap.spaces.study import load_profiles
    from layerswap.study.estimate import model_cost
    from layerswap.trainables.evaluate.lm_eval_api import task_manager
    from layerswap.trainables.evaluate.proxy import ProxyEvaluator
    from layerswap.trainables.train.model_shape import model_shape

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    t_start = time.perf_counter()
    sizes = SMOKE if ctx.smoke else FULL
    tok = ctx.tokenizer()
    with tempfile.TemporaryDirectory(prefix="gc-evaluator-") as tmp:
        root = write_tasks(Path(tmp), tok, sizes)
        model, cfg = _model(ctx)
        with Timer(ctx.device) as built:
            ev = ProxyEvaluator(
                TASKS, tok, include_path=str(root), num_fewshot=SHOTS,
                gen_kwargs={"max_gen_toks": sizes["max_gen_toks"]}, batch_size="auto",
            )  # fmt: skip
        tm = task_manager(TASKS, root)
        _warm_up(model, ctx.device)
        race = _race(ctx, model, tok, ev, tm, sizes, t_start)
    shape = model_shape(cfg)
    cost = model_cost(shape)
    summary = summarize(race.pop("logs"), cost, kv_bytes_per_token(shape))
    prompts = _prompt_tokens(ev)
    prof = load_profiles()["h100"]
    batch = ev.sizer.size(next(model.parameters()).device, "loglikelihood")
    shape_txt = (
        f"{ctx.shape} (random {str(shape.dtype).removeprefix('torch.')} weights, vocab "
        f"{shape.vocab}): {prompts['bele_dev']['items']} Belebele 5-shot prompts (mean "
        f"{prompts['bele_dev']['mean']:.0f} tokens) and {prompts['mgsm_dev']['items']} MGSM "
        f"8-shot prompts (mean {prompts['mgsm_dev']['mean']:.0f}), max_gen_toks "
        f"{sizes['max_gen_toks']}, evaluator batch {batch}, {CANDIDATES} candidates"
    )
    lengths = ", ".join(f"{t} mean {p['mean']:.0f}, max {p['max']}" for t, p in prompts.items())
    notes = [
        f"Items: {shape_txt}. Prompt tokens (world tokenizer): {lengths}; real 5-shot Belebele "
        "prompts are ~2,100 Llama-3 tokens, 8-shot MGSM ~700-900.",
        f"max_gen_toks {sizes['max_gen_toks']} (the shipped config: 256): random weights never "
        "emit a stop string, so every row runs the whole budget, and a shorter one times the "
        "same decoding step for less GPU time.",
        f"Evaluator built once in {built.s:.1f} s (prompts tokenized), not in its per-candidate "
        "time, and timed with its forward hooks on (two syncs a forward: conservative); HFLM's "
        "time includes simple_evaluate building its tasks. " + race.pop("extra_note") + ".",
        *(
            f"HFLM batch {b} ran out of device memory: it does not fit"
            for b in race["out_of_memory"]
        ),
        "Prefill FLOPs count real tokens (no padding) at each token's mean causal context; the "
        "plan's eval_cost uses the whole row (~2 % more at 2,100 tokens). decode bytes/s is over "
        "the decoding forward alone, the overhead is the rest of the step: bytes / bytes/s + "
        "overhead, the plan's step, is then the measured one.",
    ]
    del model
    out = {
        "figures": _speed_figures(race) + _device_figures(ctx, summary, cost, prof),
        "notes": notes, "race": race,
        "summary": summary, "prompt_tokens": prompts, "evaluator_build_s": built.s,
        "stage_s": time.perf_counter() - t_start,
    }  # fmt: skip
    if not ctx.smoke and summary["prefill_flops_per_s"]:
        out["throughput"] = _throughput(summary, cost, shape_txt)
    return out
