"""Proxy-evaluation benchmark: the cached ProxyEvaluator against lm-eval's HFLM on N candidates.

Run: .venv/bin/python benchmarks/bench_eval.py [--models 6] [--items 20] [--max-gen-toks 16] [--batch-size 1] [--threads 1]

N tiny random Llamas (a base and seeded perturbed copies: stand-ins for merge candidates) are
scored on the same MGSM-schema (generate_until) and Belebele-schema (multiple_choice) items,
by `lm_eval.simple_evaluate(HFLM(pretrained=model))` per candidate (one shared TaskManager, no
request cache, no bootstrap) and by one ProxyEvaluator built once. Every candidate's per-item
predictions are asserted equal; the time ratio lm-eval / cached is printed (target >= 3).
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "trainables" / "evaluate"))  # fixture world and models

TASKS = ["mgsm_dev", "bele_dev"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=6)
    ap.add_argument("--items", type=int, default=20)
    ap.add_argument("--max-gen-toks", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=1, help="HFLM batch_size = gen_batch_size")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, both contenders")
    args = ap.parse_args()

    import lm_eval
    import torch
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from proxy_fixtures import tiny_models, write_world
    from test_proxy import assert_same_as_lm_eval

    from trainables.evaluate.proxy import ProxyEvaluator
    from world.tiny import tiny_tokenizer

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    # Tiny models on shared cores: intra-op threads mostly wait on each other.
    torch.set_num_threads(args.threads)
    gen = {"max_gen_toks": args.max_gen_toks}
    tok = tiny_tokenizer()
    models = tiny_models(tok, n=args.models)
    with tempfile.TemporaryDirectory() as tmp:
        world = write_world(Path(tmp), n_mgsm=args.items, n_bele=args.items)
        print(
            f"{args.models} candidates x ({args.items} MGSM + {args.items} Belebele items), "
            f"max_gen_toks {args.max_gen_toks}, "
            f"batch size {args.batch_size}, torch threads {torch.get_num_threads()}"
        )

        t0 = time.perf_counter()
        ev = ProxyEvaluator(
            TASKS, tok, include_path=str(world), gen_kwargs=gen, gen_batch_size=args.batch_size
        )
        build = time.perf_counter() - t0
        tm = TaskManager(include_path=str(world), include_defaults=False)
        ours, theirs = [], []
        # Contenders alternate per candidate so both see the same load on shared cores.
        for m in models:
            t0 = time.perf_counter()
            res = ev.score(m)
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = lm_eval.simple_evaluate(
                model=HFLM(pretrained=m, tokenizer=tok, batch_size=args.batch_size),
                tasks=TASKS,
                task_manager=tm,
                log_samples=True,
                gen_kwargs=dict(gen),
                bootstrap_iters=0,
                cache_requests=False,
                verbosity="ERROR",
            )
            theirs.append(time.perf_counter() - t0)
            samples = {t: {(s["doc_id"], s["filter"]): s for s in out["samples"][t]} for t in TASKS}
            assert_same_as_lm_eval(res, samples)  # same predictions, item by item

    total_ours, total_theirs = build + sum(ours), sum(theirs)
    print(
        f"cached   build {build:6.2f} s   per candidate median {statistics.median(ours):6.2f} s"
        f"   total {total_ours:6.2f} s"
    )
    print(
        f"lm-eval                  per candidate median {statistics.median(theirs):6.2f} s"
        f"   total {total_theirs:6.2f} s"
    )
    print("predictions identical for every candidate and item")
    print(
        f"speed-up lm-eval / cached: total {total_theirs / total_ours:.2f}x, "
        f"per candidate {statistics.median(theirs) / statistics.median(ours):.2f}x (target >= 3x)"
    )


if __name__ == "__main__":
    main()
