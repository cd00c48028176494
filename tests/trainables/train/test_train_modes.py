"""Every training mode in one process on the tiny world: loss falls, freezing, LoRA, checkpoints.

Run: .venv/bin/pytest tests/trainables/train/test_train_modes.py
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import EDGE, MODE_CFGS, MODE_HYPER, make_exp
from transformers import AutoTokenizer, Gemma2Config, Gemma2ForCausalLM

from layerswap.trainables.merge.arch import param_slot
from layerswap.trainables.train import find_checkpoints, read_manifest, run_training


def _train(world, tmp_path, mode, **over):
    name = mode if isinstance(mode, str) else mode["type"]
    hyper = MODE_HYPER.get(name, {}) | over.pop("hyper", {})
    exp = make_exp(world, MODE_CFGS.get(name, mode) if isinstance(mode, str) else mode, hyper=hyper, **over)  # fmt: skip
    seen = []
    res = run_training(exp, workdir=tmp_path / "run", report=lambda m, p: seen.append((m, p)))
    return exp, res, seen


@pytest.fixture(scope="module")
def base_val(tiny_world):
    """Validation loss of the base per dataset, for one- and two-dataset experiments."""
    from layerswap.trainables.train.revert import val_losses

    return {n: val_losses(tiny_world / "base", make_exp(tiny_world, MODE_CFGS[n])) for n in ("full", "mix")}  # fmt: skip


@pytest.mark.parametrize("mode", list(MODE_CFGS))
def test_loss_falls(tiny_world, tmp_path, mode, base_val):
    _, res, seen = _train(tiny_world, tmp_path, mode)
    steps = MODE_HYPER.get(mode, {}).get("max_steps", 12)
    assert res.step == steps and res.samples == 8 * steps
    before = base_val["mix" if mode in ("mix", "simultaneous") else "full"]
    after = [seen[-1][0][f"val_loss__{i}"] for i in range(len(before))]
    assert all(a < b - 0.03 for a, b in zip(after, before, strict=True)), (before, after)
    assert [m["step"] for m, _ in seen] == list(range(1, steps + 1))  # log_every 1
    assert res.final_checkpoint is not None
    assert res.final_checkpoint.name == f"samples_{8 * steps:09d}"


def test_simultaneous_alternates_and_idle_moments_stay(tiny_world, tmp_path):
    # k=2, a checkpoint every step: the optimizer files show each group's moments over time.
    # Embeddings/lm_head go with the language side (the barely pretrained tiny base learns
    # its language data mostly there).
    part = {**EDGE, "non_layer": "language"}
    mode = {"type": "simultaneous", "partition": part, "k": 2, "sides": ["task", "language"]}
    hyper = {"lr": 3e-3, "max_steps": 12}
    # every checkpoint's optimizer state is read below: keep it (default: the newest only)
    _exp, res, seen = _train(tiny_world, tmp_path, mode, checkpoint_every_samples=8, hyper=hyper, resume_state="all")  # fmt: skip
    active = [m["active"] for m, _ in seen]
    assert active == ["task", "task", "language", "language"] * 3
    assert [m["stream"] for m, _ in seen] == [0, 0, 1, 1] * 3
    # each dataset's validation loss (equal shares) falls; batch losses are too noisy here
    first, last = seen[0][0], seen[-1][0]
    for i in (0, 1):
        assert last[f"val_loss__{i}"] < first[f"val_loss__{i}"] - 0.02, (i, first, last)
    assert res.final_checkpoint is not None
    n_val = [d["n_val"] for d in read_manifest(res.final_checkpoint)["data"]]
    assert n_val[0] == n_val[1] > 0
    ck = {read_manifest(p)["step"]: p for p in find_checkpoints(tmp_path / "run")}
    assert sorted(ck) == list(range(1, 13))

    def opt(step, group):
        return load_file(ck[step] / "trainer_state" / f"optimizer__{group}.safetensors")

    def weights(step):
        return load_file(ck[step] / "model.safetensors")

    for a, b, idle in ((2, 4, "task"), (4, 6, "language"), (6, 8, "task"), (8, 10, "language")):
        before, after = opt(a, idle), opt(b, idle)
        assert before.keys() == after.keys() and before
        for k in before:  # exp_avg, exp_avg_sq and step of every idle parameter: unchanged
            assert torch.equal(before[k], after[k]), (idle, a, b, k)
        busy = "language" if idle == "task" else "task"
        ba, bb = opt(a, busy), opt(b, busy)  # the busy side did step (at a it may be empty)
        assert bb and any(k not in ba or not torch.equal(ba[k], bb[k]) for k in bb)
        wa, wb = weights(a), weights(b)
        side_of = {"task": (1, 2), "language": (0, 3, None)}
        for name in wa:  # the idle side's weights did not move either
            assert (param_slot(name).layer in side_of[idle]) == torch.equal(wa[name], wb[name]), name  # fmt: skip


def test_partial_keeps_frozen_tensors_bit_identical(tiny_world, tmp_path):
    _, res, _ = _train(tiny_world, tmp_path, "partial")
    base = load_file(tiny_world / "base/model.safetensors")
    got = load_file(res.final_checkpoint / "model.safetensors")
    assert got.keys() == base.keys()
    changed = {n for n in base if not torch.equal(base[n], got[n])}
    for name in base:
        slot = param_slot(name)
        trains = slot.layer in (1, 2)
        assert (name in changed) == trains, name  # every task-side tensor moved, nothing else


def test_partial_lora_adapters_only_on_allocated_side(tiny_world, tmp_path):
    mode = {"type": "partial", "partition": EDGE, "train": "language", "lora": {"rank": 4}}
    _, res, _ = _train(tiny_world, tmp_path, mode, hyper={"lr": 1e-2})
    adapter = load_file(res.final_checkpoint / "adapter_model.safetensors")
    layers = {param_slot(n).layer for n in adapter}
    assert layers == {0, 3}
    assert len({n.rsplit(".lora_", 1)[0] for n in adapter}) == 2 * 7  # 7 projections x 2 layers


def test_lora_adapter_loads_with_peft(tiny_world, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, res, _ = _train(tiny_world, tmp_path, "lora")
    ck = res.final_checkpoint
    assert (ck / "adapter_config.json").is_file() and not (ck / "model.safetensors").exists()
    cfg = json.loads((ck / "adapter_config.json").read_text())
    assert cfg["use_rslora"] is True and cfg["r"] == 8
    assert set(cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # fmt: skip
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_world / "base"), ck)
    ids = torch.tensor([[1, 5, 6, 7]])
    plain = AutoModelForCausalLM.from_pretrained(tiny_world / "base")
    assert not torch.allclose(model(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_checkpoints_every_n_samples_with_manifest(tiny_world, tmp_path):
    exp, res, seen = _train(tiny_world, tmp_path, "full", checkpoint_every_samples=20, keep_checkpoints=None)  # fmt: skip
    # batch 8: samples 8, 16, 24 crosses 20 -> checkpoint at 24, 40, 64, 80, and the end (96)
    names = [p.name for p in res.checkpoints]
    assert names == [f"samples_{s:09d}" for s in (24, 40, 64, 80, 96)]
    for p in res.checkpoints:
        m = read_manifest(p)
        assert m["samples"] == int(p.name.split("_")[1]) and m["step"] * 8 == m["samples"]
        assert m["mode"] == "full" and m["seed"] == 0 and m["base"] == exp.base
        assert m["hparams"]["lr"] == exp.hyper.lr and m["data"][0]["n_train"] > 0
        assert m["experiment"]["name"] == "t" and m["val_loss"] > 0
        assert not [f for f in p.rglob("*") if f.suffix in (".bin", ".pt", ".pkl")]
    with_ckpt = [m["step"] for m, p in seen if p is not None]
    assert with_ckpt == [3, 5, 8, 10, 12]
    assert all("val_loss" in m for m, p in seen if p is not None)


def test_keep_checkpoints_prunes_old_ones(tiny_world, tmp_path):
    _, _res, _ = _train(tiny_world, tmp_path, "full", checkpoint_every_samples=16, keep_checkpoints=2)  # fmt: skip
    left = sorted(p.name for p in (tmp_path / "run/checkpoints").iterdir())
    assert left == ["samples_000000080", "samples_000000096"]


@pytest.mark.parametrize("mode", ["full", "simultaneous", "lora"])
def test_resume_is_exact(tiny_world, tmp_path, mode):
    # 8 steps straight == 4 steps, then resume from that checkpoint for the other 4 (a checkpoint
    # that is no longer the run's newest: resume_state all keeps its optimizer state).
    over = {"hyper": {"max_steps": 8, "schedule": "linear", "lr": 5e-3}, "checkpoint_every_samples": 32, "resume_state": "all"}  # fmt: skip
    exp = make_exp(tiny_world, MODE_CFGS[mode], **over)
    straight = run_training(exp, workdir=tmp_path / "a")
    first = run_training(exp, workdir=tmp_path / "b")
    mid = tmp_path / "b/checkpoints/samples_000000032"
    assert read_manifest(mid)["step"] == 4
    steps = []
    resumed = run_training(exp, workdir=tmp_path / "c", resume_from=mid, report=lambda m, p: steps.append(m["step"]))  # fmt: skip
    assert steps == [5, 6, 7, 8]
    assert resumed.losses == straight.losses[4:] == first.losses[4:]
    fname = "adapter_model.safetensors" if mode == "lora" else "model.safetensors"
    a = load_file(straight.final_checkpoint / fname)
    c = load_file(resumed.final_checkpoint / fname)
    assert all(torch.equal(a[k], c[k]) for k in a)
    oa = load_file(straight.final_checkpoint / "trainer_state" / (next(iter(sorted(p.name for p in (straight.final_checkpoint / "trainer_state").glob("*.safetensors"))))))  # fmt: skip
    oc = load_file(resumed.final_checkpoint / "trainer_state" / (next(iter(sorted(p.name for p in (resumed.final_checkpoint / "trainer_state").glob("*.safetensors"))))))  # fmt: skip
    assert oa.keys() == oc.keys() and all(torch.equal(oa[k], oc[k]) for k in oa)


def test_simultaneous_lora_steps_one_side_at_a_time(tiny_world, tmp_path):
    mode = {"type": "simultaneous", "partition": EDGE, "lora": {"rank": 4}}
    _, _res, seen = _train(tiny_world, tmp_path, mode, checkpoint_every_samples=8, hyper={"max_steps": 4})  # fmt: skip
    assert [m["active"] for m, _ in seen] == ["task", "language"] * 2
    ck = {read_manifest(p)["step"]: p for p in find_checkpoints(tmp_path / "run")}
    a = {s: load_file(ck[s] / "adapter_model.safetensors") for s in (1, 2, 3)}
    assert {param_slot(n).layer for n in a[1]} == {0, 1, 2, 3}
    # step 2 trains language (layers 0, 3), step 3 trains task (layers 1, 2); a lora_A may sit
    # still on its side's first step (B starts at zero, so A's gradient is zero)
    for s0, s1, idle in ((1, 2, (1, 2)), (2, 3, (0, 3))):
        same = {n: torch.equal(a[s0][n], a[s1][n]) for n in a[s0]}
        assert all(same[n] for n in same if param_slot(n).layer in idle), (s0, s1)
        assert not all(same[n] for n in same if param_slot(n).layer not in idle), (s0, s1)


def test_mix_lora_trains_one_adapter_on_both_datasets(tiny_world, tmp_path):
    mode = {"type": "mix", "lora": {"rank": 4}}
    _, res, _ = _train(tiny_world, tmp_path, mode, hyper={"max_steps": 3})
    m = read_manifest(res.final_checkpoint)
    assert m["is_lora"] and m["mode"] == "mix" and len(m["data"]) == 2
    assert (res.final_checkpoint / "adapter_model.safetensors").is_file()


def test_every_mode_of_the_config_has_a_prepare_function():
    from layerswap.spaces.train_modes import MODE_NAMES
    from layerswap.trainables.train.modes import MODES

    assert list(MODES) == list(MODE_NAMES)


def test_a_base_of_a_family_the_merge_refuses_is_refused_before_training(tiny_world, tmp_path):
    """The library path (no CLI check) refuses a Gemma2 base once loaded, before a step: its
    post_attention_layernorm would be trained on the MLP's side of a partition (a red-team)."""
    tok = AutoTokenizer.from_pretrained(tiny_world / "base")
    cfg = Gemma2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16)  # fmt: skip
    Gemma2ForCausalLM(cfg).save_pretrained(tmp_path / "gemma2")
    for f in (tiny_world / "base").glob("tokenizer*"):
        shutil.copy(f, tmp_path / "gemma2" / f.name)
    exp = make_exp(tiny_world, "full", base=str(tmp_path / "gemma2"), hyper={"max_steps": 1})
    with pytest.raises(ValueError, match="model_type 'gemma2' is not supported; supported: llama"):
        run_training(exp, workdir=tmp_path / "run")
    assert not find_checkpoints(tmp_path / "run")
