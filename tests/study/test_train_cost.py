"""The training-run arithmetic of `layerswap plan`, in exact numbers on a made-up shape: bytes a
step sends under FSDP and DDP (study/comms.py), what a checkpoint writes and storage keeps
(study/sizes.py, study/storage.py), padding and the wait for the slowest rank
(study/training.py), and decoding to the stop strings (study/estimate.py); and the 8B figures
the papers' study rests on. No weights: config.json files only.

Run: .venv/bin/pytest -q tests/study/test_train_cost.py
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from toy_model import toy_config

from layerswap import spaces
from layerswap.spaces.task_families import TaskShape
from layerswap.spaces.train_experiment import load_train_experiment, with_overrides
from layerswap.study import comms, training
from layerswap.study.estimate import decode_steps, model_cost, train_flops
from layerswap.study.sizes import run_sizes
from layerswap.study.storage import fmt_bytes, run_storage
from layerswap.trainables.train.model_shape import load_model_config, model_shape

EXAMPLES = Path(spaces.__file__).parent / "examples"

# The toy model (tests/study/toy_model.py) in bf16. Per layer: q, k, v, o 4 x 64, MLP 3 x 128,
# 2 norms x 8 -> 656, x 2 layers = 1312; the root (FSDP's outermost unit): embedding 256 +
# lm_head 256 + final norm 8 = 520; every parameter: 1832.
CONFIG = toy_config("bfloat16")
PARAMS, LAYERS = 1832, 1312


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(shape, experiment): full, bf16-mixed, FSDP over 4 workers, batch 8 of 1-row passes."""
    root = tmp_path_factory.mktemp("toy")
    (root / "base").mkdir()
    (root / "base" / "config.json").write_text(json.dumps(CONFIG))
    (root / "data.jsonl").write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    hyper = {"lr": 1e-3, "batch_size": 8, "micro_batch_size": 1, "seq_len": 64, "max_steps": 10}
    exp = {
        "name": "toy",
        "base": str(root / "base"),
        "kind": "math",
        "language": "en",
        "datasets": [{"path": str(root / "data.jsonl")}],
        "mode": "full",
        "hyper": hyper,
        "precision": "bf16-mixed",
        "scaling": {"num_workers": 4, "use_gpu": True, "strategy": "fsdp"},
    }
    (root / "toy.yaml").write_text(yaml.safe_dump(exp))
    shape = model_shape(load_model_config(str(root / "base"))[0])
    return shape, load_train_experiment(root / "toy.yaml")


def test_fsdp_gathers_twice_in_bf16_and_reduce_scatters_fp32_every_micro_batch(toy):
    shape, exp = toy
    s = run_sizes(shape, exp)
    assert (s.params, s.trained) == (PARAMS, PARAMS)
    assert (s.gather, s.gather_layers, s.grads) == (PARAMS * 2, LAYERS * 2, PARAMS * 4)
    assert (s.gather_dtype, s.reduce_dtype, s.save_dtype) == ("bfloat16", "float32", "bfloat16")
    # 2 micro-batches a step, each (forward gather + backward gather of the layers + fp32
    # reduce-scatter) x 3/4 in a ring of 4
    assert comms.micro_batches(exp) == 2
    assert comms.step_bytes(s, exp) == 2 * 0.75 * (3664 + 2624 + 7328) == 20424


def test_fsdp_checkpoint_weights_in_the_save_dtype_and_sharded_state_fsynced(toy):
    shape, exp = toy
    s = run_sizes(shape, exp)
    assert (s.weights, s.weights_other) == (PARAMS * 2, PARAMS * 4)  # bf16; fp32 the other way
    # DCP: every weight's fp32 master and AdamW's two fp32 moments, all fsynced
    assert s.resume == s.synced == PARAMS * 4 * 3
    fp32 = run_sizes(shape, with_overrides(exp, {"precision": {"policy": "bf16-mixed", "checkpoint_dtype": "fp32"}}))  # fmt: skip
    assert (fp32.weights, fp32.weights_other, fp32.save_dtype) == (
        PARAMS * 4,
        PARAMS * 2,
        "float32",
    )


def test_ddp_all_reduces_the_gradients_once_a_step(toy):
    shape, exp = toy
    ddp = with_overrides(exp, {"scaling.strategy": "ddp"})
    s = run_sizes(shape, ddp)
    assert comms.step_bytes(s, ddp) == 2 * 0.75 * PARAMS * 4  # all-reduce: twice a ring's share
    # the fp32 masters beside the bf16 weights, and AdamW's moments; nothing fsynced
    assert (s.resume, s.synced) == (PARAMS * 4 * 3, 0)
    one = with_overrides(ddp, {"scaling.num_workers": 1})
    assert comms.step_bytes(run_sizes(shape, one), one) == 0


def test_a_lora_checkpoint_is_its_fp32_adapter(toy):
    shape, exp = toy
    lora = with_overrides(exp, {"mode": {"type": "lora", "rank": 2}, "scaling.strategy": "ddp"})
    s = run_sizes(shape, lora)
    # rank 2 on q, k, v, o (2 x 16 each) and gate, up, down (2 x 24 each): 272 a layer
    assert s.trained == 544 and s.params == PARAMS + 544
    assert (s.weights, s.weights_other, s.save_dtype) == (544 * 4, None, "float32")
    assert (s.resume, s.synced, s.grads) == (2 * 544 * 4, 0, 544 * 4)


def test_a_step_is_the_longer_part_plus_the_exposed_share_of_the_shorter():
    assert comms.step_seconds(2.0, 1.0, 0.2) == pytest.approx(2.2)
    assert comms.step_seconds(1.0, 2.0, 0.2) == pytest.approx(2.2)
    assert comms.step_seconds(1.0, 2.0, 1.0) == pytest.approx(3.0)


def test_the_longest_row_of_k_under_the_length_assumption():
    assert training.longest_row(400, 1024, 1) == 400
    assert training.longest_row(400, 1024, 8) == pytest.approx(800 * 8 / 9)  # 711.1
    assert training.longest_row(400, 500, 8) == 500  # capped at seq_len
    assert training.longest_row(64, 64, 4) == 64  # the seq_len bound stays at it


def test_ranks_wait_for_the_slowest_at_every_fsdp_micro_batch_and_at_the_ddp_step(toy):
    shape, exp = toy
    c = model_cost(shape, exp)
    slowest = training.longest_row(10, 64, 4)  # the longest of 4 ranks' one-row passes: 16
    flops, row = training.step_flops(c, exp, 10)
    assert row == slowest == 16
    assert flops == pytest.approx(2 * 16 * train_flops(c, 16, False))  # both passes wait
    ddp = with_overrides(exp, {"scaling.strategy": "ddp"})
    flops, _ = training.step_flops(c, ddp, 10)
    # no_sync on the first pass: a row of its own (the mean); the last waits for the slowest
    assert flops == pytest.approx(10 * train_flops(c, 10, False) + 16 * train_flops(c, 16, False))  # fmt: skip


def _prof(disk: float, storage: float):
    fig = SimpleNamespace
    return SimpleNamespace(disk_sync_bytes_per_s=fig(value=disk), storage_write_bytes_per_s=fig(value=storage))  # fmt: skip


def test_storage_keeps_every_checkpoints_weights_and_the_newest_resume_state(toy):
    shape, exp = toy
    s = run_sizes(shape, exp)
    w, r = PARAMS * 2, PARAMS * 12
    got = run_storage(s, exp, 5, _prof(disk=100.0, storage=1000.0))
    assert (got.kept, got.stored, got.written) == (5, 5 * w + r, 5 * (w + r))
    # each checkpoint: the fsynced shards at the disk's rate, then every byte copied to storage
    assert got.write_s == pytest.approx(5 * (r / 100 + (w + r) / 1000))
    kept2 = run_storage(s, with_overrides(exp, {"keep_checkpoints": 2}), 5, _prof(100.0, 1000.0))
    assert (kept2.kept, kept2.stored) == (2, 2 * w + r)
    every = with_overrides(exp, {"keep_checkpoints": 2, "resume_state": "all"})
    assert run_storage(s, every, 5, _prof(100.0, 1000.0)).stored == 2 * (w + r)


def test_generation_decodes_to_the_stop_strings_only_with_few_shot_examples():
    mgsm = TaskShape(items=250, prompt_tokens=150, shot_tokens=150, answer_tokens=24)
    assert decode_steps(mgsm, 8, 256) == 24
    assert decode_steps(mgsm, 0, 256) == 256  # zero-shot: the answer's form is not shown
    assert decode_steps(mgsm, 8, 16) == 16  # never past max_gen_toks
    assert decode_steps(mgsm.model_copy(update={"answer_tokens": None}), 8, 256) == 256


def test_bytes_print_in_the_unit_that_fits():
    assert [fmt_bytes(x) for x in (1.07e13, 4.82e10, 6.71e8, 1.54e5, 7328)] == [
        "10.70 TB",
        "48.2 GB",
        "0.671 GB",
        "0.154 MB",
        "7.33 kB",
    ]


def test_the_papers_full_language_run_sends_54_gb_a_step_and_writes_112_gb_a_checkpoint():
    """Llama 3.1 8B, FSDP over 8 H100s, bf16-mixed: issue 40's ~46-54 GB a GPU a step."""
    exp = load_train_experiment(EXAMPLES / "real_llama31_8b_sw_full.yaml")
    shape = model_shape(load_model_config(exp.base)[0])
    s = run_sizes(shape, exp)
    params, root = 8_030_261_248, 2 * 128_256 * 4096 + 4096  # embedding, lm_head, final norm
    assert s.params == params and s.gather_layers == 2 * (params - root)
    assert comms.step_bytes(s, exp) == pytest.approx(7 / 8 * (2 * params + 2 * (params - root) + 4 * params))  # fmt: skip
    assert comms.step_bytes(s, exp) == pytest.approx(54.37e9, rel=1e-3)
    assert s.weights == 2 * params and s.resume == 12 * params  # 16.1 GB; 96.4 GB once a run
