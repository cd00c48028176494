"""Stage 1 of the GPU check: what the machine is (GPU, driver, torch/CUDA and library versions)."""

from __future__ import annotations

import importlib.metadata as md
import platform
import subprocess
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: no versions compared
    tomllib = None

TITLE = "Environment"
LIBRARIES = ("transformers", "lm_eval", "ray", "peft", "optuna", "accelerate")
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


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


def outside_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """One note per installed dependency whose version pyproject.toml does not allow.

    The lent GPU machine runs its image's own torch and transformers (the project is installed
    there without its dependencies), so a figure may be of another version than CI tests.
    """
    if tomllib is None:
        return ["versions not compared with pyproject.toml (Python 3.10 has no tomllib)"]
    notes = []
    for line in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        found = _version(req.name)
        if found != "not installed" and not req.specifier.contains(found, prereleases=True):
            notes.append(
                f"{req.name} {found} is outside pyproject.toml's {req.name}{req.specifier}: "
                "every figure here is of the installed version, not the one CI tests"
            )
    return notes


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
    return {"versions": versions, "figures": [], "notes": outside_requirements()}
