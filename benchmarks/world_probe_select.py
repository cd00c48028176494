"""world_probe --select's readings: the swap the search's proxy would pick from the probe's grid,
and how well the proxy and each indicator alone rank the merges (Spearman with bootstrap CIs).
Run through benchmarks/world_probe.py.
"""

from __future__ import annotations

import numpy as np


def proxy_pick(proxy: dict[str, float], items: dict, better: str, resamples: int) -> dict:
    """Print the layer swap of the probe's grid with the best proxy objective (a stand-in for the
    search's pick, scored on the probe's split) and the Spearman correlation of proxy and xa
    MGSM over all merges.

    Args:
        proxy: merge name -> proxy objective (the base and experts left out).
        items: name -> per-item xa MGSM correctness on the probe's split.
        better: the better expert's name.
        resamples: bootstrap resamples.
    Returns:
        {"pick", "proxy": {name: objective}, "spearman": [rho, low, high], "n"}.
    """
    from layerswap.analysis.paired import paired_diff
    from layerswap.analysis.stats import correlate

    merges = list(proxy)
    swaps = [n for n in merges if n.startswith(("swap ", "paper default"))]  # the search's space
    pick = max(swaps, key=lambda n: proxy[n])  # the first of a tie
    print(f"\nbest swap by the search's proxy objective ({len(swaps)} layer swaps): {pick}, proxy {proxy[pick]:.3f}")  # fmt: skip
    for ref in (better, "base"):
        d, lo, hi = paired_diff(items[pick], items[ref], resamples, seed=0)
        print(f"  xa MGSM {items[pick].mean():.3f}, diff to {ref} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    rho = next(c for c in correlate([proxy[n] for n in merges], [items[n].mean() for n in merges], n_resamples=resamples) if c.method == "spearman")  # fmt: skip
    print(f"  Spearman(proxy, xa MGSM) over {rho.n} merges {rho.estimate:+.2f} [{rho.low:+.2f}, {rho.high:+.2f}]")  # fmt: skip
    # NaN (a constant side) as None: the JSON stays standard
    spearman = [None if np.isnan(v) else v for v in (rho.estimate, rho.low, rho.high)]
    return {"pick": pick, "proxy": proxy, "spearman": spearman, "n": rho.n}


def indicator_spearman(readings: dict[str, dict[str, float]], items: dict, resamples: int) -> dict:
    """Print and return each indicator's own Spearman correlation with xa MGSM over the merges.

    Args:
        readings: indicator -> {merge name: value} (the base and experts left out).
        items: name -> per-item xa MGSM correctness on the probe's split.
    Returns:
        {indicator: [rho, low, high]} (95 % bootstrap CI, analysis.stats.correlate).
    """
    from layerswap.analysis.stats import correlate

    out = {}
    for name, by_merge in readings.items():
        merges = list(by_merge)
        rho = next(c for c in correlate([by_merge[n] for n in merges], [items[n].mean() for n in merges], n_resamples=resamples) if c.method == "spearman")  # fmt: skip
        print(f"  Spearman({name}, xa MGSM) over {rho.n} merges {rho.estimate:+.2f} [{rho.low:+.2f}, {rho.high:+.2f}]")  # fmt: skip
        out[name] = [
            None if np.isnan(v) else v for v in (rho.estimate, rho.low, rho.high)
        ]  # strict JSON
    return out
