"""Stage 4 of the GPU check: bf16-mixed full SFT at 8B width, through the trainer's own step.

A random-weight model of Llama-3.1-8B's width with 4 decoder layers (real 128,256 vocabulary:
1.9 B parameters, whose fp32 masters, gradients and AdamW moments take ~31 GB) trains in full
under the bf16-mixed policy, once at LR 1e-7 and once at LR 1e-5, with
benchmarks/bench_train_step.py's functions (the loop's `_prepare_model`, `_adamw`,
`_train_step`): micro-batch 4 x 1024 tokens, 1 warmup + 3 timed steps per LR. Per LR it reports
tokens/s, MFU (6N + attention, no recompute) and HFU (recompute of the decoder layers counted), the peak CUDA memory against the
trainer's memory plan (`layerswap train --plan`) for the same shape, and the share of fp32
master weights, and of the weights as a checkpoint saves them (Policy.save), that the steps
changed. The peak is max_memory_reserved (what the caching allocator held: what decides an
out-of-memory), its figure |plan - peak| / peak; the masters are copied to the host before the
steps (a device copy would count in the peak) and compared element by element after. Then it wraps a fresh model with FSDP2 (strategy fsdp, 1-process group) and records
the wrap's peak against one shard plus one decoder layer in fp32. Sized for under a minute on
an H100 (not yet run on one; run.py gives the stage 45 s at least).

Run: python benchmarks/gpu_check/run.py --stages training --out DIR [--smoke]
(--smoke: llama-tiny, micro-batch 1 x 16 tokens, 1 + 1 steps, on the CPU.)
"""

from __future__ import annotations

import os
import threading
from argparse import Namespace

import bench_train_step as bts
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from gpu_check.common import GIB, Timer, failure, free
from gpu_check.figures import Figure, Target, peak_share, relative_error, share
from gpu_check.results import failed_part, training_result, training_throughput
from layerswap.study.estimate import model_cost, train_flops
from layerswap.trainables.train.model_shape import model_shape
from layerswap.trainables.train.precision import resolve_precision
from layerswap.trainables.train.run_setup import _prepare_model
from layerswap.trainables.train.strategies import pick

TITLE = "bf16-mixed training at 8B width"
LRS = (1e-7, 1e-5)
DEPTH = 4  # decoder layers at 8B width: the fp32 state fits one H100, and the steps the budget
MASTER_MOVED_MIN = 0.15  # share of fp32 masters that must move at LR 1e-7 (the target)
PLAN_ERROR_MAX = 0.10  # |plan - measured peak| / measured peak
WRAP_MAX = 1.2  # FSDP2 wrap peak / (one shard + one decoder layer), issue 40 item 3


# ------------------------------------------------------------------------------ arithmetic


def flops_per_token(cfg, exp) -> float:
    """Training FLOPs of one token of `exp` on `cfg`, by `layerswap plan`'s own rule.

    Args:
        cfg: the model's config.
        exp: the TrainExperiment (mode, seq_len, gradient checkpointing).
    Returns:
        train_flops(model_cost(model_shape(cfg), exp), seq_len, checkpointing).
    """
    h = exp.hyper
    return train_flops(model_cost(model_shape(cfg), exp), h.seq_len, h.gradient_checkpointing)


def utilisation_flops(cfg, exp) -> dict[str, float]:
    """FLOPs of one training token by the two usual definitions (PaLM, App. B).

    Returns:
        {"model": MFU's, train_flops without recompute: 6N + the plan's attention term (causal:
         half of PaLM's 12·L·H·Q·T, which counts the full square);
         "hardware": HFU's, "model" plus what Hugging Face gradient checkpointing recomputes:
         the decoder layers' forward, not the lm_head; the plan's rule, train_flops}.
    """
    h = exp.hyper
    c = model_cost(model_shape(cfg), exp)
    return {
        "model": train_flops(c, h.seq_len, False),
        "hardware": train_flops(c, h.seq_len, h.gradient_checkpointing),
    }


def mfu(tokens_per_s: float, per_token: float, peak_flops: float | None) -> float | None:
    """A FLOPs utilisation: tokens/s x FLOPs per token / the device's peak (None without one)."""
    return peak_share(tokens_per_s * per_token, peak_flops)


def moved_elements(before: torch.Tensor, after: torch.Tensor, dtype: torch.dtype | None = None) -> int:  # fmt: skip
    """How many elements of `after` differ from `before` (both cast to `dtype` first, if given).

    Exact comparison: a change that rounds away in `dtype` does not count.
    """
    before = before.to(after.device)
    if dtype is not None:
        before, after = before.to(dtype), after.to(dtype)
    return int(torch.ne(before, after).sum())


def moved_counts(snapshot: dict[str, torch.Tensor], named: list[tuple[str, torch.Tensor]], save: torch.dtype) -> dict:  # fmt: skip
    """Elements of the parameters `named` that moved from `snapshot`, as kept and as saved.

    Args:
        snapshot: name -> the parameter before the steps (any device).
        named: (name, parameter) after the steps.
        save: the dtype a checkpoint writes the weights in.
    Returns:
        {"elements", "master_moved", "saved_moved"}.
    """
    out = {"elements": 0, "master_moved": 0, "saved_moved": 0}
    with torch.no_grad():
        for name, p in named:
            out["elements"] += p.numel()
            out["master_moved"] += moved_elements(snapshot[name], p.detach())
            out["saved_moved"] += moved_elements(snapshot[name], p.detach(), save)
    return out


def shard_plus_layer_bytes(trainable: int, layer: int, world: int, itemsize: int) -> int:
    """What an FSDP wrap should need on a device at most: its shard of the trainable weights plus
    one unsharded decoder layer, both in the master dtype (`itemsize` bytes an element)."""
    return -(-trainable // world) * itemsize + layer * itemsize


# ------------------------------------------------------------------------------ measuring


def _args(ctx) -> Namespace:
    """What bench_train_step's functions read from its command line, at the check's shape."""
    micro, seq, steps = (1, 16, 1) if ctx.smoke else (4, 1024, 3)
    return Namespace(micro_batch=micro, seq_len=seq, accumulate=1, warmup=1, steps=steps,
                     gradient_checkpointing=True, precision="bf16-mixed")  # fmt: skip


def _train_at(ctx, args, cfg, device, lr: float) -> dict:
    """A fresh model trained `args.warmup + args.steps` steps at `lr`; what was measured."""
    exp = bts._experiment(args, "ddp", False, device.type == "cuda", lr=lr)
    run, params = bts._setup(args, exp, cfg, device)
    masters = [(n, p) for n, p in run.prep.model.named_parameters() if p.requires_grad]
    # On the host: a device copy (7.7 GB at 8B width) would count in the peak measured below.
    with Timer(ctx.device) as snap_t:
        snapshot = {n: p.detach().to("cpu", copy=True) for n, p in masters}
    res = bts._measure(run, args.warmup, args.steps)
    with Timer(ctx.device) as count_t:
        counts = moved_counts(snapshot, masters, run.policy.save)
    plan = bts._plan(exp, cfg, device)
    res |= counts | {
        "lr": lr,
        "parameters": params,
        "precision": run.policy.describe(),
        "flops_per_token": flops_per_token(cfg, exp),
        **{f"{k}_flops_per_token": v for k, v in utilisation_flops(cfg, exp).items()},
        "plan_gpu_gib": plan.gpu_total / GIB,
        "plan_fits": plan.fits,
        "snapshot_s": snap_t.s,
        "count_s": count_t.s,
    }
    return res


def _guarded_run(ctx, args, cfg, device, lr: float) -> dict:
    """`_train_at`, or {"lr", "failed": the error} when it raises (an out-of-memory at this
    shape among them): the one GPU shot keeps the other LR's figures and the FSDP2 wrap."""
    try:
        return _train_at(ctx, args, cfg, device, lr)
    except Exception as e:  # recorded as this run's finding, its traceback's end kept
        text, tb = failure(e)
        return {"lr": lr, "failed": text, "traceback": tb}


def _lr_figures(ctx, r: dict) -> list[Figure]:
    """tokens/s, MFU, peak vs plan and the moved shares of one LR's run."""
    lr, save, n = f"LR {r['lr']:g}", r["precision"]["checkpoint_dtype"], r["elements"]
    steps = f"{len(r['steps'])} steps ({sum(s['warmup'] for s in r['steps'])} warmup)"
    util = mfu(r["tokens_per_s"], r["model_flops_per_token"], ctx.peak_flops)
    hfu = mfu(r["tokens_per_s"], r["hardware_flops_per_token"], ctx.peak_flops)
    peak, plan = r.get("peak_reserved_gib"), r["plan_gpu_gib"]
    err = relative_error(plan, peak) if peak else None
    cpu = "not measured on the CPU"
    notes = {
        "mfu": f"{r['model_flops_per_token']:.4g} FLOPs/token (6N + attention, no recompute) / datasheet bf16 peak",
        "hfu": f"{r['hardware_flops_per_token']:.4g} FLOPs/token (MFU's + the decoder layers' recompute) / datasheet bf16 peak (the plan's rule, train_flops)",
        "peak": f"max_memory_reserved over the steps (allocated: {r.get('peak_allocated_gib', 0):.2f} GiB); assumed: the memory plan's total per GPU",
        "err": f"(plan {plan:.2f} - reserved peak {peak or 0:.2f} GiB) / peak = {err or 0:+.1%}; the plan's 2 GiB overhead also covers the CUDA context, which the peak leaves out",
        "master": f"{r['master_moved']:,} of {n:,} elements differ after {steps}: full copy on the host, exact compare",
        "saved": f"{r['saved_moved']:,} of {n:,} differ once both copies are cast to {save}, the dtype checkpoints save (Policy.save)",
    }
    master_target = Target(">=", MASTER_MOVED_MIN) if r["lr"] == min(LRS) else None
    plan_target = Target("<=", PLAN_ERROR_MAX)
    return [
        Figure(f"tokens/s, {lr}", r["tokens_per_s"], "tokens/s", note="timed steps only"),
        Figure(
            f"MFU, {lr}",
            util,
            "share",
            note=notes["mfu"] if util is not None else f"{cpu}: no peak FLOP/s",
        ),
        Figure(f"HFU, {lr}", hfu, "share", note=notes["hfu"] if hfu else f"{cpu}: no peak FLOP/s"),
        Figure(
            f"peak CUDA memory (reserved), {lr}",
            peak,
            "GiB",
            assumed=plan,
            note=notes["peak"] if peak else cpu,
        ),
        Figure(
            f"memory plan error vs measured peak (absolute), {lr}",
            None if err is None else abs(err),
            "share",
            plan_target,
            note=notes["err"] if peak else cpu,
        ),
        Figure(
            f"fp32 master weights moved, {lr}",
            share(r["master_moved"], n),
            "share",
            master_target,
            note=notes["master"],
        ),
        Figure(
            f"checkpoint ({save}) weights moved, {lr}",
            share(r["saved_moved"], n),
            "share",
            note=notes["saved"],
        ),
    ]


class _RssPeak:
    """`with _RssPeak() as m:` samples the process's resident memory every millisecond:
    m.before, m.peak, m.after in bytes (None where /proc/self/statm is missing)."""

    def __enter__(self):
        self.before = self.peak = self.after = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.wait(0.001):
            now = _rss()
            if now is not None:
                self.peak = max(self.peak or 0, now)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.after = _rss()
        if self.after is not None:
            self.peak = max(self.peak or 0, self.after)


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def _wrap(ctx, args, cfg, device) -> dict:
    """Build the bf16 model on the host (where the trainer loads a base), wrap it with FSDP2 on a
    1-process group, and measure the device's peak during the wrap."""
    cuda = device.type == "cuda"
    exp = bts._experiment(args, "fsdp", False, cuda)
    bts._init_group(device, False, "auto")  # gloo on CPU, cpu:gloo,cuda:nccl on CUDA
    torch.manual_seed(0)
    with torch.device(device):  # built where random numbers are fast, then moved to the host
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to("cpu")
    policy = resolve_precision(exp, base=torch.bfloat16)
    strategy = pick(exp, 1)
    if strategy.name != "fsdp":
        raise RuntimeError(f"expected the fsdp strategy under a process group, got {strategy.name}")
    prep = _prepare_model(model, exp, device, policy, strategy)
    trainable = sum(p.numel() for p in prep.model.parameters() if p.requires_grad)
    layer = max(sum(p.numel() for p in m.parameters()) for m in prep.model.model.layers)
    root = sum(p.numel() for n, p in prep.model.named_parameters() if ".layers." not in n)
    free(ctx.device)
    base = torch.cuda.memory_allocated(device) if cuda else 0
    with _RssPeak() as rss, Timer(ctx.device) as t:
        strategy.wrap(prep, exp, policy, device, 1)
    peak = torch.cuda.max_memory_allocated(device) - base if cuda else None
    shard = sum(_local(p).numel() * _local(p).element_size() for p in prep.model.parameters())
    elt = policy.master.itemsize
    return {
        "seconds": t.s,
        "peak_bytes": peak,
        "shard_bytes": shard,
        "reference_bytes": shard_plus_layer_bytes(trainable, layer, 1, elt),
        "layer_bytes": layer * elt,
        "root_unit_bytes": root * elt,
        "rss_before": rss.before,
        "rss_peak": rss.peak,
        "rss_after": rss.after,
    }


def _local(p: torch.Tensor) -> torch.Tensor:
    """A parameter's local shard (FSDP2 makes DTensors), or the tensor itself."""
    return p.to_local() if hasattr(p, "to_local") else p


def _wrap_figure(w: dict) -> Figure:
    """The wrap's device peak against one shard plus one decoder layer."""
    gib = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
    ref = f"one shard (1 process: every fp32 master, {gib(w['shard_bytes'])}) + one fp32 decoder layer ({gib(w['layer_bytes'])}); the root unit (embeddings, lm_head, norm) is {gib(w['root_unit_bytes'])} in fp32"  # fmt: skip
    if w["peak_bytes"] is None:
        rise = f"{(w['rss_peak'] - w['rss_before']) / 2**20:.1f} MiB" if w["rss_before"] is not None else "unknown"  # fmt: skip
        note = f"CPU: model and shard share host memory, and a tiny model is below RSS noise (the wrap raised RSS by {rise} at its peak); the ratio is measured on a GPU only"  # fmt: skip
        return Figure("FSDP2 wrap peak / (one shard + one layer)", None, "x", Target("<=", WRAP_MAX), note=note)  # fmt: skip
    return Figure("FSDP2 wrap peak / (one shard + one layer)", w["peak_bytes"] / w["reference_bytes"], "x", Target("<=", WRAP_MAX),
                  note=f"max_memory_allocated during strategy.wrap of the host-loaded bf16 model: {gib(w['peak_bytes'])}, against {ref}")  # fmt: skip


def _skip(ctx, what: str, need_s: float) -> str | None:
    """A note when a full run has less than `need_s` seconds left for `what`, else None."""
    if ctx.smoke or ctx.remaining() >= need_s:
        return None
    return f"{what} skipped: {ctx.remaining():.0f} s left, it needs ~{need_s:.0f} s"


def run(ctx) -> dict:
    """The stage (see the module docstring)."""
    device = torch.device("cuda", torch.cuda.current_device()) if ctx.device == "cuda" else torch.device("cpu")  # fmt: skip
    args = _args(ctx)
    cfg = ctx.config(depth=None if ctx.smoke else DEPTH)
    cfg.dtype = torch.bfloat16  # what the plan reads as the base dtype
    out: dict = {"figures": [], "notes": [], "runs": []}
    try:
        for lr in LRS:
            if note := _skip(ctx, f"LR {lr:g}", 15):
                out["notes"].append(note)
                continue
            r = _guarded_run(ctx, args, cfg, device, lr)
            free(ctx.device)  # the run's model and optimizer are gone: the next peak is its own
            if "failed" in r:  # that LR's finding; the other LR and the wrap still run
                out["figures"].append(failed_part(f"training run finished, LR {lr:g}", r["failed"]))  # fmt: skip
                out["notes"].append(f"LR {lr:g} FAILED: {r['failed']}")
                continue
            out["runs"].append(r)
            out["figures"] += _lr_figures(ctx, r)
            # outlives the next LR and the wrap
            ctx.keep(f"LR {lr:g}", lambda: training_result(cfg, out))
        fast = [r for r in out["runs"] if r["lr"] == max(LRS)]
        if fast:
            per_s = fast[0]["tokens_per_s"] * fast[0]["flops_per_token"]
            assumed = ctx.assumed.train_flops_per_s.value if ctx.assumed else None
            out["figures"].append(Figure(f"training FLOP/s, LR {max(LRS):g}", per_s, "FLOP/s", assumed=assumed, note="FLOPs by the plan's rule (train_flops); one GPU, no FSDP communication: an upper bound for multi-GPU FSDP"))  # fmt: skip
            if not ctx.smoke:
                out["throughput"] = training_throughput(ctx, fast[0], cfg, args)
            ctx.keep("training FLOP/s", lambda: training_result(cfg, out))
        if note := _skip(ctx, "FSDP2 wrap", 10):
            out["notes"].append(note)
        else:
            _guarded_wrap(ctx, args, cfg, device, out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        free(ctx.device)
    return training_result(cfg, out)


def _guarded_wrap(ctx, args, cfg, device, out: dict) -> None:
    """`_wrap` into out["wrap"] and its figure; a failure (the first FSDP2 + NCCL init on the
    GPU) is its finding, a missed target, like `_guarded_run`'s: the LR runs' figures stay."""
    try:
        out["wrap"] = _wrap(ctx, args, cfg, device)
        out["figures"].append(_wrap_figure(out["wrap"]))
    except Exception as e:  # recorded, its traceback's end kept
        text, tb = failure(e)
        out["wrap"] = {"failed": text, "traceback": tb}
        out["figures"].append(failed_part("FSDP2 wrap finished", text))  # fmt: skip
        out["notes"].append(f"FSDP2 wrap FAILED: {text}")
