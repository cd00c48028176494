"""How reproducible an expert's weight change is, and how it relates to another expert's: for
two checkpoints A and B fine-tuned from one base, the cosine between their ΔW rows
(ΔW = W_ckpt - W_base, each row of each 2-D layer parameter) and each one's row MAV, averaged
per depth region (bottom quarter / middle half / top quarter) and column group (attention, MLP).

Two runs of one expert that differ only in data order give the part of ΔW the training signal
fixes (cosine near 1: every run moves the weights the same way); a math and a language expert
give how much their changes overlap (near 0: orthogonal). With near-uniform row MAVs and
reproducible directions, a magnitude map such as the paper's Fig. 2 has nothing to localise.

Run: `python benchmarks/delta_consistency.py --base WORLD/base --pair A B [--pair A B ...]`
(checkpoint folders of full fine-tunes; safetensors only), or with
`--world W --out DIR` first train a math and a language expert per `--sft-seeds` by world.sft
(the shipped configs' lr 3e-5 and 300 steps; 84-92 s each on one core here) and compare the two
runs of each expert and the two experts of the first seed. Smoke run (tests/benchmarks/
test_delta_consistency.py, seconds): `--world TINY_WORLD --out DIR --steps 2`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from layerswap.analysis.delta import GROUPS, REGIONS, TYPES, depth_regions, param_type
from layerswap.trainables.merge.arch import param_slot
from layerswap.trainables.merge.checkpoint import Checkpoint


def _label(path: Path) -> str:
    """A checkpoint folder's short name, e.g. "world_math_full/samples_000004800"."""
    return f"{path.parent.name}/{path.name}"


def _deltas(cks: tuple[Checkpoint, Checkpoint, Checkpoint], name: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """ΔW of A and B for one tensor of the base, [rows, cols] float64; checked from the headers
    (present, same shape) before anything is read, and finite after."""
    base, *pair = cks
    shape = base.tensors[name].shape
    for ck in pair:
        info = ck.tensors.get(name)
        if info is None:
            raise ValueError(f"{ck.root}: tensor {name} missing (not a full fine-tune of the base?)")  # fmt: skip
        if info.shape != shape:
            raise ValueError(f"{ck.root}: tensor {name} has shape {tuple(info.shape)}, the base {tuple(shape)}")  # fmt: skip
    w = base.read(name).double().view(shape)
    da, db = (ck.read(name).double().view(shape) - w for ck in pair)
    for ck, d in zip(pair, (da, db), strict=True):
        if not torch.isfinite(d).all():
            raise ValueError(f"{ck.root}: tensor {name} has non-finite values")
    return da, db


def pair_stats(base: Path, a: Path, b: Path) -> dict[str, dict[str, dict[str, float]]]:
    """Mean row cosine(ΔW_a, ΔW_b) and mean row MAV of each, per column group and depth region
    (each tensor's mean over its rows, then the unweighted mean over the region's tensors).

    Args:
        base: the base checkpoint folder (safetensors, read as analysis.delta reads them).
        a, b: two full fine-tunes of it.
    Returns:
        {"cosine" | "mav_a" | "mav_b": {group: {region: value}}}, regions as
        analysis.delta.depth_regions cuts them.
    Raises:
        ValueError: a folder that is no checkpoint; a layer projection missing from A or B, of
            another shape or non-finite (named); no layer projections at all.
    """
    cells: dict[tuple[int, str], tuple[float, float, float]] = {}
    with Checkpoint.open(base) as cb, Checkpoint.open(a) as ca, Checkpoint.open(b) as cc:
        for name, info in cb.tensors.items():
            kind, layer = param_type(name), param_slot(name).layer
            if kind not in TYPES or layer is None or len(info.shape) != 2:
                continue
            da, db = _deltas((cb, ca, cc), name)
            cos = torch.nn.functional.cosine_similarity(da, db, dim=1)  # [rows]
            cells[layer, kind] = (cos.mean().item(), da.abs().mean().item(), db.abs().mean().item())  # fmt: skip
    if not cells:
        raise ValueError(f"{base}: no decoder-layer projections (q/k/v/o, gate/up/down) found")
    depth = 1 + max(layer for layer, _ in cells)
    out = {}
    for col, stat in enumerate(("cosine", "mav_a", "mav_b")):
        grid = np.full((depth, len(TYPES)), np.nan)  # [L, types], as analysis.delta's fractions
        for (layer, kind), values in cells.items():
            grid[layer, TYPES.index(kind)] = values[col]
        out[stat] = depth_regions(grid, list(TYPES))
    return out


def train_pairs(world: Path, out: Path, seeds: list[int], lr: float, steps: int) -> list[tuple[Path, Path]]:  # fmt: skip
    """Train math and language experts per seed by world.sft into checkpoint folders under
    `out` (kept if already there).

    Returns:
        the pairs to compare: each expert's two seeds, then math vs language of the first seed.
    """
    from layerswap.trainables.atomic import atomic_dir
    from layerswap.world.model import save_model
    from layerswap.world.sft import load_base, pairs, read_rows, sft

    made = {}
    for seed in seeds:
        for kind, data in (("math", "math_en"), ("language", "lang_xa")):
            path = made[kind, seed] = out / f"{kind}_seed{seed}"
            if path.exists():
                continue
            model, tok = load_base(world)
            sft(model, tok, pairs(read_rows(world, f"data/sft/{data}.jsonl")), steps, lr, seed=seed)  # fmt: skip
            with atomic_dir(path) as tmp:  # a killed run leaves no half-written expert
                save_model(model, tok, tmp)
            print(f"trained {path.name}", flush=True)
    a, b = seeds[0], seeds[1]
    return [(made["language", a], made["language", b]), (made["math", a], made["math", b]),
            (made["math", a], made["language", a])]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Train (with --world), then print the table of every pair; exit 2 naming bad input."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="the base checkpoint folder (default: WORLD/base)")
    ap.add_argument("--pair", nargs=2, type=Path, action="append", default=[], metavar=("A", "B"),
                    help="two checkpoints fine-tuned from the base (repeatable)")  # fmt: skip
    ap.add_argument("--world", type=Path, help="a built world: train experts by world.sft first")
    ap.add_argument("--out", type=Path, help="where --world's experts go (reused when there)")
    ap.add_argument("--sft-seeds", type=int, nargs=2, default=[0, 1], help="data-order seeds")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args(argv)
    if args.world is not None:
        if args.base is not None:
            ap.error("--world trains from WORLD/base: give --base only without --world")
        if args.out is None:
            ap.error("--world needs --out (where the trained experts go)")
        torch.set_num_threads(1)  # fixed, as the world's pretraining: reductions depend on it
        args.pair = train_pairs(args.world, args.out, args.sft_seeds, args.lr, args.steps) + args.pair  # fmt: skip
        args.base = args.world / "base"
    if args.base is None or not args.pair:
        ap.error("give --base and --pair A B, or --world W --out DIR")
    try:  # every pair measured before anything prints: a bad one leaves no half table
        stats = [pair_stats(args.base, a, b) for a, b in args.pair]
    except (ValueError, OSError) as e:
        ap.exit(2, f"delta_consistency: {e}\n")
    head = " | ".join(f"{g} {r}" for g in GROUPS for r in REGIONS)
    print(f"| A | B | reading | {head} |")
    print("|---|---|---|" + "---|" * (len(GROUPS) * len(REGIONS)))
    for (a, b), st in zip(args.pair, stats, strict=True):
        for stat, label in (("cosine", "row cosine"), ("mav_a", "row MAV of A"), ("mav_b", "row MAV of B")):  # fmt: skip
            cells = " | ".join(f"{st[stat][g][r]:.3g}" for g in GROUPS for r in REGIONS)
            print(f"| {_label(a)} | {_label(b)} | {label} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
