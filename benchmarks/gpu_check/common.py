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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
