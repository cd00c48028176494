"""What every GPU-check stage shares: the run context (device, deadline, shapes, the tiny world
whose tokenizer the 8B shapes borrow) and small measuring helpers.

Not run on its own; benchmarks/gpu_check/run.py builds a Context and hands it to each stage.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_check.figures import Figure

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "benchmarks"):  # layerswap from the tree; shapes.py
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

GIB = 2**30
# Llama-3.1-8B's vocabulary: the 8B checks build their models with it, whatever the tokenizer,
# so the embedding, the lm_head and the [batch, tokens, vocab] logits have their real sizes.
REAL_VOCAB = 128_256


@dataclass
class Context:
    """One check run.

    Args:
        out: the run's folder (each stage writes NN_stage.json into it).
        smoke: tiny shapes on whatever device there is (CI), instead of the 8B shapes on a GPU.
        device: "cuda" or "cpu".
        deadline: time.monotonic() by which the whole check should end.
        world: a built tiny world (its tokenizer and proxy tasks).
        gpu_name: torch.cuda.get_device_name(), or a CPU description.
        peak_flops: the GPU's dense bf16 peak (figures.gpu_spec), None when unknown or on CPU.
        bandwidth: the GPU's memory bytes/s, likewise.
        assumed: the spaces/throughput.yaml Profile whose figures the report sets beside the
            measured ones (the GPU's own: throughput.assumed_profile); None when there is none.
        memory_cap: how the device memory was capped (`MemoryCap.record`), recorded by the
            environment stage and the report.
        kept: the running stage's parts finished so far ({"parts", "result"}: `keep`); None
            before its first. run.py resets it before each stage and writes it into the stage's
            record when the stage fails or is cut, so a finished part outlives a later one.
        on_keep: called after each `keep` (run.py: writes the stage's record and the report),
            so a part survives even a SIGKILL.
    """

    out: Path
    smoke: bool
    device: str
    deadline: float
    world: Path
    gpu_name: str
    peak_flops: float | None = None
    bandwidth: float | None = None
    assumed: Any = None
    notes: list[str] = field(default_factory=list)
    memory_cap: dict = field(default_factory=dict)
    kept: dict | None = None
    on_keep: Callable[[], None] | None = None

    def keep(self, part: str, result: dict | Callable[[], dict]) -> None:
        """Record that `part` of the running stage finished, with the stage's result as it now
        stands (the dict `run` would return: figures, notes, throughput, raw numbers), or a
        function that builds it (called here, its errors caught).

        The result is copied as JSON at once (later changes to it do not leak in), and the
        copy replaced in one assignment, so a signal (run.Cut) between bytecodes leaves either
        the previous parts or these. Never raises into the stage: a result that cannot be
        built or copied, or an `on_keep` that fails, is noted and the stage goes on.
        """
        try:
            res = result() if callable(result) else result
            snapshot = json.loads(json.dumps(as_result(res), default=str))
        except Exception as e:  # the part's figures are lost, the stage is not
            self.notes.append(f"keep({part!r}) could not build or copy the result: {type(e).__name__}: {e}"[:500])  # fmt: skip
            return
        parts = (self.kept or {}).get("parts", [])
        parts = parts if part in parts else [*parts, part]  # a part kept again, grown, is one
        self.kept = {"parts": parts, "result": snapshot}
        if self.on_keep is not None:
            try:
                self.on_keep()
            except Exception as e:  # the next keep, or the stage's end, writes it again
                self.notes.append(f"writing the kept part {part!r} failed: {type(e).__name__}: {e}"[:500])  # fmt: skip

    @property
    def shape(self) -> str:
        """The benchmarks/shapes.py shape the model stages build."""
        return "llama-tiny" if self.smoke else "llama-8b"

    def remaining(self) -> float:
        """Seconds left before the deadline."""
        return self.deadline - time.monotonic()

    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.world / "base")

    def config(self, depth: int | None = None, vocab: int | None = None):
        """A LlamaConfig of the run's shape; the real vocabulary at 8B unless `vocab` is given."""
        from shapes import shape_config

        cfg = shape_config(self.shape, self.tokenizer(), depth)
        if vocab is not None:
            cfg.vocab_size = vocab
        elif not self.smoke:
            cfg.vocab_size = REAL_VOCAB
        return cfg


# The targets are an H100 80 GB's. On a larger GPU (an H200: 139 GiB) the check caps its
# own memory at this by default (--memory-cap-gib), so what fits (promotion's batches, the trials'
# layers on the device, layerswap's own placement and batch rules) is answered as on an H100.
# An H100 80GB reports 79.1-79.6 GiB to torch: a case within ~1 GiB of the cap is marginal.
H100_GIB = 80.0


def cap_plan(total_bytes: int | None, cap_gib: float | None) -> dict:
    """How the check caps the device's memory (pure arithmetic; `apply_memory_cap` applies it).

    Args:
        total_bytes: the device's total memory (torch's total_memory); None without CUDA.
        cap_gib: --memory-cap-gib: None for the default (H100_GIB on a device with more), 0
            for no cap.
    Returns:
        {"cap_gib", "total_gib", "fraction": cap / total or None, "applied", "note"}.
    """
    if total_bytes is None:
        return {"cap_gib": cap_gib, "total_gib": None, "fraction": None, "applied": False,
                "note": "memory cap: not applicable (no CUDA device)"}  # fmt: skip
    total = total_bytes / GIB
    cap = H100_GIB if cap_gib is None else cap_gib
    plan = {"cap_gib": cap, "total_gib": total, "fraction": None, "applied": False}
    if cap == 0:
        return plan | {"cap_gib": None, "note": f"memory cap: none (--memory-cap-gib 0): the device's {total:.1f} GiB"}  # fmt: skip
    if cap >= total:
        return plan | {"note": f"memory cap: none, the device's {total:.1f} GiB is within {cap:g} GiB"}  # fmt: skip
    why = "the issue's H100 80 GB; --memory-cap-gib 0 for none" if cap_gib is None else "--memory-cap-gib"  # fmt: skip
    return plan | {"fraction": cap / total, "applied": True,
                   "note": f"memory capped at {cap:g} of the device's {total:.1f} GiB ({why}): "
                   "set_per_process_memory_fraction, and torch.cuda.mem_get_info answers as "
                   "for a device of that size, so what fits is what fits in it"}  # fmt: skip


def apply_memory_cap(plan: dict) -> None:
    """Cap this process's CUDA memory by `plan` (`cap_plan`; nothing when not "applied"): the
    caching allocator's limit, and torch.cuda.mem_get_info, which layerswap's placement
    (merge/live.py) and batch rules (evaluate/fit.py) read and the fraction does not change,
    answering (min(free, cap - reserved), min(total, cap))."""
    import torch

    if not plan["applied"]:
        return
    torch.cuda.set_per_process_memory_fraction(plan["fraction"], 0)
    cap, real = int(plan["cap_gib"] * GIB), torch.cuda.mem_get_info

    def mem_get_info(device=None):
        free_b, total_b = real(device)
        return max(0, min(free_b, cap - torch.cuda.memory_reserved(device))), min(total_b, cap)

    torch.cuda.mem_get_info = mem_get_info


def as_result(res: dict) -> dict:
    """A stage's result as its record holds it: `res` with its Figures as dicts."""
    figures = [f.to_dict() if isinstance(f, Figure) else f for f in res.get("figures", [])]
    return {**res, "figures": figures}


def sync(device: str) -> None:
    """Wait for the device's queued work (no-op on CPU), so a timer measures the work."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


class Timer:
    """`with Timer(device) as t: ...` then `t.s`: seconds, device work included."""

    def __init__(self, device: str):
        self.device = device
        self.s = 0.0

    def __enter__(self):
        sync(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.s = time.perf_counter() - self._t0


def free(device: str) -> None:
    """Drop what the previous stage left: Python garbage and the CUDA caching allocator's blocks,
    and restart the peak counters, so the next stage's peak is its own."""
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    """CUDA max_memory_allocated since the last reset, in GiB (None on CPU)."""
    import torch

    return torch.cuda.max_memory_allocated() / GIB if device == "cuda" else None


def write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename (never half-written)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, data: dict) -> None:
    """`write_text` of `data` as JSON."""
    write_text(path, json.dumps(data, indent=1, default=str))


def failure(e: BaseException) -> tuple[str, str]:
    """(the error's first line, at most 400 characters; the traceback's last 2,000) of the
    exception being handled: what a guarded pass or run records as its own finding."""
    return f"{type(e).__name__}: {e}".splitlines()[0][:400], traceback.format_exc()[-2000:]
