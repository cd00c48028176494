"""Stage 1 of the GPU check: what the machine is (GPU, driver, torch/CUDA and library versions)."""

from __future__ import annotations

import importlib.metadata as md
import platform
import subprocess

TITLE = "Environment"
LIBRARIES = ("transformers", "lm_eval", "ray", "peft", "optuna", "accelerate")


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def _nvidia_smi() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({type(e).__name__})"


def run(ctx) -> dict:
    import torch

    versions = {
        "device": ctx.gpu_name,
        "nvidia-smi (name, driver, memory)": _nvidia_smi() if ctx.device == "cuda" else "no GPU",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "CUDA (torch built with)": torch.version.cuda or "none (CPU build)",
        "cuDNN": str(torch.backends.cudnn.version()) if ctx.device == "cuda" else "—",
        "NCCL": ".".join(map(str, torch.cuda.nccl.version())) if ctx.device == "cuda" else "—",
        **{d: _version(d) for d in LIBRARIES},
        "layerswap": _version("layerswap"),
    }
    if ctx.device == "cuda":
        p = torch.cuda.get_device_properties(0)
        versions["GPU memory (GiB)"] = f"{p.total_memory / 2**30:.1f}"
        versions["compute capability"] = f"{p.major}.{p.minor}"
        versions["streaming multiprocessors"] = str(p.multi_processor_count)  # PCIe/SXM, MIG
        versions["bf16 supported"] = str(torch.cuda.is_bf16_supported())
    versions["bf16 peak FLOP/s (datasheet)"] = (
        f"{ctx.peak_flops:.3g}" if ctx.peak_flops else "unknown"
    )
    versions["memory cap (--memory-cap-gib)"] = ctx.memory_cap.get("note", "not set")
    versions["memory bandwidth B/s (datasheet)"] = f"{ctx.bandwidth:.3g}" if ctx.bandwidth else "unknown"  # fmt: skip
    return {"versions": versions, "figures": []}
