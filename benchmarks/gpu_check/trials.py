"""Stage 3 of the GPU check: merge-search trials from two 8B-shaped experts, in both placements,
and what a trial of the shipped search config costs.

Random-weight checkpoints of Llama-3.1-8B's shape (benchmarks/shapes.shape_experts: base, task
and language expert, real 128,256 vocabulary, bf16, drawn on the GPU) are composed into one live
model by layerswap's TrialRunner (search/trial.py), recipe after recipe of the search's default
space (the shipped config's ranges at 32 layers; uniform weighting), and scored on the world's
stand-ins for the shipped config's proxies at its few-shot counts: Belebele (xa dev, multiple
choice, 5-shot) and English MGSM (dev, generation, 8-shot), 20 items each, 32 new tokens. Two
passes, placement forced: experts resident on the device (at the deepest model layerswap's
placement rule admits, `device_depth`), and experts in host memory with the changed tensors
copied per trial (full depth; what layerswap picks at 8B). Per trial: compose / move / score
seconds, the scoring split into multiple choice, prompt prefill and decoding; those rates scale
a trial to the shipped config (spaces/examples/real_llama31_8b_sw_search.yaml: 900 Belebele
items 5-shot, 250 MGSM items 8-shot, 256 new tokens, fidelity screening) by `layerswap plan`'s
rule (study.estimate.eval_cost): trials per GPU-hour, kept and pruned, beside the plan's.
Sized for ~60-90 s on an H100 (an estimate: not yet run on one).

Run: python benchmarks/gpu_check/run.py --stages trials --out DIR [--smoke]
(--smoke: llama-tiny at 4 layers, 4 items, 4 new tokens, 1 + 1 trials per placement, CPU.)
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

from gpu_check.common import ROOT, failure, free, sync
from gpu_check.figures import Figure, per_hour, share
from gpu_check.results import failed_part, trials_throughput
from gpu_check.trial_clock import KindClock, item_flops
from gpu_check.trial_cost import (
    COPIES,
    device_depth,
    first_share,
    pass_rates,
    proxy_seconds,
    rate_profiles,
)
from layerswap.study.estimate import model_cost, task_shape
from layerswap.trainables.devices import is_out_of_memory, says_out_of_memory

TITLE = "Search trials at the 8B shape"
SHIPPED = ROOT / "spaces" / "examples" / "real_llama31_8b_sw_search.yaml"
# Each shipped proxy family's world stand-in, in world_readings' languages (Belebele in the
# target language, MGSM in English: spaces.search_experiment.world_readings).
WORLD_PROXY = {"belebele": "xa", "mgsm": "en"}
# items per proxy (the tiny world has 20 dev items), new tokens, timed trials after the first,
# seconds for the stage; smoke at 4 layers, where the space has a second recipe
SIZES = {
    "gpu": dict(depth=None, limit=20, gen_toks=32, trials=3, budget_s=90.0),
    "smoke": dict(depth=4, limit=4, gen_toks=4, trials=1, budget_s=120.0),
}
PASSES = (("device", "experts on the device"), ("host", "experts in host memory"))


# ------------------------------------------------------------------------------ measuring


def _runner(ctx, cfg, states: dict, tmp: Path, shipped, size: dict):
    """A TrialRunner over `states` ({role: state dict}) served from memory, scoring the world's
    stand-ins of the shipped proxies. Returns (runner, experiment, pool)."""
    from bench_search import _one_pair

    from layerswap.search.trial import TrialRunner
    from layerswap.spaces.search_experiment import Proxy, SearchExperiment
    from layerswap.spaces.search_space import ExpertPool
    from layerswap.spaces.task_families import family, family_of
    from layerswap.trainables.evaluate.tasks import write_world_tasks

    tok, dirs = ctx.tokenizer(), {}
    for role in states:  # config and tokenizer on disk; the weights come from memory
        dirs[role] = tmp / f"{role}-{cfg.num_hidden_layers}"
        cfg.save_pretrained(dirs[role])
        tok.save_pretrained(dirs[role])
    by_path = {str(d): states[r] for r, d in dirs.items()}
    proxies = [Proxy(task=family(f).world_task(WORLD_PROXY[f], "dev"), chance=p.chance, num_fewshot=p.num_fewshot)
               for p in shipped.proxy_list for f in [family_of(p.task).name]]  # fmt: skip
    exp = SearchExperiment.model_validate({
        **_one_pair("gpu-check-trials", ctx.world, dirs), "proxies": [p.model_dump() for p in proxies],
        "proxy_eval": {"limit": size["limit"], "max_gen_toks": size["gen_toks"], "batch_size": "auto"},
        "space": {"weighting": ["uniform"], "expert_kinds": ["full"]},
        "search": {"gpus_per_trial": 1, "torch_threads": shipped.search.torch_threads, "fidelity": {"screen": None}},
    })  # fmt: skip
    pool = ExpertPool.from_paths(exp.task_experts, exp.language_experts, exp.base)
    write_world_tasks(ctx.world, tmp / "tasks")
    runner = TrialRunner(exp, pool, [str(tmp / "tasks")], device=ctx.device, loader=lambda ref: (by_path[ref], set()))  # fmt: skip
    return runner, exp, pool


def run_pass(ctx, runner, exp, pool, keep: bool, trials: int, end: float) -> dict:
    """One placement: the paper default first (every tensor placed; with `keep`, then the rest
    of both experts copied to the device), then up to `trials` other recipes of the space drawn
    with seed 0, fewer once time.monotonic() passes `end`.

    Returns:
        {"auto_placement": what layerswap chose itself, "depth", "rows": one per trial, with
        `keep` "placed": {"s", "move_s"}}, with "does_not_fit": the error, when a trial ran
        out of device memory.
    """
    from bench_search import enumerate_space

    from layerswap.spaces.search_space import decode, warm_start

    live = runner.live
    out = {"auto_placement": live.placement, "depth": live.depth, "rows": []}
    live.keep_on_device = keep  # forced, whatever _place chose (module doc)
    first = warm_start(exp.space, live.depth, pool)
    others = [g for g in enumerate_space(exp.space, live.depth, pool) if g != first] or [first]
    recipes = [first, *random.Random(0).sample(others, min(trials, len(others)))]
    clock = KindClock(runner.parts[0], runner.model, ctx.device)
    for i, params in enumerate(recipes):
        if i > 1 and time.monotonic() > end:
            break
        before, _ = dict(live.loaded), clock.take()
        res = runner.run(decode(params, exp.space, live.depth, pool))
        # "CUDA error: out of memory" (a RuntimeError) too: the fit finding, not a failure
        if res.status != "ok" and says_out_of_memory(res.error or ""):
            return out | {"does_not_fit": res.error.splitlines()[0]}
        if res.status != "ok":
            raise RuntimeError(f"trial {i} failed: {res.error}")
        swapped = sum(p.numel() * p.element_size() for n, p in live.params.items() if live.loaded.get(n) != before.get(n))  # fmt: skip
        out["rows"].append({
            "first": i == 0, "recipe": params, "compose_s": res.t_compose_s - res.t_move_s,
            "move_s": res.t_move_s, "score_s": res.t_eval_s, "total_s": res.t_total_s,
            "moved": res.moved, "moved_bytes": swapped, **clock.take(),
        })  # fmt: skip
        if keep and i == 0:  # the rest of both experts, once: later trials then move nothing
            t0, moving = time.perf_counter(), live.t_move_s
            for ref in (pool.task[0].path, pool.language[0].path):
                for name in runner.cache.states[ref]:
                    live.tensor(ref, name)
            sync(ctx.device)
            out["placed"] = {"s": time.perf_counter() - t0, "move_s": live.t_move_s - moving}
    return out


def _pass_depths(ctx, states: dict, depth: int) -> dict:
    """{"device": `device_depth` on this GPU (the full depth on a CPU), "host": `depth`}."""
    import torch
    from shapes import _layer

    from layerswap.trainables.merge.live import EVAL_HEADROOM

    if ctx.device != "cuda":
        return {"device": depth, "host": depth}
    nbytes = {n: t.numel() * t.element_size() for n, t in states["base"].items()}
    layer = sum(b for n, b in nbytes.items() if _layer(n) == 0)
    other = sum(b for n, b in nbytes.items() if _layer(n) is None)
    return {"device": device_depth(layer, other, depth, torch.cuda.mem_get_info()[1], EVAL_HEADROOM), "host": depth}  # fmt: skip


def measure(ctx, size: dict, shipped, on_pass=None) -> dict:
    """Make the checkpoints, then run both placements (module doc); `on_pass(out so far)`
    after each.

    Returns:
        {"made_s", "depth", "passes": {key: run_pass's dict + "flops" of one trial's items and
        the pass model's "weight_bytes"}}.
    """
    import torch
    from shapes import shape_experts

    end = time.monotonic() + min(size["budget_s"], ctx.remaining())
    cfg = ctx.config(depth=size["depth"])
    t0 = time.perf_counter()
    states = shape_experts(cfg, make_on=ctx.device)
    full = cfg.num_hidden_layers
    out = {"made_s": time.perf_counter() - t0, "depth": full, "passes": {}}
    depths = _pass_depths(ctx, states, full)
    threads = torch.get_num_threads()  # TrialRunner sets the config's; later stages keep theirs
    try:
        with tempfile.TemporaryDirectory(prefix="gc-trials-") as tmp:
            for i, (key, _) in enumerate(PASSES):
                d = depths[key]
                if d == 0:
                    out["passes"][key] = {"depth": 0, "rows": [], "does_not_fit": "not one layer fits layerswap's placement rule"}  # fmt: skip
                    continue
                pass_end = time.monotonic() + (end - time.monotonic()) / (len(PASSES) - i)
                out["passes"][key] = _guarded_pass(ctx, key, d, states, Path(tmp), shipped, size, pass_end)  # fmt: skip
                free(ctx.device)  # out of the pass's frames: its model and experts are gone
                if on_pass is not None:
                    on_pass(out)
    finally:
        torch.set_num_threads(threads)
    return out


def _guarded_pass(ctx, key: str, d: int, states: dict, tmp: Path, shipped, size: dict, end: float) -> dict:  # fmt: skip
    """One placement's `_one_pass`; a failure is that pass's finding, and the other still runs
    (the one GPU shot must not lose the host pass to the device pass). Out of memory (however
    CUDA says it, e.g. while the rest of both experts is copied) is "does_not_fit"; any other
    error "failed", which run() sets as a missed target."""
    try:
        return _one_pass(ctx, key, d, states, tmp, shipped, size, end)
    except Exception as e:  # recorded, the traceback's last lines kept
        what = "does_not_fit" if is_out_of_memory(e) else "failed"
        text, tb = failure(e)
        return {"depth": d, "rows": [], what: text, "traceback": tb}


def _one_pass(ctx, key: str, d: int, states: dict, tmp: Path, shipped, size: dict, end: float) -> dict:  # fmt: skip
    """The first `d` layers of `states` (tensors shared, nothing copied) composed and scored
    in placement `key` until `end`: run_pass's dict + "flops" and "weight_bytes"."""
    from lm_eval.models.utils import resolve_max_length
    from shapes import _layer

    from layerswap.trainables.train.model_shape import model_shape

    cfg_d = ctx.config(depth=d)
    cfg_d.dtype = "bfloat16"
    sub = {r: {n: t for n, t in s.items() if (_layer(n) or 0) < d} for r, s in states.items()}
    runner, exp, pool = _runner(ctx, cfg_d, sub, tmp, shipped, size)
    res = run_pass(ctx, runner, exp, pool, key == "device", size["trials"], end)
    cost = model_cost(model_shape(cfg_d))
    max_length = resolve_max_length(runner.model.config, runner.tokenizer, default=2048)
    return res | {"flops": item_flops(runner.parts[0], cost, max_length), "weight_bytes": cost.weight_bytes}  # fmt: skip


# ------------------------------------------------------------------------------ the report


def swap_scale(full: int, depth: int) -> float:
    """What a pass's compose and move seconds are multiplied by to stand for `full` layers: the
    search space is in fractions of depth, so at `depth` of `full` layers a recipe swaps about
    depth/full as many layers (and tensors) as at full depth."""
    return full / depth if 0 < depth < full else 1.0


def shipped_trial(p: dict, cost, tasks, shipped, batch: int, scale: float = 1.0) -> dict:
    """A pass scaled to a trial of the shipped config: median compose and move (x `scale`,
    `swap_scale`), the scoring's other Python (unscaled), plus the proxies at the pass's rates
    (`proxy_seconds`)."""
    timed = [r for r in p["rows"] if not r["first"]]
    rates = pass_rates(timed, *p["flops"], cost.weight_bytes / p["weight_bytes"])
    pe = shipped.proxy_eval
    sc = proxy_seconds(rate_profiles(**rates), cost, tasks, limit=pe.limit, gen_toks=pe.max_gen_toks,
                       batch=batch, screen=first_share(shipped))  # fmt: skip
    med = {k: statistics.median(r[k] for r in timed) for k in ("compose_s", "move_s", "score_s")}
    med["compose_s"], med["move_s"] = med["compose_s"] * scale, med["move_s"] * scale
    other = statistics.median(r["score_s"] - r["mc_s"] - r["gen_s"] for r in timed)
    rows = sum(r["step_rows"] for r in timed) / max(1, sum(r["steps"] for r in timed))
    fixed = med["compose_s"] + med["move_s"] + other
    out = {"rates": rates, "median": med, "other_s": other, "step_rows": rows, "swap_scale": scale}
    return out | {k: sc[k] | {"total_s": fixed + sum(sc[k].values())} for k in ("kept", "pruned")}


def _pass_figures(label: str, p: dict, s: dict, assumed: dict, size: dict) -> list[Figure]:
    """compose / move / score seconds and the shipped config's trials per hour of one placement."""
    timed = [r for r in p["rows"] if not r["first"]]
    how = f"median of {len(timed)} trial(s) after the first, {p['depth']} layers"
    gib = statistics.median(r["moved_bytes"] for r in timed) / 2**30
    moved = statistics.median(r["moved"] for r in timed)
    med, kept, pruned = s["median"], s["kept"]["total_s"], s["pruned"]["total_s"]
    x = f", x {s['swap_scale']:.3g} for the full depth (swap_scale)" if s.get("swap_scale", 1.0) != 1.0 else ""  # fmt: skip
    a = assumed  # None: no profile for this GPU
    world = f"world stand-ins: {size['limit']} Belebele items 5-shot + {size['limit']} MGSM items 8-shot x {size['gen_toks']} new tokens"  # fmt: skip
    rows = [
        ("compose s per trial", med["compose_s"], "s", None, f"{how}{x}; {moved:g} tensors ({gib:.2f} GiB) swapped in; the move excluded"),
        ("move s per trial", med["move_s"], "s", None, f"{how}{x}; expert tensors copied to the device (LiveModel.t_move_s)"),
        ("score s per trial", med["score_s"], "s", None, f"{how}; {world}"),
        ("shipped-config trials per GPU-hour, every trial kept", per_hour(kept), "trials/h", per_hour(a["kept"]) if a else None, "measured compose + move; proxies at the measured rates by the plan's rule"),
        ("shipped-config trials per GPU-hour, every trial stopped at its first rung", per_hour(pruned), "trials/h", per_hour(a["pruned"]) if a else None, "the first rung's items only (search.fidelity)"),
        ("share of a kept shipped-config trial spent scoring", share(kept - med["compose_s"] - med["move_s"], kept), "share", share(a["kept"] - a["compose"], a["kept"]) if a else None, ""),
    ]  # fmt: skip
    return [Figure(f"{n} ({label})", v, u, assumed=a, note=note) for n, v, u, a, note in rows]


def _rate_figures(s: dict, prof, cost, size: dict) -> list[Figure]:
    """The measured scoring rates beside the GPU's profile's assumptions (none without one)."""
    r, pre = s["rates"], prof.prefill_flops_per_s.value if prof else None
    step = (
        cost.weight_bytes / prof.decode_bytes_per_s.value + prof.decode_step_overhead_s.value
        if prof
        else None
    )
    return [
        Figure("multiple-choice scoring FLOP/s", r["mc_flops_per_s"], "FLOP/s", assumed=pre, note=f"{size['limit']} world Belebele 5-shot rows; FLOPs by the plan's rule"),
        Figure("generation prefill FLOP/s", r["prefill_flops_per_s"], "FLOP/s", assumed=pre, note=f"{size['limit']} world MGSM 8-shot prompts"),
        Figure(f"decoding step s ({s['step_rows']:.0f} rows)", r["step_s"], "s", assumed=step, note="generation less prefill, per step; assumed: weight bytes / decode_bytes_per_s + decode_step_overhead_s"),
    ]  # fmt: skip


def _notes(m: dict, size: dict, shipped, tasks, batch: int, scaled: dict) -> list[str]:
    """How the figures were made and scaled, in words with numbers."""
    pe, fid = shipped.proxy_eval, shipped.search.fidelity
    dev, full = m["passes"].get("device", {"depth": 0}), m["depth"]
    top = shipped.experts.top_k if shipped.experts else len(shipped.task_experts)
    shapes = "; ".join(f"{p.task}: {t.items} items of {t.prompt_tokens:g} + {k} x {t.shot_tokens:g} tokens" for p, (t, k) in zip(shipped.proxy_list, tasks, strict=True))  # fmt: skip
    notes = [
        f"Checkpoints made in {m['made_s']:.1f} s ({full} layers). The shipped `expert_store: node` "
        "(search/expert_store.node_loader) needs Ray (its actors, the object store), which this stage does not "
        "start: the experts come from an in-memory loader, host tensors like the store's shared-memory views.",
        f"Shipped config: limit {pe.limit}, max_gen_toks {pe.max_gen_toks}, screen {fid.screen}; scaled by "
        f"study.estimate.eval_cost with the plan's task shapes ({shapes}; ceil(items / {batch}) batches, each "
        "decoding to its stop strings as the plan counts, study.estimate.decode_steps) at each pass's measured multiple-choice FLOP/s, prefill FLOP/s and seconds per decoding "
        "step, plus its measured compose, move and other scoring Python (unscaled).",
        f"Kept: every item scored (the screened {fid.screen:g}, then the rest); pruned: the screened items only; a search lies "
        f"between (its first keep_top={fid.keep_top} trials are kept). Not counted, here or in the assumed figures: "
        "Tune's per-trial overhead (trial_overhead_s); not run: magnitude weighting's one-off MAV pass over the "
        f"experts on the host, and expert-pair changes (one pair here; the shipped {top} x {top} pool swaps most tensors "
        "when the pair changes).",
        f"Random weights never hit a stop string: every MGSM row decodes all {size['gen_toks']} tokens here; the "
        f"scaling counts real answers' steps (the plan's rule; {pe.max_gen_toks} is its upper bound). The world's prompts are short and its rows "
        f"{size['limit']} a pass, so the rates come from smaller forwards than the shipped config's long rows, {batch} a pass.",
    ]
    for key, label in PASSES:
        p, s = m["passes"].get(key), scaled.get(key)
        if p is None:
            notes.append(f"{label}: not run (the stage ended before it).")
            continue
        if s is None:
            why = f"does not fit ({p['does_not_fit']})" if p.get("does_not_fit") else f"FAILED ({p['failed']})"  # fmt: skip
            notes.append(f"{label}: {why}; not measured.")
            continue
        k, placed = s["kept"], p.get("placed", {})
        if placed.get("move_s"):  # on a CPU the experts are the model's tensors already
            notes.append(f"{label}: after the first trial, the rest of both experts went to the device once "
                         f"({placed['s']:.1f} s, {placed['move_s']:.1f} s of it copying), so its timed trials move nothing.")  # fmt: skip
        notes.append(f"{label}: forced at {p['depth']} layers (layerswap's own choice: '{p['auto_placement']}'). "
                     f"A kept shipped-config trial: {k['total_s']:.1f} s = compose {s['median']['compose_s']:.2f} + move "
                     f"{s['median']['move_s']:.2f} + multiple choice {k['mc']:.1f} + MGSM prefill {k['prefill']:.1f} + "
                     f"decoding {k['decode']:.1f} + other {s['other_s']:.2f}.")  # fmt: skip
    if 0 < dev["depth"] < full:
        notes.append(f"Experts on the device at {dev['depth']} of {full} layers: LiveModel._place's rule (model + "
                     f"{COPIES} whole checkpoints <= GPU x 0.7) admits no more. Its FLOP rates carry to {full} layers' "
                     f"FLOPs as they are, its decoding step is scaled by weight bytes ({full}- / {dev['depth']}-layer); "
                     f"its compose and move by {full}/{dev['depth']}: the space is in fractions of depth, so at "
                     f"{dev['depth']} layers a recipe swaps ~{dev['depth']}/{full} as many layers as at {full}.")  # fmt: skip
    return notes


def run(ctx) -> dict:
    from layerswap.spaces.search_experiment import load_search_experiment

    size = SIZES["smoke" if ctx.smoke else "gpu"]
    shipped = load_search_experiment(SHIPPED)

    def keep(m: dict) -> None:  # a finished placement outlives the next one
        ctx.keep(f"{' and '.join(m['passes'])} pass", lambda: _result(ctx, m, size, shipped))

    return _result(ctx, measure(ctx, size, shipped, keep), size, shipped)


def _result(ctx, m: dict, size: dict, shipped) -> dict:
    """The stage's result from `measure`'s dict (the passes run so far, or all)."""
    from layerswap.study.estimate import auto_batch
    from layerswap.trainables.train.model_shape import model_shape

    cfg = ctx.config(depth=size["depth"])
    cfg.dtype = "bfloat16"
    cost, prof, pe = (
        model_cost(model_shape(cfg)),
        ctx.assumed,
        shipped.proxy_eval,
    )  # prof: the GPU's own
    batch = auto_batch("cuda") if pe.batch_size == "auto" else pe.batch_size
    tasks = [(task_shape(p.task, {}), p.num_fewshot) for p in shipped.proxy_list]
    assumed = None
    if prof is not None:
        plan = proxy_seconds({"mc": prof, "gen": prof}, cost, tasks, limit=pe.limit, gen_toks=pe.max_gen_toks,
                             batch=batch, screen=first_share(shipped))  # fmt: skip
        compose = cost.weight_bytes / prof.merge_bytes_per_s.value  # the plan: the whole model
        assumed = {"compose": compose} | {k: compose + sum(v.values()) for k, v in plan.items()}
    figures, scaled = [], {}
    for key, label in PASSES:
        p = m["passes"].get(key)
        if p is None:  # not run yet (a part kept before it: ctx.keep)
            continue
        if p.get("failed"):
            figures.append(failed_part(f"trials pass finished ({label})", p["failed"]))  # fmt: skip
            continue
        if p.get("does_not_fit"):
            figures.append(Figure(f"shipped-config trials per GPU-hour, every trial kept ({label})", None,
                                  "trials/h", assumed=per_hour(assumed["kept"]) if assumed else None, note="does not fit"))  # fmt: skip
            continue
        scale = swap_scale(m["depth"], p["depth"])  # the device pass may hold fewer layers
        scaled[key] = shipped_trial(p, cost, tasks, shipped, batch, scale)
        figures += _pass_figures(label, p, scaled[key], assumed, size)
    if "host" in scaled:
        figures += _rate_figures(scaled["host"], prof, cost, size)
    res = {"figures": figures, "notes": _notes(m, size, shipped, tasks, batch, scaled), "measured": m,
           "shipped": scaled, "assumed": assumed}  # fmt: skip
    if not ctx.smoke and "host" in scaled:
        res["throughput"] = trials_throughput(ctx, m["passes"]["host"])
    return res
