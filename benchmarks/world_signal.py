"""Does the embedded world show its phenomena? Short SFT on its data vs the base, on dev sets.

Run `python benchmarks/world_signal.py [--world DIR] [--steps 150] [--lr 1e-3]` (~6 min on 2 CPU
cores when it has to build the full world). Prints English MGSM dev before/after math SFT and
xa Belebele dev before/after language SFT. This is a measurement, not a test: issue 3 asks for
a test asserting both rise clearly above the base, which the current world does not yet meet.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _rows(world: Path, rel: str) -> list[dict]:
    return [json.loads(x) for x in (world / rel).read_text(encoding="utf-8").splitlines()]


def _load(world: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    return (
        AutoModelForCausalLM.from_pretrained(world / "base"),
        AutoTokenizer.from_pretrained(world / "base"),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=Path, help="an existing full world (default: build one)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args(argv)

    from search.world import build_world
    from search.world.sft import belebele_accuracy, mgsm_accuracy, pairs, sft

    world = args.world or Path(tempfile.mkdtemp()) / "world"
    world = build_world(world, size="full", progress=True)

    dev = _rows(world, "data/mgsm/en/dev.jsonl")
    model, tok = _load(world)
    before = mgsm_accuracy(model, tok, dev)
    sft(model, tok, pairs(_rows(world, "data/sft/math_en.jsonl")), args.steps, args.lr, seed=0)
    after = mgsm_accuracy(model, tok, dev)
    print(f"English MGSM dev accuracy: base {before:.3f} -> math SFT {after:.3f}")

    dev = _rows(world, "data/belebele/xa/dev.jsonl")
    model, tok = _load(world)
    before = belebele_accuracy(model, tok, dev)
    sft(model, tok, pairs(_rows(world, "data/sft/lang_xa.jsonl")), args.steps, args.lr, seed=0)
    after = belebele_accuracy(model, tok, dev)
    print(f"xa Belebele dev accuracy:  base {before:.3f} -> lang SFT {after:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
