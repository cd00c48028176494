"""Where work runs: the one place a device name becomes a torch device, and the rules that keep
layerswap from quietly running a GPU job on the CPU.

A CUDA build that cannot talk to the node's driver makes `torch.cuda.is_available()` False; with
"auto" everything then runs on the CPU, an 8B model at a few tokens a second, and nothing says so.
So: an explicit CUDA device (`device: cuda`, `scaling.use_gpu`, a trial Ray gave a GPU) without a
usable GPU is an error at start; "auto" says which device it chose and why; and a model of
LARGE_ON_CPU parameters or more runs on a CPU only with LAYERSWAP_ALLOW_CPU=1 (which Ray workers
receive from the driver: trainables/ray_session.worker_env). Also the one rule for what counts
as a device running out of memory (`is_out_of_memory`), which every back-off and fit finding
uses. Tests: tests/trainables/test_devices.py, tests/trainables/evaluate/test_cuda_oom_backoff.py
"""

from __future__ import annotations

import os
import re

ALLOW_CPU = "LAYERSWAP_ALLOW_CPU"
# 1 B parameters: a forward pass of 2 GFLOP a token; an 8B model's ~16 GFLOP a token is
# minutes per MGSM item on a CPU. Every model of the embedded world is under a million.
LARGE_ON_CPU = 1_000_000_000
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


class DeviceUnusable(ValueError):
    """A GPU was asked for and cannot be used here, or a large model would run on the CPU."""


def cpu_allowed() -> bool:
    """True when the user opted in to CPU runs of GPU work (LAYERSWAP_ALLOW_CPU=1)."""
    return os.environ.get(ALLOW_CPU, "") == "1"


def cuda_missing(asked: bool = True) -> str:
    """Why torch sees no CUDA GPU here, in one line a user can act on.

    Args:
        asked: a GPU was asked for, so a CPU-only torch gets "install a CUDA build" as its hint;
            False where "auto" chose the CPU (the CPU wheel is what CPU users are told to install).
    """
    import torch

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    said = f"torch {torch.__version__} ({build}{seen}) sees no usable CUDA GPU"
    if torch.version.cuda:
        return f"{said}: the driver may be older than this torch build needs (nvidia-smi shows the driver's CUDA)"  # fmt: skip
    return f"{said}: install a CUDA build of torch" if asked else said


def require_cuda(what: str) -> None:
    """Raise unless CUDA is usable or the user allowed the CPU.

    Args:
        what: the setting that asked for a GPU, e.g. "scaling.use_gpu".
    Raises:
        DeviceUnusable (a ValueError) naming `what` and why CUDA is missing.
    """
    import torch

    if not torch.cuda.is_available() and not cpu_allowed():
        raise DeviceUnusable(f"{what} asks for a GPU, but {cuda_missing()}; set {ALLOW_CPU}=1 to run on the CPU instead")  # fmt: skip


def resolve_device(name: str | None = "auto") -> str:
    """The one place a device name becomes the torch device evaluation runs on.

    Args:
        name: "auto" (or None): "cuda" when torch sees a CUDA GPU, else "cpu"; or an explicit
            "cpu", "cuda", "cuda:N" or "mps".
    Returns:
        the torch device string.
    Raises:
        ValueError naming `name`: an unknown device, or a CUDA device torch cannot see (refused
        here rather than deep inside lm-eval, after the tasks have been indexed).
    """
    return explain_device(name)[0]


def explain_device(name: str | None = "auto") -> tuple[str, str]:
    """`resolve_device`, with why: (device, "auto: torch sees 1 CUDA GPU (NVIDIA H100 ...)")."""
    import torch

    if name is None or name == "auto":
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            return "cuda", f"auto: torch sees {n} CUDA GPU(s) ({_gpu_name()})"
        return "cpu", f"auto: {cuda_missing(asked=False)}"
    if not isinstance(name, str) or not _DEVICE.fullmatch(name):
        raise ValueError(f"device {name!r}: expected auto, cpu, cuda, cuda:N or mps")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: {cuda_missing()} (use auto or cpu)")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA GPU(s)")
    return name, "as configured"


def _gpu_name() -> str:
    """The first GPU's name, for a message; "unnamed" where the driver will not say."""
    import torch

    try:
        return torch.cuda.get_device_name(0)
    except (RuntimeError, AssertionError, AttributeError):
        return "unnamed"


def config_params(config) -> int:
    """Parameters of a transformers model config (counted on the meta device, no memory)."""
    # lazy: torch; this module is imported by the light CLI checks, which never count parameters
    from layerswap.trainables.train.model_shape import model_shape

    return sum(model_shape(config).params.values())


def check_cpu_size(n_params: int, device: str, what: str) -> None:
    """Refuse a large model on the CPU unless the user opted in.

    Args:
        n_params: the model's parameters.
        device: where it would run.
        what: the work, for the message (e.g. "promotion of meta-llama/Llama-3.1-8B").
    Raises:
        DeviceUnusable naming the work, its size and the opt-in.
    """
    if str(device).startswith("cpu") and n_params >= LARGE_ON_CPU and not cpu_allowed():
        raise DeviceUnusable(
            f"{what}: a {n_params / 1e9:.1f} B-parameter model would run on the CPU "
            f"(hours where a GPU takes minutes); set {ALLOW_CPU}=1 to run it there anyway"
        )


def free_cuda_bytes(device) -> int:
    """Bytes a CUDA device can still hand this process: the driver's free memory plus what
    PyTorch's caching allocator holds reserved but unused.

    A model built on the GPU and then given other weights (trainables/merge/live.py builds with
    random ones, then replaces every parameter) leaves its old storage cached: free to PyTorch,
    not to the driver, so `mem_get_info` alone under-reads by about one model. Counted rather than
    released with `empty_cache`: a read changes nothing for other models this process holds, and
    the allocator releases its cache and retries before it reports out-of-memory, so cached bytes
    serve an allocation of any size.

    Args:
        device: a CUDA device (torch.device or "cuda:N"); callers on other devices never ask.
    Returns:
        free bytes (under a memory cap that patches mem_get_info, the capped free plus the cache).
    """
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free) + max(0, int(cached))


# How a full GPU also shows, besides torch.OutOfMemoryError: a kernel's own allocation through
# C10_CUDA_CHECK ("CUDA error: out of memory", a plain RuntimeError), and cuBLAS failing to make
# its handle or workspace near the limit (lower case: compared with the message lowered).
OOM_TEXTS = ("out of memory", "cublas_status_alloc_failed")


def is_out_of_memory(e: BaseException) -> bool:
    """True for a device out-of-memory error (CUDA's, or an allocator's RuntimeError saying so):
    the one rule every back-off and every "does it fit" finding uses."""
    import torch

    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and says_out_of_memory(str(e))
    )


def says_out_of_memory(text: str) -> bool:
    """True when an error's text (as a failed trial records it) is a device out-of-memory."""
    low = text.lower()
    return any(t in low for t in OOM_TEXTS)
