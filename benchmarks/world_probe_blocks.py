"""world_probe's block-by-block readings: where each expert's gain lives (--attribution: the
base plus one expert's ΔW in one block; --per-layer: the math expert with one block reverted to
the base or taken from the language expert). Run through benchmarks/world_probe.py.
"""

from __future__ import annotations


def _with_block(state: dict, donor: dict, block: int | None) -> dict:
    """`state` with one block (a layer index, or None: the non-layer weights) from `donor`."""
    from layerswap.trainables.merge.arch import layer_index

    return {k: donor[k] if layer_index(k) == block else v for k, v in state.items()}


def _block_name(block: int | None) -> str:
    return "non-layer" if block is None else str(block)


def per_layer(states: dict, depth: int, score) -> None:
    """Print each expert's relative ΔW per block, then `score` (-> (xa, en) MGSM) of the math
    expert with one block (a layer, or the non-layer weights) from the base or the language
    expert."""
    from layerswap.trainables.merge.arch import layer_index

    blocks = [*range(depth), None]
    base = states["base"]
    for expert in ("math", "language"):
        sq = {b: [0.0, 0.0] for b in blocks}
        for k, v in states[expert].items():
            sq[layer_index(k)][0] += float((v.float() - base[k].float()).pow(2).sum())
            sq[layer_index(k)][1] += float(base[k].float().pow(2).sum())
        rel = "  ".join(f"{_block_name(b)}:{(d / max(n, 1e-12)) ** 0.5:.4f}" for b, (d, n) in sq.items())  # fmt: skip
        print(f"relative ΔW, {expert}: {rel}")
    xa0, en0 = score(states["math"])
    print(f"\nmath expert xa / en MGSM {xa0:.3f} / {en0:.3f}; with one block from ...")
    for b in blocks:
        cells = []
        for donor in ("base", "language"):
            xa, en = score(_with_block(states["math"], states[donor], b))
            cells.append(f"{donor} {xa:.3f} / {en:.3f}")
        print(f"  {_block_name(b):<10} " + "   ".join(cells))


def attribution(states: dict, depth: int, score, read) -> dict:
    """Print `score` (-> (xa, en) MGSM) and `read` (-> xa Belebele dev Brier, lower is better)
    of the base with one expert's ΔW in one block only.

    A swap can only combine what each expert's gain is made of block by block: if no single
    block (nor a few) carries the gain, no layer swap keeps it; and where the language expert's
    reading gain lives says which blocks a swap should take from it.
    Returns:
        {"base": [xa, en, brier], expert: {block name: [xa, en, brier]}} for the JSON.
    """
    xa0, en0 = score(states["base"])
    br0 = read(states["base"])
    out: dict = {"base": [xa0, en0, br0]}
    print(f"\nbase xa / en MGSM / xa Belebele Brier {xa0:.3f} / {en0:.3f} / {br0:.3f}; base + one expert's ΔW in one block:")  # fmt: skip
    for expert in ("math", "language"):
        out[expert] = {}
        print(f"  {expert}:")
        for b in [*range(depth), None]:
            state = _with_block(states["base"], states[expert], b)
            xa, en = score(state)
            out[expert][_block_name(b)] = [xa, en, read(state)]
            print(f"    {_block_name(b):<10} {xa:.3f} / {en:.3f} / {out[expert][_block_name(b)][2]:.3f}")  # fmt: skip
    return out
