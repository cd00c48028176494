"""The merge benchmark's inputs: the Llama shapes, the layer-swap recipe, and the pair of random
bf16 experts generated once per shape (seeded, deterministic, streamed through
trainables.merge.shard_writer.ShardWriter so generation stays low-memory) and cached under
WORKDIR/experts-SHAPE/.

Used by benchmarks/bench_merge.py and benchmarks/bench_delta.py (through bench_merge); not run on
its own.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from layerswap.trainables.merge.shard_writer import OutSpec, ShardWriter

GEN_CHUNK = 4 * 1024 * 1024  # elements generated per step (fixed: it is part of the seeding)
GEN_VERSION = 1  # bump when the generator changes, to invalidate cached experts
SEEDS = {"task": 1234, "language": 5678}
MIB = 1024 * 1024


@dataclass(frozen=True)
class Shape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """HF Llama tensor names and shapes, in model order (tied embeddings: no lm_head)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out += [
                (p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (q, h)),
                (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)),
                (p + "self_attn.o_proj.weight", (h, q)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (self.intermediate, h)),
                (p + "mlp.up_proj.weight", (self.intermediate, h)),
                (p + "mlp.down_proj.weight", (h, self.intermediate)),
            ]
        out.append(("model.norm.weight", (h,)))
        return out

    def config(self) -> dict:
        """A Llama-3.2-1B-style config.json for this shape."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 128000,
            "eos_token_id": 128001,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate,
            "max_position_embeddings": 131072,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": self.heads,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.kv_heads,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "dtype": "bfloat16",
            "use_cache": True,
            "vocab_size": self.vocab,
        }


SHAPES = {
    # meta-llama/Llama-3.2-1B: 1.236e9 parameters, 2.47 GB in bf16.
    "1b": Shape(
        vocab=128256, hidden=2048, intermediate=8192, layers=16, heads=32, kv_heads=8, head_dim=64
    ),
    # Same depth (so the same recipe), ~110 MB.
    "small": Shape(
        vocab=16384, hidden=512, intermediate=1536, layers=16, heads=8, kv_heads=2, head_dim=64
    ),
    # Same depth, ~1.3 MB: the smoke run (tests/benchmarks/), which checks that every contender
    # runs and the outputs agree; its times are the fixed costs, its ratios mean nothing.
    "tiny": Shape(
        vocab=512, hidden=64, intermediate=128, layers=16, heads=4, kv_heads=2, head_dim=16
    ),
}

# The paper's default (Bandarkar et al.) scaled to 16 layers, with transitions.
RECIPE_FIELDS = dict(
    method="layer_swap",
    bottom=3,
    top=1,
    bottom_transition=1,
    top_transition=1,
    transition_weights={"task": 1.0, "language": 1.0},
    non_layer="average",
)


def _generate_expert(out: Path, shape: Shape, seed: int) -> None:
    """Write one random bf16 expert, chunk by chunk, into `out` (two shards + index)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = shape.tensors()
    specs = [OutSpec(name, "BF16", shp) for name, shp in tensors]
    total = sum(s.nbytes for s in specs)
    # HF shards large models; ~55% of the total per shard gives two shards for both shapes.
    with ShardWriter(out, specs, max_shard_bytes=int(total * 0.55)) as writer:
        writer.open()  # files closed on any way out of the `with`
        for name, shp in tensors:
            n = math.prod(shp)
            for start in range(0, n, GEN_CHUNK):
                count = min(GEN_CHUNK, n - start)
                if len(shp) == 1:  # RMSNorm gains: around 1
                    chunk = 1.0 + 0.05 * torch.randn(count, generator=gen)
                else:
                    chunk = 0.02 * torch.randn(count, generator=gen)
                data = chunk.to(torch.bfloat16).view(torch.uint8).numpy()
                writer.write(name, memoryview(data).cast("B"))
        writer.close()
    (out / "config.json").write_text(json.dumps(shape.config(), indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 128000, "eos_token_id": 128001}, indent=2) + "\n"
    )


def ensure_experts(workdir: Path, shape_name: str) -> dict[str, Path]:
    """The cached (task, language) experts for a shape, generated when missing or stale.

    Args:
        workdir: the benchmark's scratch folder; the experts live in workdir/experts-SHAPE/.
        shape_name: a key of SHAPES.
    Returns:
        {"task": folder, "language": folder}.
    """
    shape = SHAPES[shape_name]
    root = workdir / f"experts-{shape_name}"
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for side, seed in SEEDS.items():
        path = root / side
        stamp = root / f"{side}.done.json"
        want = {"version": GEN_VERSION, "seed": seed, "shape": shape.__dict__}
        if not (path.is_dir() and stamp.exists() and json.loads(stamp.read_text()) == want):
            shutil.rmtree(path, ignore_errors=True)
            tmp = root / f".{side}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            t0 = time.perf_counter()
            _generate_expert(tmp, shape, seed)
            os.rename(tmp, path)
            stamp.write_text(json.dumps(want))
            print(f"generated {path} in {time.perf_counter() - t0:.1f} s", flush=True)
        paths[side] = path
    return paths


def dir_bytes(path: Path) -> int:
    """Bytes of every file under `path`."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def warm_read(paths: list[Path]) -> float:
    """Read every file once (untimed warm-up of the page cache). Returns seconds taken."""
    t0 = time.perf_counter()
    buf = bytearray(64 * MIB)
    view = memoryview(buf)
    for root in paths:
        for f in sorted(root.rglob("*")):
            if f.is_file():
                with open(f, "rb", buffering=0) as fh:
                    while fh.readinto(view):
                        pass
    return time.perf_counter() - t0
