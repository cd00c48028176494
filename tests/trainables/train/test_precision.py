"""Precision policies: bf16-mixed keeps the small updates pure bf16 loses; checkpoints say so.

Run: .venv/bin/python -m pytest tests/trainables/train/test_precision.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import make_exp

from layerswap.trainables.train import read_manifest, run_training
from layerswap.trainables.train.precision import resolve_precision, unmovable_share

LR = 1e-7
# 50 steps at the papers' LR on a bf16 base; small batches keep it to seconds on one thread.
PAPER_HYPER = {"lr": LR, "schedule": "constant_with_warmup", "warmup_steps": 0, "max_steps": 50, "batch_size": 2, "seq_len": 48, "grad_clip": None}  # fmt: skip


def _run(world: Path, out: Path, policy: str, **over):
    exp = make_exp(world, "full", hyper=dict(PAPER_HYPER), precision=policy, **over)
    return run_training(exp, workdir=out)


@pytest.fixture(scope="module")
def paper_runs(bf16_world, tmp_path_factory):
    """bf16-mixed and an all-fp32 reference on the same bf16 base, at the papers' LR."""
    root = tmp_path_factory.mktemp("paper_runs")
    mixed = _run(bf16_world, root / "mixed", "bf16-mixed")
    ref = _run(bf16_world, root / "fp32", "fp32")
    with pytest.warns(UserWarning, match="bf16-pure"):
        pure = _run(bf16_world, root / "pure", "bf16-pure")
    return mixed.final_checkpoint, ref.final_checkpoint, pure.final_checkpoint


def test_auto_policy_follows_the_base_dtype(tiny_world, bf16_world):
    assert resolve_precision(make_exp(bf16_world)).name == "bf16-mixed"
    assert resolve_precision(make_exp(tiny_world)).name == "fp32"
    pure = resolve_precision(make_exp(bf16_world, precision="bf16-pure"))
    assert (pure.master, pure.compute) == (torch.bfloat16, None)


def test_mixed_masters_match_fp32_reference_and_all_move(bf16_world, paper_runs):
    mixed, ref, _ = paper_runs
    base = load_file(bf16_world / "base/model.safetensors")
    master = load_file(mixed / "trainer_state/master.safetensors")
    ref_w = load_file(ref / "trainer_state/master.safetensors")  # saved in bf16 as well
    assert set(master) == set(base)
    moved = trained = 0
    for name, w in master.items():
        assert w.dtype == torch.float32, name
        b = base[name].float()
        # bf16 compute vs fp32 compute changes the update by ~2 % of its size (measured 1.8 %).
        assert (w - ref_w[name]).norm() <= 0.05 * (ref_w[name] - b).norm(), name
        # Trained weights: those the reference moved (embedding rows of unseen tokens get no
        # gradient and stay put in both).
        got = ref_w[name] != b
        moved += int((w[got] != b[got]).sum())
        trained += int(got.sum())
    assert trained >= 0.7 * sum(t.numel() for t in base.values())
    assert moved / trained >= 0.99, moved / trained


def test_pure_bf16_loses_the_same_updates(bf16_world, paper_runs):
    """The contrast the policy exists for (docs/guides/gpus.md): pure bf16 barely moves at this LR."""
    base = load_file(bf16_world / "base/model.safetensors")
    pure = load_file(paper_runs[2] / "model.safetensors")
    moved = sum(int((pure[k] != base[k]).sum()) for k in base)
    assert moved / sum(t.numel() for t in base.values()) < 0.05


def test_checkpoint_is_saved_in_base_dtype_and_manifest_says_so(paper_runs):
    mixed, _, _ = paper_runs
    weights = load_file(mixed / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert json.loads((mixed / "config.json").read_text())["dtype"] == "bfloat16"
    prec = read_manifest(mixed)["precision"]
    assert prec["policy"] == "bf16-mixed"
    assert (prec["master_dtype"], prec["compute_dtype"], prec["checkpoint_dtype"]) == ("float32", "bfloat16", "bfloat16")  # fmt: skip
    assert prec["master_weights"] == "trainer_state/master.safetensors"


def test_fp32_checkpoint_keeps_the_update(bf16_world, tmp_path):
    hyper = dict(PAPER_HYPER, max_steps=3)
    exp = make_exp(bf16_world, "full", hyper=hyper, precision={"policy": "bf16-mixed", "checkpoint_dtype": "fp32"})  # fmt: skip
    ckpt = run_training(exp, workdir=tmp_path).final_checkpoint
    weights = load_file(ckpt / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float32}
    assert not (ckpt / "trainer_state/master.safetensors").exists()  # the weights are the masters
    assert read_manifest(ckpt)["precision"]["master_weights"] is None


def test_lora_manifest_names_the_adapters_dtype(bf16_world, tmp_path):
    # PEFT writes the adapter in its fp32 masters on a bf16 base: the manifest says what was saved.
    exp = make_exp(bf16_world, {"type": "lora", "rank": 4, "alpha": 8}, hyper=dict(PAPER_HYPER, max_steps=1))  # fmt: skip
    ckpt = run_training(exp, workdir=tmp_path).final_checkpoint
    saved = {str(t.dtype).removeprefix("torch.") for t in load_file(ckpt / "adapter_model.safetensors").values()}  # fmt: skip
    assert saved == {"float32"}
    assert read_manifest(ckpt)["precision"]["checkpoint_dtype"] == "float32"


def test_bf16_pure_warns_at_the_papers_lr(bf16_world, tmp_path):
    exp = make_exp(bf16_world, "full", hyper=dict(PAPER_HYPER, max_steps=1), precision="bf16-pure")
    with pytest.warns(UserWarning, match=r"bf16-pure at lr 1e-07: .* updates vanish"):
        run_training(exp, workdir=tmp_path)


def test_bf16_pure_does_not_warn_where_steps_register(bf16_world, tmp_path, recwarn):
    exp = make_exp(bf16_world, "full", hyper=dict(PAPER_HYPER, max_steps=1, lr=1e-2), precision="bf16-pure")  # fmt: skip
    run_training(exp, workdir=tmp_path)
    assert not [w for w in recwarn if "bf16-pure" in str(w.message)]


def test_unmovable_share_is_exact_on_known_weights():
    # bf16 spacing at 1.0 is 2**-7, so half a step is 2**-8 ≈ 0.0039; at 2**-10 it is 2**-18.
    w = torch.tensor([1.0, 1.5, 2**-10, 0.0], dtype=torch.bfloat16)
    assert unmovable_share([w], 1e-3) == 0.5  # 1.0 and 1.5 cannot move; the tiny one and 0 can
    assert unmovable_share([w], 1e-2) == 0.0
    assert unmovable_share([w], 1e-6) == 0.75


def test_unmovable_share_counts_slice_by_slice(monkeypatch):
    """Slices of 3 elements count exactly what one pass over the whole tensor counts."""
    from layerswap.trainables.train import precision

    g = torch.Generator().manual_seed(0)
    ws = [(torch.randn(1000, generator=g) * 10.0 ** torch.randint(-6, 2, (1000,), generator=g)).to(torch.bfloat16), torch.zeros(7, dtype=torch.bfloat16)]  # fmt: skip
    whole = unmovable_share(ws, 1e-4)
    monkeypatch.setattr(precision, "_SHARE_CHUNK", 3)
    assert unmovable_share(ws, 1e-4) == whole and 0 < whole < 1


def test_unmovable_share_memory_stays_near_the_weights():
    """In a fresh process, the peak RSS while counting a 64M-element bf16 tensor (128 MB) grows
    by well under the ~1.3 GB of float32 temporaries a whole-tensor pass made (an 8B model's
    embedding took ~10 GB that way)."""
    code = """
import resource, torch
from layerswap.trainables.train.precision import unmovable_share
w = torch.ones(64 * 2**20, dtype=torch.bfloat16)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
share = unmovable_share([w], 1e-3)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(share, (after - before) // 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    share, grew_mb = out.stdout.split()
    assert float(share) == 1.0 and int(grew_mb) < 600, out.stdout


def test_mixed_resume_continues_from_the_fp32_masters(bf16_world, tmp_path):
    hyper = dict(PAPER_HYPER, max_steps=6, lr=1e-6)
    exp = make_exp(bf16_world, "full", hyper=hyper, precision="bf16-mixed", checkpoint_every_samples=6, resume_state="all")  # fmt: skip
    whole = run_training(exp, workdir=tmp_path / "whole")
    ckpts = sorted((tmp_path / "whole/checkpoints").iterdir())
    resumed = run_training(exp, workdir=tmp_path / "resumed", resume_from=ckpts[0])
    assert resumed.losses == whole.losses[3:]
    a = load_file(ckpts[-1] / "trainer_state/master.safetensors")
    b = load_file(resumed.final_checkpoint / "trainer_state/master.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_tied_base_checkpoint_has_the_base_tensor_names(bf16_world, tmp_path):
    """Cast apart, tied embedding and lm_head stop sharing storage; the checkpoint must still
    name only the embedding, as the base does (the merge's model has no lm_head.weight)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tied = tmp_path / "tied"
    tied.mkdir()
    (tied / "data").symlink_to(bf16_world / "data")
    model = AutoModelForCausalLM.from_pretrained(bf16_world / "base", tie_word_embeddings=True)
    model.tie_weights()
    model.save_pretrained(tied / "base")
    AutoTokenizer.from_pretrained(bf16_world / "base").save_pretrained(tied / "base")
    base = load_file(tied / "base/model.safetensors")
    assert "lm_head.weight" not in base
    exp = make_exp(tied, "full", hyper=dict(PAPER_HYPER, max_steps=1), precision="bf16-mixed")
    ckpt = run_training(exp, workdir=tmp_path / "run").final_checkpoint
    assert set(load_file(ckpt / "model.safetensors")) == set(base)
