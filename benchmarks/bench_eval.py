"""Proxy-evaluation benchmark: the cached ProxyEvaluator against lm-eval's HFLM on N candidates.

Run: .venv/bin/python benchmarks/bench_eval.py [--device cpu|cuda] [--shape tiny|llama-8b]
     [--models 6] [--items 20] [--max-gen-toks 16] [--batch-size auto] [--hflm-batch-sizes 1,8,32]

Candidates (stand-ins for merge candidates) are scored on the same MGSM-schema
(generate_until) and Belebele-schema (multiple_choice) items by one ProxyEvaluator built once
and by `lm_eval.simple_evaluate(HFLM(pretrained=model, batch_size=B))` per candidate for each B
(one shared TaskManager, no request cache, no bootstrap). Contenders alternate per candidate so
both see the same load. Printed: per-candidate seconds of each, the ratio to HFLM at its best
batch size, and the share of items whose predictions differ from HFLM at batch size 1.

Shapes: `tiny` is the test suite's tiny Llamas (float32); `llama-8b` is a random-weight model of
Llama-3.1-8B's shape (32 layers, 4096 hidden, GQA 32/8, 14336 MLP) with the world tokenizer, in
bfloat16 on cuda (candidates: the same model with a few layers re-noised in place); `llama-tiny`
the same architecture at a few thousand parameters (benchmarks/shapes.py), for a CPU smoke run.

Smoke runs (tests/benchmarks/test_bench_eval.py; seconds each, the ratios mean nothing there):
    bench_eval.py --device cpu [--shape llama-tiny] --models 2 --items 4 --max-gen-toks 4
        --hflm-batch-sizes 1,4
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import argparse
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # shapes.py
sys.path.insert(0, str(ROOT / "tests" / "trainables" / "evaluate"))  # fixture world and models

TASKS = ["mgsm_dev", "bele_dev"]


def shape_candidates(shape: str, tok, n: int, device: str):
    """One random model of a benchmarks/shapes.py shape, re-noised per candidate (yields the
    same object)."""
    import torch
    from shapes import shape_config
    from transformers import LlamaForCausalLM

    cfg = shape_config(shape, tok)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    for i in range(n):
        renoise(model, i)
        yield model


def renoise(model, i: int) -> None:
    """Candidate `i` from the previous one: layer i (mod depth) gets seeded noise, in place."""
    import torch

    layers = model.model.layers
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(i)
    with torch.no_grad():
        for p in layers[i % len(layers)].parameters():
            p.add_(torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype) * 0.01)


def _predictions(result) -> dict:
    return {(t, r.doc_id): r.prediction for t, items in result.items.items() for r in items}


def _hflm_predictions(out) -> dict:
    import numpy as np

    preds = {}
    for task in TASKS:
        for s in out["samples"][task]:
            if task == "bele_dev":
                preds[(task, s["doc_id"])] = int(np.argmax([r[0][0] for r in s["resps"]]))
            else:
                preds.setdefault((task, s["doc_id"]), {})[s["filter"]] = s["filtered_resps"][0]
    return preds


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[int]]:
    """The command line (see the module docstring).

    Returns:
        (the arguments, the HFLM batch sizes as ints).
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--shape", choices=["tiny", "llama-8b", "llama-tiny"], default="tiny")
    ap.add_argument("--models", type=_positive, default=6, help="candidates")
    ap.add_argument("--items", type=_positive, default=20, help="items per task")
    ap.add_argument("--max-gen-toks", type=int, default=16)
    ap.add_argument("--batch-size", default="auto", help="the cached evaluator's: int or auto")
    ap.add_argument("--hflm-batch-sizes", default="1,8,32", help="comma-separated, each timed")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (CPU), both contenders")
    args = ap.parse_args(argv)
    try:
        hflm_sizes = [_positive(b) for b in args.hflm_batch_sizes.split(",")]
    except argparse.ArgumentTypeError as e:
        ap.error(f"--hflm-batch-sizes {args.hflm_batch_sizes}: {e}")
    return args, hflm_sizes


@dataclass
class Race:
    """What the race measured: seconds per candidate of the cached evaluator (`ours`) and of HFLM
    per batch size (`theirs`), the evaluator's build seconds, and how many predictions differ
    from HFLM at the first batch size (`differ` of `total`)."""

    build: float
    ours: list[float] = field(default_factory=list)
    theirs: dict[int, list[float]] = field(default_factory=dict)
    differ: int = 0
    total: int = 0


def _candidates(args: argparse.Namespace, tok, device: str):
    """The candidates of --shape on `device` (a generator: one model in memory at a time)."""
    # lazy: a test helper module (put on sys.path above), loaded after the arguments are checked
    from proxy_fixtures import tiny_models

    if args.shape == "tiny":
        return (m.to(device) for m in tiny_models(tok, n=args.models))
    return shape_candidates(args.shape, tok, args.models, device)


def hflm_runner(tok, device: str, gen: dict):
    """A function (candidate, task manager, batch size) -> lm-eval's simple_evaluate of the
    candidate through HFLM.

    lm-eval's HFLM is imported here: call it before anything is timed (the evaluator's build
    included), so no timing pays for that import.
    """
    # lazy: lm-eval loads only once the arguments are checked (--help stays instant)
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    def run(m, tm, b: int):
        return lm_eval.simple_evaluate(
            model=HFLM(pretrained=m, tokenizer=tok, batch_size=b, device=device),
            tasks=TASKS,
            task_manager=tm,
            log_samples=True,
            gen_kwargs=dict(gen),
            bootstrap_iters=0,
            cache_requests=False,
            verbosity="ERROR",
        )

    return run


def run_race(ev, hflm, tm, candidates, hflm_sizes: list[int], device: str, race: Race) -> None:
    """Each candidate scored by the cached evaluator `ev`, then by `hflm` (hflm_runner) at every
    batch size (the contenders alternate per candidate, so both see the same load); fills `race`."""
    race.theirs = {b: [] for b in hflm_sizes}
    for m in candidates:
        _sync(device)
        t0 = time.perf_counter()
        res = ev.score(m)
        _sync(device)
        race.ours.append(time.perf_counter() - t0)
        for b in hflm_sizes:
            t0 = time.perf_counter()
            out = hflm(m, tm, b)
            _sync(device)
            race.theirs[b].append(time.perf_counter() - t0)
            if b == hflm_sizes[0]:
                ref, mine = _hflm_predictions(out), _predictions(res)
                race.differ += sum(mine[k] != ref[k] for k in ref)
                race.total += len(ref)


def print_summary(race: Race, bs, hflm_sizes: list[int], backoffs) -> None:
    """Medians per candidate, the share of differing predictions and the speed-ups."""
    ours, theirs = race.ours, race.theirs
    med = statistics.median(ours)
    print(f"cached (batch {bs})  build {race.build:6.2f} s   per candidate median {med:7.3f} s")
    for b, ts in theirs.items():
        print(f"lm-eval HFLM batch {b:<3}              per candidate median {statistics.median(ts):7.3f} s")  # fmt: skip
    best = min(theirs, key=lambda b: statistics.median(theirs[b]))
    print(
        f"predictions differing from HFLM batch {hflm_sizes[0]}: {race.differ}/{race.total} "
        f"({race.differ / max(race.total, 1):.1%}); out-of-memory back-offs {backoffs}"
    )
    print(
        f"speed-up per candidate vs HFLM at its best batch ({best}): "
        f"{statistics.median(theirs[best]) / med:.2f}x"
        + "".join(f"; vs batch {b}: {statistics.median(ts) / med:.2f}x" for b, ts in theirs.items())
    )


def main(argv: list[str] | None = None) -> None:
    """Run the race (see the module docstring) and print its figures."""
    args, hflm_sizes = parse_args(argv)

    # lazy: torch, lm-eval and the project load only once the arguments are checked
    import torch
    from lm_eval.tasks import TaskManager
    from proxy_fixtures import write_world

    from layerswap.trainables.evaluate.proxy import ProxyEvaluator
    from layerswap.world.tiny import tiny_tokenizer

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(args.threads)
    bs = args.batch_size if args.batch_size == "auto" else int(args.batch_size)
    gen = {"max_gen_toks": args.max_gen_toks}
    tok = tiny_tokenizer()
    hflm = hflm_runner(tok, device, gen)
    candidates = _candidates(args, tok, device)

    with tempfile.TemporaryDirectory() as tmp:
        world = write_world(Path(tmp), n_mgsm=args.items, n_bele=args.items)
        print(
            f"{args.shape} on {device}: {args.models} candidates x ({args.items} MGSM + "
            f"{args.items} Belebele items), max_gen_toks {args.max_gen_toks}, cached batch "
            f"{bs}, HFLM batch {hflm_sizes}, torch threads {torch.get_num_threads()}"
        )
        t0 = time.perf_counter()
        ev = ProxyEvaluator(TASKS, tok, include_path=str(world), gen_kwargs=gen, batch_size=bs)
        race = Race(build=time.perf_counter() - t0)
        tm = TaskManager(include_path=str(world), include_defaults=False)
        run_race(ev, hflm, tm, candidates, hflm_sizes, device, race)

    print_summary(race, bs, hflm_sizes, ev.sizer.backoffs)


def _positive(text: str) -> int:
    """A count argument: a positive int (argparse names the bad value)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive int")
    return int(text)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
