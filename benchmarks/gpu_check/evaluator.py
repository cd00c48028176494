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

import logging
import statistics
import time
from pathlib import Path

import bench_eval  # benchmarks/: the race's helpers; it puts the fixture folder on sys.path

from gpu_check.common import Timer, free, sync
from gpu_check.figures import Figure, Target, decode_bound_s, peak_share, share, speedup
from gpu_check.items import SHOTS, write_tasks
from gpu_check.results import evaluator_notes, evaluator_throughput
from gpu_check.timing import ForwardLog, summarize
from layerswap.trainables.evaluate.fit import kv_bytes_per_token

TITLE = "Evaluator vs lm-eval HFLM at the 8B shape"

TASKS = bench_eval.TASKS  # ["mgsm_dev", "bele_dev"]: bench_eval's prediction readers know them
# Prompt lengths of the real tasks in Llama-3 tokens: Belebele eng_Latn 5-shot ~2,100, MGSM
# en 8-shot ~700-900. Under smoke the tiny model's window is 256 positions.
# stage_s: the stage's share of the check's time (the batch-8 extra is timed only within it).
FULL = dict(n_bele=16, n_mgsm=8, bele_tokens=2100, mgsm_tokens=800, max_gen_toks=64, stage_s=90.0)
SMOKE = dict(n_bele=4, n_mgsm=4, bele_tokens=200, mgsm_tokens=240, max_gen_toks=8, stage_s=20.0)
# The tasks whose predictions are a multiple-choice argmax (bench_eval._hflm_predictions reads
# them so): the agreement target applies to these; the others generate (greedy_generate).
MULTIPLE_CHOICE = ("bele_dev",)
AGREEMENT_TARGET = 0.01  # at most this share of multiple-choice predictions differ from HFLM's
HFLM_BATCHES = (1, 32)  # batch 1 is the reference the predictions are compared with
EXTRA_BATCH = 8  # timed too when the stage's time allows
CANDIDATES = 2


def diff_share(mine: dict, ref: dict) -> tuple[int, int]:
    """(items whose prediction in `mine` differs from `ref`, items in `ref`)."""
    return sum(mine.get(k) != v for k, v in ref.items()), len(ref)


def diff_by_task(mine: dict, ref: dict) -> dict[str, list[int]]:
    """`diff_share` per task (keys are (task, doc_id)): {task: [differ, items]}.

    Kept apart because the two kinds fail differently on random weights: a multiple-choice
    argmax over close log-likelihoods, and greedy generation, where one bf16 rounding
    difference (our left-padded batch against HFLM's unpadded row) changes every later token.
    """
    out: dict[str, list[int]] = {}
    for (task, doc), v in ref.items():
        d, n = out.setdefault(task, [0, 0]), mine.get((task, doc)) != v
        d[0], d[1] = d[0] + n, d[1] + 1
    return out


def best_batch(times: dict[int, list[float]]) -> int:
    """The batch size with the lowest median seconds."""
    return min(times, key=lambda b: statistics.median(times[b]))


# ------------------------------------------------------------------------------ the race


def _model(ctx, tok):
    """The run's shape, random weights, built directly on the device (bf16 on a GPU), its
    predictions kept inside the tokenizer's vocabulary (`in_tokenizer_vocab`)."""
    import torch
    from transformers import LlamaForCausalLM

    dtype = torch.bfloat16 if ctx.device == "cuda" else torch.float32
    cfg = ctx.config()
    cfg.dtype = dtype  # model_cost counts the weight bytes in the config's dtype
    with torch.device(ctx.device):
        model = LlamaForCausalLM._from_config(cfg, dtype=dtype)
    in_tokenizer_vocab(model, len(tok))
    return model.eval(), cfg


def in_tokenizer_vocab(model, n: int) -> None:
    """Zero the lm_head rows of ids >= `n`, so random weights predict ids the tokenizer has.

    Why: at the 8B shape the model has Llama-3's 128,256 ids and the world tokenizer a few
    hundred; random weights then pick an id the tokenizer lacks nearly every step, every
    generated text decodes to "", and both contenders "agree" on every MGSM item (the check
    would pass blind), while no stop string can ever be seen. With those rows zero their
    logits are 0 and the largest of the tokenizer's random logits wins. The lm_head stays
    whole, so every FLOP and byte of the real vocabulary is still spent.
    """
    import torch

    head = model.get_output_embeddings().weight
    if head.shape[0] > n:
        with torch.no_grad():
            head[n:].zero_()


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

    from layerswap.trainables.devices import is_out_of_memory

    try:
        return run_hflm(b)
    except (RuntimeError, torch.OutOfMemoryError) as e:
        if b == HFLM_BATCHES[0] or not is_out_of_memory(e):  # no reference without batch 1
            raise
    free(ctx.device)  # out of the except block: the traceback's tensors are gone
    return None


def _candidate_s(ours: list[float], theirs: dict[int, list[float]]) -> float:
    """Seconds one more candidate would take: the first candidate's, by every contender."""
    return ours[0] + sum(ts[0] for ts in theirs.values() if ts)


def _race(ctx, model, tok, ev, tm, sizes: dict, t_start: float, on_candidate=lambda race, done: None) -> dict:  # fmt: skip
    """Each candidate by the evaluator (forwards logged), then by HFLM at each batch size;
    `on_candidate(race so far, candidates done)` after each (and after the batch-8 extra)."""
    gen = {"max_gen_toks": sizes["max_gen_toks"]}
    ours, logs, theirs, no_fit = [], [], {b: [] for b in HFLM_BATCHES}, []
    differ = total = 0
    by_task: dict[str, list[int]] = {}
    extra = f"HFLM batch {EXTRA_BATCH} not timed: the stage's time would not allow it"

    def run_hflm(b: int):
        return _hflm(model, tok, tm, b, gen, ctx.device)

    def state() -> dict:
        return {
            "ours": list(ours), "theirs": {b: list(ts) for b, ts in theirs.items()},
            "logs": list(logs), "differ": differ, "total": total,
            "differ_by_task": {t: list(v) for t, v in by_task.items()}, "extra_note": extra,
            "out_of_memory": list(no_fit),
        }  # fmt: skip

    for i in range(CANDIDATES):
        if i and (need := _candidate_s(ours, theirs)) > ctx.remaining():
            extra += f"; candidate {i + 1} not scored (~{need:.0f} s, {ctx.remaining():.0f} s of the check left)"  # fmt: skip
            break
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
                preds = bench_eval._predictions(res)
                d, n = diff_share(preds, got[1])
                differ, total = differ + d, total + n
                for task, (td, tn) in diff_by_task(preds, got[1]).items():
                    acc = by_task.setdefault(task, [0, 0])
                    acc[0], acc[1] = acc[0] + td, acc[1] + tn
        on_candidate(state(), i + 1)
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
                on_candidate(state(), i + 1)
    return state()


def _prompt_tokens(ev) -> dict:
    """Mean and max prompt tokens (few-shot examples included) per task, as the evaluator
    tokenized them."""
    out = {}
    for name, c in ev.tasks.items():
        lens = [len(it.ctx_ids) for it in c.items]
        out[name] = {"mean": statistics.fmean(lens), "max": max(lens), "items": len(lens)}
    return out


# ------------------------------------------------------------------------------ figures


def _agreement_figures(race: dict, n: int) -> list[Figure]:
    """Predictions differing from HFLM batch 1: the multiple-choice ones pooled, against the
    target; each generation task's alone, with none (why: in its note).

    Args:
        race: `_race`'s dict (its "differ_by_task": {task: [differ, items]}).
        n: candidates scored.
    """
    by_task = sorted(race.get("differ_by_task", {}).items())
    mc = [(d, t) for task, (d, t) in by_task if task in MULTIPLE_CHOICE]
    d, t = sum(d for d, _ in mc), sum(t for _, t in mc)
    figs = [
        Figure(
            "share of multiple-choice predictions differing from HFLM batch 1", share(d, t),
            "share", Target("<=", AGREEMENT_TARGET),
            note=f"{d} of {t} items ({', '.join(MULTIPLE_CHOICE)}) over {n} candidates",
        ),
    ]  # fmt: skip
    for task, (d, t) in by_task:
        if task in MULTIPLE_CHOICE:
            continue
        figs.append(Figure(
            f"share of {task} generations differing from HFLM batch 1", share(d, t), "share",
            note=f"{d} of {t} items over {n} candidates; no target: greedy decoding of random "
            "weights (bf16 on a GPU), where one rounding difference between our left-padded batch and "
            "HFLM's unpadded row changes every later token, so one item differing is "
            f"{share(1, t) or 0:.1%} here without any fault in the evaluator",
        ))  # fmt: skip
    return figs


def _speed_figures(race: dict) -> list[Figure]:
    """Seconds per candidate of each contender, the speed-ups, and the predictions that differ
    (`_agreement_figures`)."""
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
    return [
        *figs,
        Figure(
            f"evaluator speed-up vs HFLM at its best batch ({best})",
            speedup(theirs[best], ours), "x", Target(">=", 2.0), note=set_up,
        ),
        Figure("evaluator speed-up vs HFLM batch 1", speedup(theirs[1], ours), "x"),
        *_agreement_figures(race, n),
    ]  # fmt: skip


def _device_figures(ctx, s: dict, cost, prof) -> list[Figure]:
    """Prefill FLOP/s and decoding steps of the evaluator, against the GPU and the profile."""
    flops, step, fwd = s["prefill_flops_per_s"], s["decode_step_s"], s["decode_forward_s"]
    executed = s["prefill_executed_flops_per_s"]
    bound = decode_bound_s(s["decode_step_bytes"], ctx.bandwidth) if step else None
    plan_step = (
        cost.weight_bytes / prof.decode_bytes_per_s.value + prof.decode_step_overhead_s.value
        if prof
        else None
    )
    assumed = {k: getattr(prof, k).value if prof else None for k in ("prefill_flops_per_s", "decode_bytes_per_s", "decode_step_overhead_s")}  # fmt: skip
    cpu = "" if ctx.peak_flops else "; no GPU datasheet figure: not computed"
    mfu = peak_share(executed, ctx.peak_flops) if executed else None
    gap = share(s["prefill_flops"] - s["prefill_executed_flops"], s["prefill_flops"]) or 0.0
    steps = f"mean of {s['decode_steps']} steps of {s['decode_rows'] or 0:.1f} rows"
    return [
        Figure(
            "evaluator prefill FLOP/s", flops, "FLOP/s", assumed=assumed["prefill_flops_per_s"],
            note=f"{s['prefill_tokens']} tokens in {s['prefill_calls']} forwards, plan's rule",
        ),
        Figure(
            "evaluator prefill share of bf16 peak", mfu, "share", Target(">=", 0.5),
            note=f"FLOPs executed (lm_head on the logits_to_keep positions only: {gap:.1%} fewer than the plan's rule) / datasheet dense bf16 peak" + cpu,
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
            cost.weight_bytes / fwd if fwd else None, "B/s", assumed=assumed["decode_bytes_per_s"],
        ),
        Figure(
            "decode step overhead (whole step - forward)", max(step - fwd, 1e-4) if step else None,
            "s", assumed=assumed["decode_step_overhead_s"], note="the loop's host work per step",
        ),
    ]  # fmt: skip


# ------------------------------------------------------------------------------ the stage


def run(ctx) -> dict:
    """The stage (see the module docstring): its figures, notes and raw numbers; each scored
    candidate is kept (ctx.keep) as it finishes, so a cut during the next keeps it."""
    import tempfile

    from layerswap.trainables.evaluate.lm_eval_api import task_manager
    from layerswap.trainables.evaluate.proxy import ProxyEvaluator

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    t_start = time.perf_counter()
    sizes = SMOKE if ctx.smoke else FULL
    tok = ctx.tokenizer()
    with tempfile.TemporaryDirectory(prefix="gc-evaluator-") as tmp:
        root = write_tasks(Path(tmp), tok, sizes)
        model, cfg = _model(ctx, tok)
        with Timer(ctx.device) as built:
            ev = ProxyEvaluator(
                TASKS, tok, include_path=str(root), num_fewshot=SHOTS,
                gen_kwargs={"max_gen_toks": sizes["max_gen_toks"]}, batch_size="auto",
            )  # fmt: skip
        tm = task_manager(TASKS, root)
        _warm_up(model, ctx.device)
        where = {"cfg": cfg, "tok": tok, "ev": ev, "sizes": sizes, "device": next(model.parameters()).device,
                 "built_s": built.s, "t_start": t_start}  # fmt: skip

        def keep(race: dict, done: int) -> None:
            ctx.keep(f"candidate {done}", lambda: _result(ctx, race, **where))

        race = _race(ctx, model, tok, ev, tm, sizes, t_start, keep)
    del model
    return _result(ctx, race, **where)


def _result(ctx, race: dict, cfg, tok, ev, sizes: dict, device, built_s: float, t_start: float) -> dict:  # fmt: skip
    """The stage's result from `race` (`_race`'s dict, so far or whole; not changed)."""
    from layerswap.study.estimate import model_cost
    from layerswap.trainables.train.model_shape import model_shape

    shape = model_shape(cfg)
    cost = model_cost(shape)
    head = shape.linears.get("lm_head", (0, 0))
    summary = summarize(race["logs"], cost, kv_bytes_per_token(shape, shape.dtype.itemsize), head[0] * head[1])  # fmt: skip
    raw = {k: v for k, v in race.items() if k not in ("logs", "extra_note")}
    prompts = _prompt_tokens(ev)
    prof = ctx.assumed  # the GPU's own profile (run.py: throughput.assumed_profile)
    batch = ev.sizer.size(device, "loglikelihood")
    shape_txt = (
        f"{ctx.shape} (random {str(shape.dtype).removeprefix('torch.')} weights, vocab "
        f"{shape.vocab}): {prompts['bele_dev']['items']} Belebele 5-shot prompts (mean "
        f"{prompts['bele_dev']['mean']:.0f} tokens) and {prompts['mgsm_dev']['items']} MGSM "
        f"8-shot prompts (mean {prompts['mgsm_dev']['mean']:.0f}), max_gen_toks "
        f"{sizes['max_gen_toks']}, evaluator batch {batch}, {len(race['ours'])} candidates"
    )
    notes = evaluator_notes(shape_txt, prompts, sizes["max_gen_toks"], shape.vocab, len(tok), built_s, race)  # fmt: skip
    out = {
        "figures": _speed_figures(raw) + _device_figures(ctx, summary, cost, prof),
        "notes": notes, "race": raw,
        "summary": summary, "prompt_tokens": prompts, "evaluator_build_s": built_s,
        "stage_s": time.perf_counter() - t_start,
    }  # fmt: skip
    if not ctx.smoke and summary["prefill_flops_per_s"]:
        out["throughput"] = evaluator_throughput(summary, cost, shape_txt)
    return out
