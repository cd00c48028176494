"""Real-model shapes for the benchmarks: random weights, the world tokenizer, experts in memory.

`shape_config("llama-8b", tok)` is Llama-3.1-8B's architecture; `shape_experts(cfg)` makes a base
and two experts (task: middle layers re-noised, language: outer layers) sharing every other
tensor, so three 8B "checkpoints" take ~32 GB of host memory in bfloat16, not 48.
Used by bench_eval.py, bench_train_step.py, search_bench/shape_trials.py (bench_search.py part (d))
and the GPU check; not a test.
"""

from __future__ import annotations

import torch

SHAPES = {
    # Llama-3.1-8B (config.json of meta-llama/Llama-3.1-8B), vocab from the tokenizer given.
    "llama-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
    ),
}
# The same architecture at a few thousand parameters: the benchmarks' smoke runs on CPU
# (tests/benchmarks/), which check that a script's path still runs, not its speed.
SHAPES["llama-tiny"] = SHAPES["llama-8b"] | dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def shape_config(shape: str, tok, depth: int | None = None):
    """A LlamaConfig of `shape` with `tok`'s vocabulary (`depth` overrides the layer count)."""
    from transformers import LlamaConfig

    kw = dict(SHAPES[shape])
    if depth is not None:
        kw["num_hidden_layers"] = depth
    return LlamaConfig(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **kw,
    )


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if name.startswith("model.layers.") else None


def shape_experts(cfg, dtype=torch.bfloat16, make_on: str = "cpu") -> dict[str, dict]:
    """{"base", "task", "language"}: state dicts on the host; experts share untouched tensors.

    Args:
        cfg: a LlamaConfig.
        dtype: the checkpoints' dtype.
        make_on: where the random numbers are drawn ("cuda" is much faster for 8B).
    """
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        shapes = {n: p.shape for n, p in LlamaForCausalLM(cfg).state_dict().items()}
    g = torch.Generator(device=make_on).manual_seed(0)

    def randn(shape, std):
        return (torch.randn(shape, generator=g, device=make_on) * std).to(dtype).cpu()

    base = {
        n: torch.ones(s, dtype=dtype) if n.endswith("norm.weight") else randn(s, 0.02)
        for n, s in shapes.items()
    }
    depth = cfg.num_hidden_layers
    middle = range(depth // 4, depth - depth // 4)
    out = {"base": base}
    for role, layers in (("task", middle), ("language", set(range(depth)) - set(middle))):
        out[role] = {
            n: (t + randn(t.shape, 0.002)) if _layer(n) in layers else t for n, t in base.items()
        }
    return out
