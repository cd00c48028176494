"""One training step of a real model shape on one device: tokens/s and peak memory.

A random-weight model of `--shape` (default llama-8b: Llama-3.1-8B's architecture, 32 layers,
hidden 4096, GQA 32/8, MLP 14336; vocabulary of the world tokenizer unless `--vocab`) is built
in bfloat16 directly on the device, so nothing is read from or written to disk but the tiny
world's tokenizer. It then goes through the trainer's own code, not a copy of it:
`_prepare_model` (mode `full`, the precision policy's fp32 masters under bf16-mixed, gradient
checkpointing), `pick(exp, 1).wrap` (`ddp`: the bare model in one process; `fsdp`: FSDP2 over
a 1-process group this script opens, with `--offload` = CPUOffloadPolicy), `_adamw`
(trainables/train/run_setup.py), and `_Run`'s step (trainables/train/train_step.py) on
micro-batches of random token ids (labels = ids; `--micro-batch` rows of `--seq-len` tokens,
`--accumulate` passes per step). `--warmup` steps (AdamW allocates its moments there) are timed
but left out of tokens/s; each step is timed between torch.cuda.synchronize() calls. Printed:
parameters, the precision policy, seconds per step, tokens/s, peak memory (CUDA:
max_memory_allocated / max_memory_reserved since the first step; always: the process's peak RSS,
which also counts the model build) and the trainer's own memory plan
(trainables/train/memory_plan.py) for the same set-up, to check the plan against.

Smoke run (seconds; tests/benchmarks/test_bench_train_step.py runs it): --shape llama-tiny
    --device cpu --seq-len 16 --micro-batch 1 --steps 1 [--strategy fsdp --offload].
Run (CPU check at 8B width): python benchmarks/bench_train_step.py --shape llama-8b --depth 1
    --seq-len 64 --micro-batch 1 [--strategy fsdp --offload] [--out F.json]
About 6 min on 2 AVX2-only cores, ~2 min a step: without avx512_bf16 torch's CPU bf16 matmuls
take slow paths (one 64x14336 @ 14336x4096 product: 28 s in bf16, 0.1 s in fp32), and
bf16-mixed computes in bf16. It checks that the path runs; its tokens/s mean nothing.

On an H100 80 GB, NOT RUN ON A GPU YET (only the CPU smoke check above has run):
    # the whole 8B shape (7.0 B parameters at the world vocab): bf16 weights gathered per layer
    # on the GPU (plan: 7.2 GiB); fp32 masters, gradients and AdamW moments in host memory:
    # 104 GiB of the 128; --vocab 128256 adds 16 GiB, likely too much
    python benchmarks/bench_train_step.py --shape llama-8b --device cuda --strategy fsdp \
        --offload --micro-batch 4 --seq-len 1024
    # half the depth (3.5 B) with everything on the GPU (plan: 67.1 GiB of 79.6)
    python benchmarks/bench_train_step.py --shape llama-8b --device cuda --depth 16 \
        --strategy ddp --micro-batch 4 --seq-len 1024
`--vocab 128256` gives Llama-3.1-8B's real embedding and lm_head (+1.05 B parameters, and a
128k-wide fp32 logits tensor per micro-batch). `--strategy auto` (default) picks ddp when the
memory plan fits the device, else fsdp with offload. With offload on CUDA the process group is
`cpu:gloo,cuda:nccl` (as Ray Train's GPU workers open it): FSDP2's gradient clipping
all-reduces the CPU-resident gradient norms, which a bare `nccl` group cannot.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import argparse
import json
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # shapes.py

GIB = 2**30


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-8b", help="a benchmarks/shapes.py SHAPES name")
    ap.add_argument("--depth", type=int, default=None, help="decoder layers (default: the shape's)")  # fmt: skip
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the world tokenizer's)")  # fmt: skip
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--precision", choices=["bf16-mixed", "fp32", "bf16-pure"], default="bf16-mixed")  # fmt: skip
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)  # fmt: skip
    ap.add_argument("--strategy", choices=["auto", "ddp", "fsdp"], default="auto")
    ap.add_argument("--offload", action="store_true", help="fsdp: CPU offload (FSDP2 CPUOffloadPolicy)")  # fmt: skip
    ap.add_argument("--backend", default="auto", help="fsdp's process group (default: gloo on CPU, cpu:gloo,cuda:nccl on CUDA, as Ray Train)")  # fmt: skip
    ap.add_argument("--micro-batch", type=int, default=4, help="rows per forward pass")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    ap.add_argument("--warmup", type=int, default=1, help="steps left out of tokens/s")
    ap.add_argument("--steps", type=int, default=2, help="timed steps")
    ap.add_argument("--world", type=Path, default=None, help="a built world (default: a tiny one in a temporary folder)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = ap.parse_args()
    if args.offload and args.strategy == "ddp":
        ap.error("--offload needs --strategy fsdp (or auto)")
    if args.steps < 1 or args.warmup < 0:  # tokens/s is over the timed steps: none, no figure
        ap.error(f"--steps {args.steps} --warmup {args.warmup}: give at least 1 timed step and no negative warmup")  # fmt: skip
    if args.world is not None and not (args.world / "base").is_dir():
        ap.error(f"--world {args.world}: no base/ there (build one with `layerswap world build`)")
    return args


def _tokenizer(world: Path | None):
    """The world tokenizer (benchmarks/shapes.py pairs it with the real architectures); a tiny
    world is built in a temporary folder, removed once the tokenizer is in memory."""
    from transformers import AutoTokenizer

    from layerswap.world import build_world

    if world is not None:
        return AutoTokenizer.from_pretrained(world / "base")
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        world = build_world(Path(tmp) / "world", size="tiny", progress=False)
        return AutoTokenizer.from_pretrained(world / "base")


def _experiment(args, strategy: str, offload: bool, use_gpu: bool, lr: float = 1e-5):
    """A TrainExperiment with the benchmark's settings (peak learning rate `lr`, held constant).
    `base` and the dataset are placeholders: the model and the batches come from memory, and
    nothing on this path reads either."""
    from layerswap.spaces.train_experiment import parse_train_experiment

    return parse_train_experiment(
        {
            "name": "bench_train_step",
            "base": "random-weights-in-memory",
            "kind": "math",
            "language": "en",
            "datasets": [{"path": "unused.jsonl"}],
            "mode": "full",
            "hyper": {
                "lr": lr,
                "schedule": "constant_with_warmup",
                "batch_size": args.micro_batch * args.accumulate,
                "micro_batch_size": args.micro_batch,
                "max_steps": args.warmup + args.steps,
                "seq_len": args.seq_len,
                "gradient_checkpointing": args.gradient_checkpointing,
            },
            "scaling": {"use_gpu": use_gpu, "strategy": strategy, "cpu_offload": offload},
            "precision": args.precision,
        },
        source="bench_train_step",
    )


def _plan(exp, cfg, device):
    """The trainer's memory plan for `exp` on `cfg`, judged against the GPU's memory (its
    torch.cuda.mem_get_info total, a memory cap included) when `device` is a GPU."""
    import torch

    from layerswap.trainables.train.memory_plan import memory_plan

    # The device's memory as mem_get_info reports it, not get_device_properties: the GPU check
    # caps a larger GPU (an H200 at 80 GiB, gpu_check/common.apply_memory_cap) by patching
    # mem_get_info, and the plan must judge fit against that cap, as the trainer's placement does.
    gpu = torch.cuda.mem_get_info(device)[1] / GIB if device.type == "cuda" else None
    return memory_plan(exp, cfg, source=f"shapes.py {cfg.num_hidden_layers} layers", gpu_memory=gpu)  # fmt: skip


def _choose(args, cfg, device) -> tuple[str, bool]:
    """(strategy, offload): as asked, or under `auto` ddp when its plan fits the device (always
    on CPU, where the plan's GPU figures do not apply) and fsdp with offload when it does not."""
    if args.strategy != "auto":
        return args.strategy, args.offload
    if device.type == "cpu":
        return "ddp", False
    plan = _plan(_experiment(args, "ddp", False, True), cfg, device)
    if plan.fits:
        return "ddp", False
    print(f"auto: ddp needs {plan.gpu_total / GIB:.1f} GiB per the plan, more than the device; fsdp with offload")  # fmt: skip
    return "fsdp", True


def _init_group(device, offload: bool, backend: str) -> None:
    """A 1-process group on a free local port (FSDP2 needs one; DeviceMesh builds on it)."""
    import torch.distributed as dist

    if backend == "auto":
        # Offloaded gradients are on the CPU, and clipping all-reduces their norms there.
        backend = "gloo" if device.type == "cpu" else "cpu:gloo,cuda:nccl"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    kw = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, rank=0, world_size=1, **kw)


def _data(vocab: int, rows: int, seq_len: int, seed: int = 0):
    """TrainData of `rows` random sequences of exactly `seq_len` ids, labelled with themselves
    (no padding, so every token counts), one stream: what build_data would hand the loop."""
    import torch

    from layerswap.trainables.train.data import Stream, TrainData

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, seq_len), generator=g).tolist()
    return TrainData([Stream([(x, list(x)) for x in ids], seed, 0)], [[]], [{}])


def _setup(args, exp, cfg, device):
    """The loop's _Run for `exp`: model built on the device, prepared, cast, wrapped."""
    import torch
    from transformers import AutoModelForCausalLM

    from layerswap.trainables.train.precision import resolve_precision
    from layerswap.trainables.train.run_setup import _adamw, _prepare_model
    from layerswap.trainables.train.strategies import pick
    from layerswap.trainables.train.train_step import _Run

    torch.manual_seed(0)
    # bf16 straight away: an fp32 build of 8B would take 32 GB before the cast.
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    policy = resolve_precision(exp, base=torch.bfloat16)  # no config on disk to read it from
    strategy = pick(exp, 1)
    prep = _prepare_model(model, exp, device, policy, strategy)
    net = strategy.wrap(prep, exp, policy, device, 1)  # FSDP: new (sharded) parameters
    total = args.warmup + args.steps
    run = _Run(
        exp=exp,
        tok=None,  # read only when a checkpoint is saved
        data=_data(cfg.vocab_size, exp.hyper.batch_size * total, args.seq_len),
        prep=prep,
        policy=policy,
        strategy=strategy,
        net=net,
        optimizers={g: _adamw(named, exp) for g, named in prep.groups.items()},
        names={},
        device=device,
        workdir=Path("unused"),
        rank=0,
        world=1,
        pad=cfg.pad_token_id,
        start=0,
        total=total,
        step_log=None,
        t0=time.time(),
    )
    return run, params


def _measure(run, warmup: int, steps: int) -> dict:
    """Run warmup + steps of the loop's _train_step; seconds, tokens and losses per step."""
    import torch

    from layerswap.trainables.train.train_step import _train_step

    cuda = run.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(run.device)
        torch.cuda.reset_peak_memory_stats(run.device)
    rows: list[dict] = []
    run.net.train()
    for step in range(warmup + steps):
        tokens0, t0 = run.tokens_local, time.perf_counter()
        out = _train_step(run, step)
        loss = out.loss.item()  # waits for the step on any device
        if cuda:
            torch.cuda.synchronize(run.device)
        dt = time.perf_counter() - t0
        rows.append({"step": step, "warmup": step < warmup, "seconds": dt, "tokens": run.tokens_local - tokens0, "loss": loss, "grad_norm": out.grad_norm})  # fmt: skip
        print(f"  step {step}{' (warmup)' if step < warmup else ''}: {dt:.2f} s, loss {loss:.3f}, grad norm {out.grad_norm:.3f}", flush=True)  # fmt: skip
    timed = [r for r in rows if not r["warmup"]]
    secs = sum(r["seconds"] for r in timed)
    res = {"steps": rows, "tokens_per_s": sum(r["tokens"] for r in timed) / secs if secs else None}
    res["peak_host_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    if cuda:
        res["peak_allocated_gib"] = torch.cuda.max_memory_allocated(run.device) / GIB
        res["peak_reserved_gib"] = torch.cuda.max_memory_reserved(run.device) / GIB
    return res


def _table(res: dict) -> None:
    c = res["config"]
    print(f"\n{c['shape']} depth {c['depth']} vocab {c['vocab']} on {res['device']}: {c['strategy']}{' + offload' if c['offload'] else ''}, micro-batch {c['micro_batch']} x seq {c['seq_len']} x {c['accumulate']}, checkpointing {'on' if c['gradient_checkpointing'] else 'off'}")  # fmt: skip
    p = res["precision"]
    timed = " ".join(f"{r['seconds']:.2f}" for r in res["steps"] if not r["warmup"])
    rows = [
        ("parameters", f"{res['parameters']:,}"),
        ("precision", f"{p['policy']}: master {p['master_dtype']}, compute {p['compute_dtype']}"),
        ("seconds per timed step", timed),
        ("tokens/s (timed steps)", f"{res['tokens_per_s']:,.2f}"),
    ]
    if "peak_allocated_gib" in res:
        rows += [
            ("peak CUDA allocated GiB", f"{res['peak_allocated_gib']:.2f}"),
            ("peak CUDA reserved GiB", f"{res['peak_reserved_gib']:.2f}"),
        ]
    rows += [
        ("peak host RSS GiB (incl. build)", f"{res['peak_host_rss_gib']:.2f}"),
        ("plan: per GPU GiB (estimate)", f"{res['plan_gpu_gib']:.2f}"),
        ("plan: host, offloaded GiB", f"{res['plan_cpu_gib']:.2f}"),
    ]
    for k, v in rows:
        print(f"  {k:<34}{v}")


def main() -> int:
    args = _args()
    import torch
    import torch.distributed as dist
    from shapes import shape_config

    want = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")  # fmt: skip
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if want == "cuda" else "cpu")
    tok = _tokenizer(args.world)
    cfg = shape_config(args.shape, tok, args.depth)
    cfg.vocab_size = args.vocab or cfg.vocab_size
    cfg.dtype = torch.bfloat16  # what the plan reads as the base dtype
    strategy, offload = _choose(args, cfg, device)
    exp = _experiment(args, strategy, offload, device.type == "cuda")
    if strategy == "fsdp":
        _init_group(device, offload, args.backend)
    try:
        t0 = time.perf_counter()
        run, params = _setup(args, exp, cfg, device)
        print(f"set-up {time.perf_counter() - t0:.1f} s; {args.warmup} warmup + {args.steps} timed steps")  # fmt: skip
        res = _measure(run, args.warmup, args.steps)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    plan = _plan(exp, cfg, device)
    config = vars(args) | {"depth": cfg.num_hidden_layers, "vocab": cfg.vocab_size, "strategy": strategy, "offload": offload}  # fmt: skip
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"  # fmt: skip
    res = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in config.items()},
        "device": name,
        "torch": torch.__version__,
        "parameters": params,
        "precision": run.policy.describe(),
        "plan_gpu_gib": plan.gpu_total / GIB,
        "plan_cpu_gib": plan.cpu_total / GIB,
    } | res
    _table(res)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)  # after the measured work: not lost
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
