"""Matplotlib (Agg) figure helpers shared by the report sections; each returns PNG bytes.

Every figure carries a caption elsewhere (the report) saying what data it rests on.
"""

from __future__ import annotations

import io
import textwrap

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display
import matplotlib.pyplot as plt
import numpy as np


def to_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)  # constrained layout: no second "tight" pass
    plt.close(fig)
    return buf.getvalue()


def cell_digits(values: np.ndarray, lo: int = 2, hi: int = 4) -> int:
    """Decimals for a heatmap's cell labels: the fewest (from `lo`) at which cells that differ
    read different (0.744 and 0.736 are both "0.74" at two), at most `hi` (closer values are
    told apart by the colour scale, not the label)."""
    v = values[np.isfinite(values)]
    distinct = len(np.unique(np.round(v, hi)))
    return next((d for d in range(lo, hi) if len(np.unique(np.round(v, d))) == distinct), hi)


def fit_text(text: str, fig, fontsize: float) -> str:
    """`text` wrapped (at spaces) to the figure's width, so constrained layout, which moves axes
    but never shrinks a label, keeps a long title or axis label (an indicator's name) inside."""
    chars = int(fig.get_figwidth() * 72 * 0.85 / (0.6 * fontsize))  # ~0.6 em per character
    return "\n".join(_balanced(line, chars) for line in text.split("\n"))


def _balanced(line: str, chars: int) -> str:
    """`line` in as few lines of at most ~`chars` as it needs, of even length (no orphan word)."""
    if len(line) <= chars:
        return line
    n = -(-len(line) // chars)
    return textwrap.fill(line, -(-len(line) // n) + 4)


def heatmap(
    values: np.ndarray,
    xlabels: list[str],
    ylabels: list[str],
    *,
    title: str,
    cmap: str = "Greens",
    center: bool = False,
    annotate: bool = False,
    xlabel: str = "",
    ylabel: str = "",
    cbar_label: str = "",
    counts: np.ndarray | None = None,
    origin_lower: bool = True,
    vmin: float | None = None,
    vmax: float | None = None,
) -> bytes:
    """A labelled heatmap (NaN cells blank). center: symmetric diverging scale around 0;
    vmin/vmax: a fixed scale (e.g. 0..1 for fractions, comparable across experts)."""
    h = max(3.4, min(9.0, 0.28 * len(ylabels) + 1.5))
    w = max(4.8, min(10.0, 0.6 * len(xlabels) + 2.5))
    fig, ax = plt.subplots(layout="constrained", figsize=(w, h))
    v = np.ma.masked_invalid(values)
    kw = {"vmin": vmin, "vmax": vmax}
    if center:
        lim = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
        kw = {"vmin": -lim or -1, "vmax": lim or 1}
    im = ax.imshow(v, cmap=cmap, aspect="auto", origin="lower" if origin_lower else "upper", **kw)
    ax.set_xticks(range(len(xlabels)), xlabels, rotation=0 if len(xlabels) < 10 else 90)
    step = max(1, len(ylabels) // 32)
    ax.set_yticks(range(0, len(ylabels), step), ylabels[::step])
    ax.set_xlabel(fit_text(xlabel, fig, 10))
    ax.set_ylabel(ylabel)
    ax.set_title(fit_text(title, fig, 10), fontsize=10)
    cb = fig.colorbar(im, ax=ax)
    cb.set_label(cbar_label)
    if annotate and values.size <= 400:
        d = cell_digits(values)
        for (i, j), val in np.ndenumerate(values):
            if np.isfinite(val):
                txt = f"{val:.{d}f}" if counts is None else f"{val:.{d}f}\nn={int(counts[i, j])}"
                r, g, b, _ = im.cmap(im.norm(val))
                ink = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"  # legible
                ax.text(j, i, txt, ha="center", va="center", fontsize=7, color=ink)
    return to_png(fig)


def scatter(
    x: np.ndarray,
    y: np.ndarray,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    labels: list[str] | None = None,
    fit: bool = True,
) -> bytes:
    """A scatter plot with an optional least-squares line and point labels."""
    fig, ax = plt.subplots(layout="constrained", figsize=(4.6, 3.6))
    ax.scatter(x, y, s=22, alpha=0.8, color="tab:blue")
    if fit and len(x) >= 2 and np.ptp(x) > 0:
        a, b = np.polyfit(x, y, 1)
        xs = np.linspace(np.min(x), np.max(x), 20)
        ax.plot(xs, a * xs + b, color="tab:gray", lw=1, ls="--")
    if labels and len(labels) <= 25:
        for xi, yi, lab in zip(x, y, labels, strict=True):
            ax.annotate(lab, (xi, yi), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel(fit_text(xlabel, fig, 8), fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(fit_text(title, fig, 9), fontsize=9)
    ax.grid(alpha=0.3)
    return to_png(fig)


def best_so_far(
    objective: np.ndarray, *, title: str, ylabel: str, pruned: np.ndarray | None = None
) -> bytes:
    """Each trial's objective (dots) and the running best (line), in finishing order.

    Args:
        objective: one value per trial in finishing order (NaN for a pruned trial).
        pruned: True where the trial was pruned: marked on the x axis, with no objective.
    """
    fig, ax = plt.subplots(layout="constrained", figsize=(5.5, 3.4))
    xs = np.arange(1, len(objective) + 1)
    pruned = np.zeros(len(objective), bool) if pruned is None else np.asarray(pruned, bool)
    ax.scatter(xs[~pruned], objective[~pruned], s=12, alpha=0.6, label="trial")
    if pruned.any():
        # x in data, y in axes units: along the bottom edge, whatever the objective's range
        ax.scatter(xs[pruned], np.full(pruned.sum(), 0.03), marker="x", s=14, color="tab:gray",
                   transform=ax.get_xaxis_transform(), label="pruned (no objective)")  # fmt: skip
    best = np.fmax.accumulate(objective)  # a pruned trial keeps the best before it
    ax.plot(xs, best, color="tab:red", lw=1.5, drawstyle="steps-post", label="best so far")
    ax.set_xlabel("trial (finishing order, pruned included)" if pruned.any() else "trial (finishing order)")  # fmt: skip
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return to_png(fig)


def bars(names: list[str], values: list[float], *, title: str, xlabel: str) -> bytes:
    """Horizontal bars (largest on top)."""
    fig, ax = plt.subplots(layout="constrained", figsize=(5.0, max(2.0, 0.35 * len(names) + 1)))
    order = np.argsort(values)
    ax.barh([names[i] for i in order], [values[i] for i in order], color="tab:green")
    ax.set_xlabel(fit_text(xlabel, fig, 10))
    ax.set_title(fit_text(title, fig, 10), fontsize=10)
    return to_png(fig)
