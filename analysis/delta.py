"""Where an expert changed (ICLR paper Fig. 2 / A.5): row-wise mean |ΔW| of every 2-D layer
parameter against the base, streamed from safetensors a row chunk at a time.

`row_mav(expert, base)` never holds more than one chunk of each model (~4M elements); the
fractions of rows above a threshold form the heatmap, `depth_regions` sums them up the way the
paper describes its figure (bottom / middle / top layers, attention / MLP), and
`suggest_boundaries` turns the math-minus-language contrast into a layer-swap warm start (b, u).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from layerswap.trainables.merge.arch import param_slot
from layerswap.trainables.merge.checkpoint import Checkpoint

# An expert that equals its base in this share of its layer weights or more is reported as
# rounded away: real fine-tuning moves nearly every weight (the world's experts: < 1 % equal).
ROUNDED_AWAY = 0.95
CHUNK_ELEMS = 4 * 1024 * 1024  # elements read per tensor per step (≈8 MB of bf16)
# Parameter types in the paper's column order; aliases cover Meta's original Llama naming.
TYPES = ("q", "k", "v", "o", "gate", "up", "down")
_ALIASES = {"wq": "q", "wk": "k", "wv": "v", "wo": "o", "w1": "gate", "w3": "up", "w2": "down"}
_MODULE = re.compile(r"\.([A-Za-z0-9_]+)\.weight$")
# The default per-expert threshold: this quantile of the expert's row MAVs, i.e. a row "changed"
# when it is among the expert's top 10 % of changes. Why not the median: with Adam every
# parameter moves by roughly the learning rate per step, so row MAVs sit in a narrow band (the
# world's v4 demo experts: 10th-90th percentile 0.7e-3 to 1.4e-3); at the median half of each
# map is marked and the layers differ faintly, while the paper's maps are sparse.
DEFAULT_QUANTILE = 0.9
# Column groups of the paper's figure ("the left four columns" / "the right three").
GROUPS = {"attention": ("q", "k", "v", "o"), "MLP": ("gate", "up", "down")}
REGIONS = ("bottom quarter", "middle half", "top quarter")


def param_type(name: str) -> str | None:
    """`model.layers.3.self_attn.q_proj.weight` -> "q"; None for names of no module weight."""
    m = _MODULE.search(name)
    if m is None:
        return None
    mod = m.group(1)
    mod = mod[: -len("_proj")] if mod.endswith("_proj") else mod
    return _ALIASES.get(mod, mod)


@dataclass
class DeltaMap:
    """Row MAVs of one expert's ΔW: mav[(layer, type)] is a [rows] float64 array."""

    expert: str
    base: str
    num_layers: int
    types: list[str]
    mav: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)
    elements: int = 0  # weights compared
    unchanged: int = 0  # of those, bit-equal to the base's

    @property
    def unchanged_share(self) -> float:
        """Share of the compared weights that equal the base's exactly."""
        return self.unchanged / self.elements if self.elements else 0.0

    def rounded_away(self) -> str | None:
        """A warning when the expert equals its base in almost every weight (ROUNDED_AWAY):
        updates smaller than the checkpoint dtype's step were lost when it was saved."""
        if self.elements == 0 or self.unchanged_share < ROUNDED_AWAY:
            return None
        return (
            f"{self.expert} equals its base in {self.unchanged_share:.2%} of its "
            f"{self.elements:,} layer weights: its updates were likely rounded away when the "
            "checkpoint was saved in the base's dtype (at the papers' learning rates a bf16 "
            "step is larger than most updates); train with precision.checkpoint_dtype: fp32"
        )

    def row_quantiles(self, qs) -> np.ndarray:
        """Quantiles of the row MAVs over all of this expert's 2-D layer parameters.

        Args:
            qs: a quantile in [0, 1] or a sequence of them.
        Returns:
            np.quantile's answer (a 0-d array for one quantile).
        """
        allrows = np.concatenate(list(self.mav.values())) if self.mav else np.zeros(1)
        return np.quantile(allrows, qs)

    def threshold_auto(self, quantile: float = DEFAULT_QUANTILE) -> float:
        """The default threshold: the `quantile` of this expert's row MAVs, so "changed" is
        relative to the expert's own changes (the paper picks a per-expert absolute threshold
        by eye; a quantile makes experts comparable). Returns the threshold."""
        return float(self.row_quantiles(quantile))

    def fractions(self, threshold: float | None = None, quantile: float = DEFAULT_QUANTILE) -> np.ndarray:  # fmt: skip
        """[num_layers, len(types)] fraction of rows whose MAV exceeds `threshold` (strictly);
        NaN where the model has no such parameter. threshold None: `threshold_auto(quantile)`."""
        thr = self.threshold_auto(quantile) if threshold is None else threshold
        out = np.full((self.num_layers, len(self.types)), np.nan)
        for (layer, t), rows in self.mav.items():
            out[layer, self.types.index(t)] = float((rows > thr).mean())
        return out


def row_mav(expert: str | Path, base: str | Path, chunk_elems: int = CHUNK_ELEMS) -> DeltaMap:
    """Row-wise mean |W_expert - W_base| of every 2-D per-layer parameter, streamed.

    Args:
        expert, base: checkpoint folders (safetensors; same architecture and tensor shapes).
        chunk_elems: elements read per tensor per step; peak memory is a few times this.
    Returns:
        The DeltaMap (computed in float32 from the checkpoints' dtype).
    Raises:
        ValueError naming the folder and tensor for LoRA adapters, missing tensors or shape
        mismatches.
    """
    expert, base = Path(expert), Path(base)
    if (expert / "adapter_config.json").exists():
        raise ValueError(f"{expert}: a LoRA adapter; ΔW maps need full checkpoints")
    # One intra-op thread: the work is memory-bound elementwise ops on small chunks, and torch's
    # thread pool made it 10x slower on a loaded 2-core machine (measured: 8.0 s vs 0.7 s).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _row_mav(expert, base, chunk_elems)
    finally:
        torch.set_num_threads(threads)


def _row_mav(expert: Path, base: Path, chunk_elems: int) -> DeltaMap:
    with Checkpoint.open(expert) as ex, Checkpoint.open(base) as bs:
        names = []
        for name, info in ex.tensors.items():
            slot = param_slot(name)
            t = param_type(name)
            if slot.layer is None or len(info.shape) != 2 or t is None:
                continue
            if name not in bs.tensors:
                raise ValueError(f"{base}: has no tensor {name!r} (present in {expert})")
            if bs.tensors[name].shape != info.shape:
                raise ValueError(
                    f"tensor {name!r}: shape {list(info.shape)} in {expert} but "
                    f"{list(bs.tensors[name].shape)} in {base}"
                )
            names.append((slot.layer, t, name))
        if not names:
            raise ValueError(f"{expert}: no 2-D per-layer parameters found")
        depth = ex.config.get("num_hidden_layers")
        num_layers = depth if isinstance(depth, int) else 1 + max(n[0] for n in names)
        found = {t for _, t, _ in names}
        types = [t for t in TYPES if t in found] + sorted(found - set(TYPES))
        dm = DeltaMap(str(expert), str(base), num_layers, types)
        for layer, t, name in names:
            rows, cols = ex.tensors[name].shape
            step = max(1, chunk_elems // max(cols, 1))
            out = np.empty(rows, dtype=np.float64)
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                a = ex.read(name, r0 * cols, (r1 - r0) * cols).float()
                b = bs.read(name, r0 * cols, (r1 - r0) * cols).float()
                dm.unchanged += int((a == b).sum())
                dm.elements += a.numel()
                a.sub_(b).abs_()
                out[r0:r1] = a.view(r1 - r0, cols).mean(dim=1).double().numpy()
                del a, b
            if not np.isfinite(out).all():  # a diverged expert: a NaN would empty every map
                bad = int(np.flatnonzero(~np.isfinite(out))[0])
                raise ValueError(f"{expert}: tensor {name!r} row {bad} differs from {base} by a non-finite amount (NaN or inf weights)")  # fmt: skip
            dm.mav[(layer, t)] = out
    return dm


def depth_regions(frac: np.ndarray, types: list[str]) -> dict[str, dict[str, float]]:
    """The heatmap read the way the paper describes its Fig. 2: the mean fraction of rows
    changed per column group (attention q/k/v/o, MLP gate/up/down) over the bottom quarter,
    middle half and top quarter of the layers (quarter = max(1, L // 4) layers).

    Args:
        frac: [L, len(types)] fractions, as from DeltaMap.fractions.
        types: the column names of `frac`.
    Returns:
        {group: {region: mean fraction}}; NaN where a group or region is empty.
    """
    num = frac.shape[0]
    q = max(1, num // 4)
    # The top starts after the bottom, so one layer is the bottom quarter only (top: NaN).
    rows = {REGIONS[0]: slice(0, q), REGIONS[1]: slice(q, num - q), REGIONS[2]: slice(max(q, num - q), num)}  # fmt: skip
    out: dict[str, dict[str, float]] = {}
    for group, members in GROUPS.items():
        cols = [types.index(t) for t in members if t in types]
        out[group] = {}
        for region, sl in rows.items():
            cell = frac[sl][:, cols] if cols else np.empty((0, 0))
            out[group][region] = float(np.nanmean(cell)) if np.isfinite(cell).any() else float("nan")  # fmt: skip
    return out


@dataclass(frozen=True)
class Boundaries:
    bottom: int  # b: layers [0, b) to the language expert
    top: int  # u: layers [L-u, L) to the language expert
    dominance: list[float]  # per layer: mean over types of (language fraction - math fraction)

    @property
    def is_warm_start(self) -> bool:
        """Whether the split looks like a layer swap: the papers' swaps give the language
        expert some layers but keep most with the math expert (b 3-5, u 0-2 of 32), so a split
        giving it none, or more than half, means the maps lack the language-outside /
        math-inside pattern."""
        return 0 < self.bottom + self.top <= len(self.dominance) // 2


def suggest_boundaries(lang: np.ndarray, math: np.ndarray) -> Boundaries:
    """The layer-swap boundaries (b, u) the ΔW maps suggest.

    Rule: per layer l, the language dominance d_l is the mean over parameter types of
    (fraction of the language expert's rows changed - fraction of the math expert's rows
    changed). Layer swapping gives a bottom block [0, b) and a top block [L-u, L) to the
    language expert and the middle to the math expert; we choose the (b, u) that agrees most
    with d, i.e. maximises  sum_{l in language blocks} d_l - sum_{l in middle} d_l, subject to
    b + u <= L - 1 (at least one math layer). Ties go to the smallest b + u, then smallest b.
    When the language expert changed the bottom and top layers most (as in the paper), this
    returns exactly the extent of those runs.

    Args:
        lang, math: [L, types] fraction matrices (as from DeltaMap.fractions), same shape.
    Returns:
        Boundaries(bottom, top, dominance).
    """
    if lang.shape != math.shape:
        raise ValueError(f"ΔW maps differ in shape: {lang.shape} vs {math.shape}")
    d = np.nanmean(lang - math, axis=1)
    d = np.nan_to_num(d)
    num = len(d)
    total = d.sum()
    prefix = np.concatenate([[0.0], np.cumsum(d)])
    best = None
    for b in range(num):
        for u in range(num - b):
            lang_sum = prefix[b] + (total - prefix[num - u])
            score = 2 * lang_sum - total  # = lang_sum - (total - lang_sum)
            key = (-round(score, 12), b + u, b)
            if best is None or key < best[0]:
                best = (key, b, u)
    _, b, u = best
    return Boundaries(int(b), int(u), [float(v) for v in d])
