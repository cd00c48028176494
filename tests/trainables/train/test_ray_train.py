"""Ray Train runs of the trainer: 2 workers with an injected failure resume from the last
checkpoint with no step lost or repeated; `layerswap train` on Ray writes a loadable adapter.

Run: .venv/bin/python -m pytest tests/trainables/train/test_ray_train.py  (slow: Ray start-up ~20 s/fit)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory) -> Path:
    from layerswap.world import build_world

    return build_world(tmp_path_factory.getbasetemp() / "tiny_world", seed=0, size="tiny", progress=False)  # fmt: skip


def _cfg(world: Path, tmp: Path, **over) -> dict:
    cfg = {
        "name": "ray_t",
        "base": str(world / "base"),
        "kind": "math",
        "language": "en",
        "datasets": [{"path": str(world / "data/sft/math_en.jsonl")}],
        "mode": "full",
        "hyper": {
            "lr": 3e-3,
            "schedule": "constant_with_warmup",
            "warmup_steps": 2,
            "batch_size": 8,
            "max_steps": 12,
            "seq_len": 96,
        },
        "checkpoint_every_samples": 32,
        "storage_path": str(tmp / "store"),
    }
    return cfg | over


def test_two_workers_survive_a_failure_without_losing_or_repeating_steps(tiny_world, tmp_path, ray_session):  # fmt: skip
    from layerswap.spaces.train_experiment import parse_train_experiment
    from layerswap.trainables.train import find_checkpoints, read_manifest
    from layerswap.trainables.train.ray_train import train_with_ray

    log = tmp_path / "steps.jsonl"
    exp = parse_train_experiment(
        _cfg(
            tiny_world,
            tmp_path,
            scaling={"num_workers": 2},
            failure={"max_failures": 1},
            # 0-based step 6 = the 7th update; the last checkpoint before it is after step 4
            debug={
                "fail_at_step": 6,
                "fail_marker": str(tmp_path / "failed"),
                "step_log": str(log),
            },
        )
    )
    res = train_with_ray(exp)
    assert res.error is None
    assert (tmp_path / "failed.rank0").exists() and (tmp_path / "failed.rank1").exists()
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    first = [r["step"] for r in rows if r["start"] == 0]
    second = [r["step"] for r in rows if r["start"] != 0]
    assert first == [1, 2, 3, 4, 5, 6]  # the 7th update raised
    assert {r["start"] for r in rows if r["start"] != 0} == {4}  # resumed from samples_32
    assert second == list(range(5, 13))
    # the finished run = attempt one up to its checkpoint + attempt two: every step exactly once
    assert [s for s in first if s <= 4] + second == list(range(1, 13))
    ckpts = find_checkpoints(res.path)
    assert [c.name for c in ckpts] == ["samples_000000032", "samples_000000064", "samples_000000096"]  # fmt: skip
    m = read_manifest(res.checkpoint)
    assert m["step"] == 12 and m["samples"] == 96 and m["world_size"] == 2
    assert res.metrics["step"] == 12 and res.metrics["val_loss"] < read_manifest(ckpts[0])["val_loss"]  # fmt: skip


def test_cli_trains_lora_on_ray(tiny_world, tmp_path, ray_session, capsys):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from layerswap.cli import main

    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(_cfg(tiny_world, tmp_path, mode={"type": "lora", "rank": 4}, name="lora_t")))  # fmt: skip
    assert main(["train", str(f), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    last = Path(out.split("last checkpoint: ")[1].strip())
    assert last == tmp_path / "run/train/lora_t/samples_000000096"
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_world / "base"), last
    )
    assert model(input_ids=torch.tensor([[1, 5, 6]])).logits.shape[-1] == 400


def test_fsdp_worker_killed_resumes_from_sharded_checkpoint(tiny_world, tmp_path, ray_session):
    """FSDP on 2 Ray workers; rank 1's process is SIGKILLed at the 7th update: the group
    restarts from the merged sharded checkpoint with every step exactly once."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from layerswap.spaces.train_experiment import parse_train_experiment
    from layerswap.trainables.train import find_checkpoints, read_manifest
    from layerswap.trainables.train.ray_train import train_with_ray
    from layerswap.trainables.train.state import resumable

    log = tmp_path / "steps.jsonl"
    cfg = _cfg(
        tiny_world,
        tmp_path,
        scaling={"num_workers": 2, "strategy": "fsdp"},
        failure={"max_failures": 1},
        debug={
            "fail_at_step": 6,
            "fail_marker": str(tmp_path / "killed"),
            "kill_rank": 1,
            "step_log": str(log),
        },
    )
    cfg["hyper"] |= {"micro_batch_size": 2}
    res = train_with_ray(parse_train_experiment(cfg))
    assert res.error is None
    assert (tmp_path / "killed.rank1").exists() and not (tmp_path / "killed.rank0").exists()
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    first = [r["step"] for r in rows if r["start"] == 0]
    second = [r["step"] for r in rows if r["start"] != 0]
    assert {r["start"] for r in rows if r["start"] != 0} == {4}  # resumed from samples_32
    assert [s for s in first if s <= 4] + second == list(range(1, 13))
    ckpts = find_checkpoints(res.path)
    assert [c.name for c in ckpts] == ["samples_000000032", "samples_000000064", "samples_000000096"]  # fmt: skip
    # every rank's shard made it into the newest merged checkpoint; the older ones (resumed
    # from before, as the run went on) were stripped to their weights once a newer one landed
    names = sorted(p.name for p in (ckpts[-1] / "trainer_state/dcp").iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for c in ckpts[:-1]:
        assert not (c / "trainer_state/dcp").exists() and not resumable(c), c
        assert (c / "model.safetensors").is_file()
    assert read_manifest(res.checkpoint)["world_size"] == 2
    model = AutoModelForCausalLM.from_pretrained(res.checkpoint)
    saved = load_file(Path(res.checkpoint) / "model.safetensors")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert not list(Path(res.path).glob(".*.tmp-*"))  # no staging folder left behind
