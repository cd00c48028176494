"""The GPU check's arithmetic: figures beside their targets, and the ratios behind them.

FLOPs per token are counted by the plan's own rule (layerswap.study.estimate.forward_flops /
train_flops), so a measured FLOP/s is comparable with what `layerswap plan` assumes.

Pure functions (no torch), so tests/benchmarks/test_gpu_check.py checks every formula the
report rests on. A stage returns `Figure`s; the report sets each beside its target and beside
the figure layerswap assumed (spaces/throughput.yaml or a plan) and gives the verdict here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Dense bf16 tensor-core peak FLOP/s, HBM bandwidth (B/s) and streaming multiprocessors from the
# vendors' datasheets, by a substring of torch.cuda.get_device_name(); first match wins, so the
# specific names come first. The SM count tells apart what the name may not: an H100 PCIe (114
# SMs, 756 TFLOP/s) from an SXM5 (132, 989), and a MIG slice (a share of the SMs).
GPU_SPECS: list[tuple[str, float, float, int]] = [
    ("H100 PCIe", 756e12, 2.0e12, 114),
    ("H100 NVL", 835e12, 3.9e12, 132),
    ("H100", 989.4e12, 3.35e12, 132),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("H200 NVL", 835e12, 4.8e12, 132),  # same SMs as the SXM: told apart by name only
    ("H200", 989.4e12, 4.8e12, 132),
    ("A100", 312e12, 2.039e12, 108),  # 80 GB SXM
    ("L40S", 362e12, 0.864e12, 142),
    ("A10G", 70e12, 0.6e12, 80),
]


def gpu_spec(name: str, sms: int | None = None) -> tuple[float, float, str] | None:
    """(bf16 peak FLOP/s, memory bytes/s, which datasheet row and why) of a GPU; None when its
    name is not in the table.

    Args:
        name: torch.cuda.get_device_name().
        sms: the device's multi_processor_count, when known. Where it differs from the named
            row's, a row of the same family with that count is taken (an H100 that reports
            114 SMs is a PCIe card, whatever its name says), else both figures are scaled by
            the share of SMs (a MIG slice or a cut-down part).
    """
    rows = [r for r in GPU_SPECS if r[0].lower() in name.lower()]
    if not rows:
        return None
    key, flops, bw, full = rows[0]
    if sms is None or sms == full:
        return flops, bw, f"datasheet {key}" + (f" ({sms} SMs)" if sms else "")
    family = key.split()[0]
    twin = next((r for r in GPU_SPECS if r[0].split()[0] == family and r[3] == sms), None)
    if twin is not None:
        return twin[1], twin[2], f"datasheet {twin[0]}: {sms} SMs, although the name says {name!r}"
    share = sms / full
    return flops * share, bw * share, f"datasheet {key} x {sms}/{full} SMs (a MIG slice or a cut-down part)"  # fmt: skip


def gpu_family(name: str) -> str | None:
    """The GPU's family ("H100", "H200", "A100", ...): the first word of its GPU_SPECS row, so
    an "H100 PCIe" and an "H100 80GB HBM3" are one family; None when the name has no row.
    A throughput profile is named by it in lower case (throughput.profile_for)."""
    row = next((r for r in GPU_SPECS if r[0].lower() in name.lower()), None)
    return row[0].split()[0] if row else None


@dataclass(frozen=True)
class Target:
    """A bound a figure should meet: `value op bound` (op is ">=" or "<=")."""

    op: str
    bound: float

    def __post_init__(self):
        if self.op not in (">=", "<="):
            raise ValueError(f"target op must be '>=' or '<=', got {self.op!r}")

    def met(self, value: float) -> bool:
        return value >= self.bound if self.op == ">=" else value <= self.bound

    def __str__(self) -> str:
        return f"{'≥' if self.op == '>=' else '≤'} {fmt(self.bound)}"


@dataclass
class Figure:
    """One measured figure of a stage.

    Args:
        name: what it is, in words ("evaluator speed-up vs HFLM at its best batch").
        value: the measurement (None: not measured, e.g. a peak FLOP/s share on CPU).
        unit: "x", "s", "GiB", "share", "FLOP/s", ...
        target: the issue's target, when there is one.
        assumed: what layerswap assumed for it (throughput.yaml, a memory plan), when it did.
        note: how it was measured, in a few words.
    """

    name: str
    value: float | None
    unit: str = ""
    target: Target | None = None
    assumed: float | None = None
    note: str = ""

    @property
    def verdict(self) -> str:
        """'met', 'missed', 'not measured' or '' (no target)."""
        if self.target is None:
            return ""
        if self.value is None:
            return "not measured"
        return "met" if self.target.met(self.value) else "missed"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["target"] = None if self.target is None else asdict(self.target)
        d["verdict"] = self.verdict
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Figure:
        t = d.get("target")
        return cls(
            d["name"], d.get("value"), d.get("unit", ""), Target(**t) if t else None,
            d.get("assumed"), d.get("note", ""),
        )  # fmt: skip


def fmt(x: float | None) -> str:
    """A figure in 3-4 significant digits; large and tiny ones in scientific notation."""
    if x is None:
        return "—"
    if x == 0 or 1e-3 <= abs(x) < 1e5:
        return f"{x:.4g}"
    return f"{x:.3g}"


# ------------------------------------------------------------------------------ the ratios


def speedup(theirs_s: float, ours_s: float) -> float:
    """How many times faster ours is: their seconds / our seconds (> 1: ours is faster)."""
    if ours_s <= 0:
        raise ValueError(f"our seconds must be > 0, got {ours_s}")
    return theirs_s / ours_s


def share(part: float, whole: float) -> float | None:
    """part / whole, None when whole is 0."""
    return part / whole if whole else None


def peak_share(flops_per_s: float, peak_flops_per_s: float | None) -> float | None:
    """Achieved FLOP/s as a share of the device's peak (MFU); None without a known peak."""
    return flops_per_s / peak_flops_per_s if peak_flops_per_s else None


def decode_bound_s(weight_bytes: float, bandwidth: float | None) -> float | None:
    """Seconds one decoding step needs at least: every weight read once from device memory."""
    return weight_bytes / bandwidth if bandwidth else None


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: +0.1 means the prediction is 10 % high."""
    if measured == 0:
        raise ValueError("measured value is 0; relative error undefined")
    return (predicted - measured) / measured


def per_hour(seconds_each: float) -> float:
    """How many of something taking `seconds_each` fit in an hour."""
    if seconds_each <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds_each}")
    return 3600.0 / seconds_each
