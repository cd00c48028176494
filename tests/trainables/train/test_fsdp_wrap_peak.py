"""FSDP2's wrap keeps no second full copy: while layers are sharded one by one, the unsharded
parameters they replace are freed, so the wrap's peak stays near the shard plus one layer.

A 1-process gloo group (torch.multiprocessing, as a Ray Train worker would open it) wraps a
bf16 Llama under bf16-mixed (fp32 masters) with the trainer's own `_prepare_model` and FSDP2
strategy. After every `fully_shard` call the worker adds up the bytes of the live parameters:
the model's current ones plus every replaced original still alive (tracked by weak reference).
Run: .venv/bin/python -m pytest -q tests/trainables/train/test_fsdp_wrap_peak.py
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch.multiprocessing as mp


def _bytes(t) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def _wrap_and_measure(rank: int, world_dir: str, out: str) -> None:
    import weakref

    import torch
    import torch.distributed as dist
    import torch.distributed.fsdp as fsdp
    from transformers import AutoModelForCausalLM, LlamaConfig

    from layerswap.spaces.train_experiment import parse_train_experiment
    from layerswap.trainables.train.precision import resolve_precision
    from layerswap.trainables.train.run_setup import _prepare_model
    from layerswap.trainables.train.strategies import pick

    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=256, tie_word_embeddings=False)  # fmt: skip
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        exp = parse_train_experiment(
            {"name": "w", "base": world_dir, "kind": "math", "language": "en",
             "datasets": [{"path": "unused.jsonl"}], "mode": "full", "precision": "bf16-mixed",
             "hyper": {"lr": 1e-5, "batch_size": 1, "max_steps": 1, "seq_len": 8, "gradient_checkpointing": False},
             "scaling": {"strategy": "fsdp"}},
            source="test",
        )  # fmt: skip
        policy = resolve_precision(exp, base=torch.bfloat16)
        strategy = pick(exp, 1)
        device = torch.device("cpu")
        prep = _prepare_model(model, exp, device, policy, strategy)
        originals = [weakref.ref(p) for p in model.parameters()]
        samples: list[int] = []
        real = fsdp.fully_shard

        def measured(module, **kw):
            res = real(module, **kw)
            current = {id(p): _bytes(p) for p in model.parameters()}
            stale = sum(_bytes(p) for r in originals if (p := r()) is not None and id(p) not in current)  # fmt: skip
            samples.append(sum(current.values()) + stale)
            return res

        fsdp.fully_shard = measured
        try:
            strategy.wrap(prep, exp, policy, device, 1)
        finally:
            fsdp.fully_shard = real
        layer = sum(p.numel() for p in model.model.layers[0].parameters()) * 4  # one fp32 layer
        shard = sum(_bytes(p) for p in model.parameters())  # world 1: the shard is the model
        Path(out).write_text(json.dumps({"samples": samples, "shard": shard, "layer": layer}))
    finally:
        dist.destroy_process_group()


def test_the_wrap_peak_stays_near_one_shard_plus_one_layer(tiny_world, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    out = tmp_path / "peak.json"
    mp.spawn(_wrap_and_measure, args=(str(tiny_world / "base"), str(out)), nprocs=1, join=True)
    got = json.loads(out.read_text())
    peak = max(got["samples"])
    assert len(got["samples"]) == 9  # 8 layers, then the root
    # Before the fix the replaced fp32 layers stayed alive: the peak grew to ~2x the shard.
    assert peak <= 1.2 * (got["shard"] + got["layer"]), got
