"""FSDP2 training: the same steps as DDP, a consolidated HF checkpoint, an exact resume.

Two gloo processes (torch.multiprocessing) run the plain loop with scaling.strategy fsdp and
ddp on the tiny world. Run: .venv/bin/python -m pytest tests/trainables/train/test_fsdp.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from train_helpers import EDGE, ddp_worker, make_exp

from layerswap.trainables.train import run_training

pytestmark = pytest.mark.slow

HYPER = {"max_steps": 6, "batch_size": 8, "micro_batch_size": 2, "lr": 1e-3}
PARTIAL = {"type": "partial", "partition": EDGE, "train": "task"}
SIMULTANEOUS = {"type": "simultaneous", "partition": {**EDGE, "non_layer": "language"}}


def _job(world, root, name, mode="full", hyper_over=None, **over):
    exp = make_exp(world, mode, hyper=HYPER | (hyper_over or {}), scaling={"num_workers": 2, **over.pop("scaling", {})}, checkpoint_every_samples=24, **over)  # fmt: skip
    return {"id": name, "experiment": exp.model_dump(mode="json"), "workdir": str(root / name)}


def _fp32_jobs(world, root):
    """ddp and fsdp (full and simultaneous), fp32."""
    fsdp = {"strategy": "fsdp"}
    return [
        _job(world, root, "ddp", precision="fp32"),
        _job(world, root, "fsdp", precision="fp32", scaling=fsdp),
        _job(world, root, "sim_ddp", SIMULTANEOUS, precision="fp32"),
        _job(world, root, "sim_fsdp", SIMULTANEOUS, precision="fp32", scaling=fsdp),
    ]


def _mixed_jobs(bf16_world, root):
    """bf16-mixed on a bf16 base: ddp, fsdp, fsdp with CPU offload, and a partial run whose
    frozen half stays bf16 while the trained half has fp32 masters, in one FSDP unit."""
    fsdp = {"strategy": "fsdp"}
    return [
        _job(bf16_world, root, "ddp", precision="bf16-mixed"),
        _job(bf16_world, root, "fsdp", precision="bf16-mixed", scaling=fsdp),
        _job(
            bf16_world,
            root,
            "offload",
            precision="bf16-mixed",
            scaling=fsdp | {"cpu_offload": True},
            hyper_over={"gradient_checkpointing": True},  # recomputing gives the same numbers
        ),
        _job(bf16_world, root, "partial", PARTIAL, precision="bf16-mixed", scaling=fsdp),
    ]


def _resume_jobs(world, root):
    """Simultaneous (k=4) under fsdp, whole and resumed from its first checkpoint, which comes
    before the language side's optimizer has ever stepped (its state is empty there)."""
    mode = SIMULTANEOUS | {"k": 4}
    # resumed from a checkpoint that is not the run's newest: resume_state all keeps its state
    whole = _job(world, root, "whole", mode, precision="fp32", scaling={"strategy": "fsdp"}, resume_state="all")  # fmt: skip
    first = Path(whole["workdir"], "checkpoints", "samples_000000024")
    again = _job(world, root, "again", mode, precision="fp32", scaling={"strategy": "fsdp"})
    again["resume_from"] = str(first)  # jobs run in order: `whole` has written it by then
    ddp = _job(world, root, "ddp", mode, precision="fp32")
    return [whole, again, ddp]


@pytest.fixture(scope="module")
def groups(tiny_world, bf16_world, tmp_path_factory) -> dict[str, dict]:
    """Every job of the module in one spawned 2-process gloo group, run one after another:
    process start-up, the torch import and the group's rendezvous are paid once, not per
    fixture (each costs as much as the tiny runs themselves on 2 shared cores).

    Returns:
        {"fp32" | "mixed" | "resume": {job id: result}}.
    """
    root = tmp_path_factory.mktemp("fsdp")
    makers = {"fp32": (_fp32_jobs, tiny_world), "mixed": (_mixed_jobs, bf16_world), "resume": (_resume_jobs, tiny_world)}  # fmt: skip
    jobs = []
    for group, (make, world) in makers.items():
        for job in make(world, root / group):
            jobs.append(job | {"id": f"{group}/{job['id']}"})
    out = root / "results.json"
    mp.spawn(ddp_worker, args=(2, f"file://{root}/pg", jobs, str(out)), nprocs=2, join=True)
    res = json.loads(out.read_text())
    return {g: {k.split("/", 1)[1]: v for k, v in res.items() if k.startswith(f"{g}/")} for g in makers}  # fmt: skip


@pytest.fixture(scope="module")
def runs(groups):
    """ddp and fsdp (full and simultaneous) in one 2-process group, fp32."""
    return groups["fp32"]


@pytest.fixture(scope="module")
def mixed_runs(groups):
    """bf16-mixed runs (see _mixed_jobs)."""
    return groups["mixed"]


@pytest.fixture(scope="module")
def resumed(groups):
    """fsdp simultaneous k=4, whole and resumed, and its ddp twin (see _resume_jobs)."""
    return groups["resume"]


@pytest.mark.parametrize("pair", [("ddp", "fsdp"), ("sim_ddp", "sim_fsdp")])
def test_fsdp_takes_the_steps_ddp_takes(runs, pair):
    ddp, fsdp = (runs[k] for k in pair)
    assert fsdp["losses"] == pytest.approx(ddp["losses"], rel=1e-4, abs=1e-5)
    assert [r["grad_norm"] for r in fsdp["reports"]] == pytest.approx([r["grad_norm"] for r in ddp["reports"]], rel=1e-4)  # fmt: skip
    a = load_file(f"{ddp['final']}/model.safetensors")
    b = load_file(f"{fsdp['final']}/model.safetensors")
    assert set(a) == set(b)
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=1e-5), name


@pytest.mark.parametrize("mode", ["full", "simultaneous"])
def test_two_workers_take_the_one_worker_steps(tiny_world, tmp_path, runs, mode):
    """The same global batch gives the same steps on 1 and 2 workers, under ddp and fsdp, with
    micro-batches: every rank's loss is over the step's label tokens on ALL ranks (the ranks'
    shares of a batch hold different numbers of them)."""
    cfg = "full" if mode == "full" else SIMULTANEOUS
    exp = make_exp(tiny_world, cfg, hyper=HYPER, checkpoint_every_samples=24, precision="fp32")
    seen: list[dict] = []
    one = run_training(exp, workdir=tmp_path, report=lambda m, p: seen.append(m))
    a = load_file(one.final_checkpoint / "model.safetensors")
    for two in (runs["ddp"], runs["fsdp"]) if mode == "full" else (runs["sim_ddp"], runs["sim_fsdp"]):  # fmt: skip
        assert [r["loss"] for r in two["reports"]] == pytest.approx(one.losses, rel=1e-5)
        assert [r["grad_norm"] for r in two["reports"]] == pytest.approx([r["grad_norm"] for r in seen], rel=1e-5)  # fmt: skip
        b = load_file(f"{two['final']}/model.safetensors")
        for name in a:
            assert torch.allclose(a[name], b[name], rtol=0, atol=1e-5), name


def test_consolidated_checkpoint_loads_and_equals_the_sharded_state(runs):
    from torch.distributed.checkpoint import load as dcp_load
    from transformers import AutoModelForCausalLM

    ckpt = runs["fsdp"]["final"]
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    saved = load_file(f"{ckpt}/model.safetensors")
    # The shards, read back whole without a process group: the consolidated file must be them.
    want = {"model": {k: torch.empty_like(v) for k, v in saved.items()}}
    dcp_load(want, checkpoint_id=f"{ckpt}/trainer_state/dcp", no_dist=True)
    for name, t in model.state_dict().items():
        assert torch.equal(t, want["model"][name]), name
    files = sorted(p.name for p in Path(ckpt, "trainer_state/dcp").iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"]


def test_simultaneous_alternates_sides_under_fsdp(runs):
    assert [r["active"] for r in runs["sim_fsdp"]["reports"]] == ["task", "language"] * 3


def test_fsdp_mixed_precision_tracks_ddp(mixed_runs):
    # bf16 compute: FSDP casts the gathered weights (param_dtype), DDP autocasts the matmuls;
    # the two round differently, so only the trajectory is compared, loosely.
    assert mixed_runs["fsdp"]["losses"] == pytest.approx(mixed_runs["ddp"]["losses"], rel=2e-2)


def test_cpu_offload_takes_the_same_steps(mixed_runs):
    assert mixed_runs["offload"]["losses"] == pytest.approx(mixed_runs["fsdp"]["losses"], rel=1e-5)


def test_fsdp_partial_keeps_frozen_layers_bit_identical(bf16_world, mixed_runs):
    from layerswap.trainables.merge.arch import param_slot

    base = load_file(bf16_world / "base/model.safetensors")
    ckpt = mixed_runs["partial"]["final"]
    got = load_file(f"{ckpt}/model.safetensors")
    assert {t.dtype for t in got.values()} == {torch.bfloat16}
    for name in base:
        moved = not torch.equal(base[name], got[name])
        assert moved == (param_slot(name).layer in (1, 2)), name


def test_fsdp_resume_is_exact_even_before_a_side_has_stepped(resumed):
    whole, again = resumed["whole"], resumed["again"]
    assert [r["active"] for r in whole["reports"]][:4] == ["task"] * 4  # k=4: checkpoint at 3
    assert [r["step"] for r in again["reports"]] == [4, 5, 6]
    assert again["losses"] == whole["losses"][3:]
    a = load_file(f"{whole['final']}/model.safetensors")
    b = load_file(f"{again['final']}/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # and the same steps DDP takes: saving the checkpoint gave the idle side no AdamW step
    assert whole["losses"] == pytest.approx(resumed["ddp"]["losses"], rel=1e-4, abs=1e-5)
