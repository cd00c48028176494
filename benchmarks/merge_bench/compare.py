"""Whether two merges of the same recipe agree: mergekit's output folder against ours, tensor by
tensor (torch.equal for taken tensors, allclose for averaged ones), and the one-line summary
benchmarks/bench_merge.py prints of it. Not run on its own.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open


def _index(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors shard of `path` that holds it."""
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(f, "pt") as fh:
            out.update({k: f for k in fh.keys()})
    return out


def compare_outputs(ours: Path, theirs: Path, assembly: dict) -> dict:
    """Tensor-by-tensor comparison: torch.equal for taken tensors, allclose for averaged.

    Args:
        ours, theirs: the two merged checkpoint folders.
        assembly: tensor name -> its assembly op (engine.assembly_for); `take` is None when the
            tensor is averaged.
    Returns:
        counts, mismatches and "ok" (the report's "mergekit_vs_ours" block).
    """
    a, b = _index(ours), _index(theirs)
    res = {
        "same_names": sorted(a) == sorted(b),
        "only_ours": sorted(set(a) - set(b)),
        "only_mergekit": sorted(set(b) - set(a)),
        "taken": 0,
        "taken_equal": 0,
        "averaged": 0,
        "averaged_allclose": 0,
        "averaged_bit_equal": 0,
        "max_abs_diff_averaged": 0.0,
        "dtype_mismatch": [],
        "mismatch": [],
    }
    for name in sorted(set(a) & set(b)):
        with safe_open(a[name], "pt") as fa, safe_open(b[name], "pt") as fb:
            x, y = fa.get_tensor(name), fb.get_tensor(name)
        if x.dtype != y.dtype or x.shape != y.shape:
            res["dtype_mismatch"].append(f"{name}: {x.dtype}{list(x.shape)} vs {y.dtype}")
            continue
        if assembly[name].take is not None:
            res["taken"] += 1
            if torch.equal(x, y):
                res["taken_equal"] += 1
            else:
                res["mismatch"].append(name)
        else:
            res["averaged"] += 1
            diff = (x.float() - y.float()).abs().max().item() if x.numel() else 0.0
            res["max_abs_diff_averaged"] = max(res["max_abs_diff_averaged"], diff)
            # bf16 has 8 significand bits: one rounding step of the result is ~2**-8 relative.
            if torch.allclose(x.float(), y.float(), rtol=2**-7, atol=1e-6):
                res["averaged_allclose"] += 1
            else:
                res["mismatch"].append(name)
            res["averaged_bit_equal"] += int(torch.equal(x, y))
    res["ok"] = (
        res["same_names"]
        and not res["dtype_mismatch"]
        and not res["mismatch"]
        and res["taken"] + res["averaged"] == len(assembly)
    )
    return res


def summary_line(res: dict) -> str:
    """One line of a compare_outputs result: EQUAL or DIFFERENT, and the counts behind it."""
    verdict = "EQUAL" if res["ok"] else "DIFFERENT"
    return (
        f"{verdict}: {res['taken_equal']}/{res['taken']} taken tensors torch.equal, "
        f"{res['averaged_allclose']}/{res['averaged']} averaged allclose "
        f"({res['averaged_bit_equal']} bit-identical, max |diff| "
        f"{res['max_abs_diff_averaged']:.3g}); only ours {res['only_ours'][:3]}, "
        f"only mergekit {res['only_mergekit'][:3]}"
    )
