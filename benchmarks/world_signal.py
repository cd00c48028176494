"""Does the embedded world show its phenomena? Short SFT on its data vs the base, on dev sets.

Run `python benchmarks/world_signal.py [--world DIR] [--seed 0] [--size full] [--sft-seeds 0,1]
[--math-steps 500] [--lang-steps 300] [--lr 1e-3]` (~3 min per SFT seed on 2 CPU cores, plus
~4 min if it has to build the full world; a --world already built is used as it is, whatever
its seed and size). Smoke run (tests/benchmarks/test_world_signal.py, seconds):
`--world TINY_WORLD --sft-seeds 0 --math-steps 2 --lang-steps 2`. Prints English MGSM dev before/after math SFT and
xa Belebele dev before/after language SFT (no math in it), plus the side scores that matter for
merging. A measurement, not a test (tests/world/test_world_finetune.py asserts the rises).
World v3 (2026-11-22, dev sets of 100 items, base -> SFT seeds 0 / 1; world build 195-272 s):
  world seed 0: MGSM en 0.17 -> 0.37 / 0.42 (math SFT); Belebele xa 0.38 -> 0.78 / 1.00
    (language SFT; English Belebele 1.00 for the base).
  world seed 1: MGSM en 0.15 -> 0.41 / 0.40; Belebele xa 0.31 -> 0.98 / 1.00 (English 1.00).
  xa MGSM: base 0.02-0.04, math expert 0.10-0.22, language expert 0.00; layer swaps of the two
  (bottom 2-6 / top 1-2 from the language expert, world seed 0) 0.00 -- not yet a merge signal.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _seeds(text: str) -> list[int]:
    """--sft-seeds: comma-separated ints (argparse names the bad value)."""
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated ints") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=Path, help="a built world, or where to build one (default: a temporary folder)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="world seed (when building)")
    p.add_argument("--size", choices=["full", "tiny"], default="full", help="world preset (when building)")  # fmt: skip
    p.add_argument("--sft-seeds", default="0,1", type=_seeds, help="comma-separated SFT seeds")
    p.add_argument("--math-steps", type=int, default=500)
    p.add_argument("--lang-steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args(argv)

    from layerswap.world import build_world
    from layerswap.world.sft import (
        belebele_accuracy,
        load_base,
        mgsm_accuracy,
        pairs,
        read_rows,
        sft,
    )

    t0 = time.time()
    world = args.world or Path(tempfile.mkdtemp()) / "world"
    if not (world / "world.json").is_file():  # a built world is read as it is
        world = build_world(world, seed=args.seed, size=args.size, progress=True)
    mgsm = {c: read_rows(world, f"data/mgsm/{c}/dev.jsonl") for c in ("en", "xa")}
    bele = {c: read_rows(world, f"data/belebele/{c}/dev.jsonl") for c in ("en", "xa")}
    model, tok = load_base(world)
    print(
        f"base: MGSM dev en {mgsm_accuracy(model, tok, mgsm['en']):.2f} "
        f"xa {mgsm_accuracy(model, tok, mgsm['xa']):.2f}; Belebele dev "
        f"en {belebele_accuracy(model, tok, bele['en']):.2f} "
        f"xa {belebele_accuracy(model, tok, bele['xa']):.2f}",
        flush=True,
    )
    math_sft = pairs(read_rows(world, "data/sft/math_en.jsonl"))
    lang_sft = pairs(read_rows(world, "data/sft/lang_xa.jsonl"))
    for seed in args.sft_seeds:
        model, tok = load_base(world)
        sft(model, tok, math_sft, args.math_steps, args.lr, seed=seed)
        print(
            f"math SFT seed {seed}: MGSM dev en {mgsm_accuracy(model, tok, mgsm['en']):.2f} "
            f"xa {mgsm_accuracy(model, tok, mgsm['xa']):.2f} ({time.time() - t0:.0f}s)",
            flush=True,
        )
        model, tok = load_base(world)
        sft(model, tok, lang_sft, args.lang_steps, args.lr, seed=seed)
        print(
            f"lang SFT seed {seed}: Belebele dev xa {belebele_accuracy(model, tok, bele['xa']):.2f}"
            f" en {belebele_accuracy(model, tok, bele['en']):.2f}; "
            f"MGSM dev xa {mgsm_accuracy(model, tok, mgsm['xa']):.2f} ({time.time() - t0:.0f}s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
