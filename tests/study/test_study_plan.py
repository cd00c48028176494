"""`plan_study` on a small hand-built study: exact counts of runs, steps, checkpoints, trials,
models and evaluations; device-hours by hand from the cost model's documented rules on a toy
profile; problems for names that do not resolve. No Ray, no weights: a config.json only.

Run: .venv/bin/pytest -q tests/study/test_study_plan.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from toy_model import toy_config

from layerswap.spaces.study import Profile, load_study
from layerswap.study import estimate as est
from layerswap.study.plan import plan_study
from layerswap.study.report import format_study_plan

# The toy model (tests/study/toy_model.py) in fp32: 1536 matmul weights, 1832 parameters -> 7328 bytes.
CONFIG = toy_config("float32")
N_MM, WEIGHT_BYTES = 1536, 7328


def fwd(ctx: float) -> float:
    """Forward FLOPs per token by hand: 2 N_mm + 2 * layers * ctx * d_attn."""
    return 2 * N_MM + 2 * 2 * ctx * 8


def _fig(v: float) -> dict:
    return {"value": v, "unit": "u", "assumed": "toy"}


TOY = Profile.model_validate(
    {
        "kind": "gpu",
        "device": "toy",
        "unit": "GPU-h",
        "train_flops_per_s": _fig(1e6),
        "prefill_flops_per_s": _fig(1e6),
        "decode_bytes_per_s": _fig(1e3),
        "decode_step_overhead_s": _fig(0.5),
        "merge_bytes_per_s": _fig(1e3),
        "run_startup_s": _fig(10),
        "trial_overhead_s": _fig(1),
        "parallel_efficiency": _fig(0.5),
        "interconnect_bytes_per_s": _fig(1e4),
        "comm_exposed": _fig(0.5),
        "disk_sync_bytes_per_s": _fig(1e2),
        "storage_write_bytes_per_s": _fig(1e3),
    }
)
TASKS = {  # the study's own task shapes, so the expected numbers do not move with the built-ins
    "mgsm_direct_en": {"items": 30, "prompt_tokens": 20},
    "mgsm_direct_sw": {"items": 30, "prompt_tokens": 20},
    "belebele_swh_Latn": {
        "items": 40,
        "prompt_tokens": 30,
        "shot_tokens": 30,
        "choices": 4,
        "continuation_tokens": 2,
    },
}


def make_study(root: Path, **change) -> Path:
    """A full expert (100 local rows, 2 epochs, 2 GPU workers) swept 3 times, and one search."""
    (root / "base").mkdir(parents=True)
    (root / "base" / "config.json").write_text(json.dumps(CONFIG))
    rows = "".join(json.dumps({"question": f"q{i}", "answer": f"a{i}"}) + "\n" for i in range(100))
    (root / "data.jsonl").write_text(rows)
    exp = {
        "name": "toy_math",
        "base": "base",
        "kind": "math",
        "language": "en",
        "datasets": [{"path": "data.jsonl"}],
        "mode": "full",
        "hyper": {"lr": 1e-3, "epochs": 2, "batch_size": 4, "val_share": 0.1, "seq_len": 64},
        "checkpoint_every_samples": 40,
        "scaling": {"num_workers": 2, "use_gpu": True},
    }
    (root / "toy.yaml").write_text(yaml.safe_dump(exp))
    sweep = {
        "num_samples": 3,
        "params": {"hyper.lr": {"low": 1e-4, "high": 1e-3}},
        "indicators": ["mgsm_direct_en"],
        "limit": 20,
        "max_gen_toks": 4,
        "batch_size": 8,
        "device": "cuda",
    }
    search = {
        "name": "toy_search",
        "language": "swh",
        "base": str(root / "base"),
        "task_experts": ["t1", "t2"],
        "language_experts": ["l1"],
        "proxies": [
            {"task": "belebele_swh_Latn", "chance": 0.25, "num_fewshot": 1},
            {"task": "mgsm_direct_en"},
        ],
        "target": "mgsm_direct_sw",
        "search": {"num_samples": 5, "gpus_per_trial": 1},
        "proxy_eval": {"limit": 20, "max_gen_toks": 4, "batch_size": 8},
        "promote": {"top_k": 2, "limit": 10, "max_gen_toks": 4, "batch_size": 5},
    }
    expert = {"config": "toy.yaml", "tokens_per_sample": 10, "sweep": sweep}
    study = {"name": "toy", "experts": [expert], "searches": [{"experiment": search}], "tasks": TASKS}  # fmt: skip
    for key, value in change.items():
        study[key] = value
    (root / "study.yaml").write_text(yaml.safe_dump(study))
    return root / "study.yaml"


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    loaded = load_study(make_study(tmp_path_factory.mktemp("study")))
    return plan_study(loaded, "toy", {"toy": TOY})


def _row(plan, stage: str):
    (st,) = [s for s in plan.stages if s.key == stage]
    assert len(st.rows) == 1
    return st.rows[0]


def test_no_problems(plan):
    assert plan.problems == [] and plan.unknowns == []


def run_seconds() -> float:
    """One run of the toy expert by hand (fp32 base: policy fp32, so gathers, gradients and
    checkpoints are fp32; DDP over 2 workers, batch 4: one micro-batch of 2 rows a worker)."""
    # rows of 10 tokens: the longest of 2 is 2*10*2/3, of the 4 the ranks wait on 2*10*4/5 = 16
    step_compute = 2 * 16 * 3 * fwd(16) / (1e6 * 0.5)  # full: 3 forwards; efficiency 0.5
    step_comm = 2 * (1 / 2) * 7328 / 1e4  # all-reduce of the fp32 gradients, ring of 2
    step = max(step_compute, step_comm) + 0.5 * min(step_compute, step_comm)
    val = 5 * 10 * (40 / 3) * fwd(40 / 3) / (1e6 * 2 * 0.5)  # 10 rows at each of 5 checkpoints
    writes = 5 * (WEIGHT_BYTES + 2 * WEIGHT_BYTES) / 1e3  # weights + AdamW's 2 moments, each time
    return 10 + 45 * step + val + writes


def test_training_counts_and_hours(plan):
    r = _row(plan, "train")
    # 100 rows, val round(0.1*100) = 10 -> 90 train; 2 epochs / batch 4 -> ceil(180/4) = 45
    # steps; checkpoints every 40 samples: steps 10, 20, 30, 40, and the last (45).
    assert r.counts == {
        "runs": 3,
        "samples/run": 180,
        "tokens/run": 1800,
        "steps/run": 45,
        "ckpts/run": 5,
    }
    assert r.hours == pytest.approx(3 * run_seconds() * 2 / 3600)  # 2 GPUs a run
    assert r.gpus == 2 and "2 x GPU (ddp) per run; 3 trial(s)" in r.where
    # storage keeps 5 checkpoints' weights and the newest one's AdamW state, per run
    assert r.storage == pytest.approx(3 * (5 * WEIGHT_BYTES + 2 * WEIGHT_BYTES))
    assert r.costs["comm_bytes"] == 7328 and r.costs["row_tokens"] == 16
    assert r.costs["write_s"] == pytest.approx(5 * 3 * WEIGHT_BYTES / 1e3)


def test_indicator_counts_and_hours(plan):
    r = _row(plan, "indicators")
    assert r.counts == {"checkpoints": 15, "tasks": 1, "evaluations": 15, "items/ckpt": 20}
    # 20 items x 20 prompt tokens, then ceil(20/8) = 3 batches x 4 decoding steps.
    per = 20 * 20 * fwd(20) / 1e6 + 3 * 4 * (WEIGHT_BYTES / 1e3 + 0.5)
    assert r.hours == pytest.approx(15 * per / 3600)


def _proxies() -> float:
    bele = 20 * 68 * fwd(68) / 1e6  # 1 shot: 60 tokens + 4 options x 2, one row per item
    mgsm = 20 * 20 * fwd(20) / 1e6 + 3 * 4 * (WEIGHT_BYTES / 1e3 + 0.5)
    return bele + mgsm


def test_search_counts_and_hours(plan):
    r = _row(plan, "search")
    assert r.counts == {"trials": 5, "proxies": 2, "evaluations": 10, "items/trial": 40}
    fixed = 1 + WEIGHT_BYTES / 1e3  # trial overhead + composing the whole model
    assert r.hours == pytest.approx(5 * (fixed + _proxies()) / 3600)
    # successive halving (the default): the first eta (3) trials full, the other 2 at an eighth
    assert r.hours_low == pytest.approx((5 * fixed + (3 + 2 * 0.125) * _proxies()) / 3600)


def test_promotion_counts_and_hours(plan):
    r = _row(plan, "promotion")
    # top 2 + base, 3 experts, and uniform and magnitude soups, TIES, paper default on each of
    # the 2 expert pairs (t1+l1, t2+l1: promote.baseline_pairs "all") = 2 + 12
    assert r.counts == {
        "models": 14,
        "baselines": 12,
        "tasks": 3,
        "evaluations": 42,
        "items/model": 30,
    }
    mgsm = 10 * 20 * fwd(20) / 1e6 + 2 * 4 * (WEIGHT_BYTES / 1e3 + 0.5)  # batch 5: 2 batches
    bele = 10 * 4 * 62 * fwd(62) / 1e6  # lm-eval: a row per option, 1 shot: 60 + 2 tokens
    assert r.hours == pytest.approx(14 * (2 * mgsm + bele + WEIGHT_BYTES / 1e3) / 3600)
    assert "mgsm_direct_sw, mgsm_direct_en, belebele_swh_Latn" in r.where


def test_totals_and_json(plan):
    assert plan.hours == pytest.approx(sum(s.hours for s in plan.stages))
    assert plan.storage == pytest.approx(sum(s.storage for s in plan.stages))
    data = plan.to_json()
    assert data["layerswap_plan"] == 1 and data["hours"] == pytest.approx(plan.hours)
    assert [s["hours"] for s in data["stages"]] == [s.hours for s in plan.stages]
    assert data["storage"] == pytest.approx(plan.storage) and data["hours_high"] >= data["hours"]
    json.dumps(data)  # plain data all the way down


def test_printed_plan_names_figures_and_their_origin(plan):
    out = format_study_plan(plan)
    assert "stage 1: expert training" in out and "stage 4: promotion" in out
    assert "rests on: comm_exposed 0.5 u (assumed); disk_sync_bytes_per_s 100 u (assumed)" in out
    assert "parallel_efficiency 0.5 u (assumed)" in out
    assert "figures of profile toy (0 of 12 measured)" in out


def test_printed_plan_shows_communication_and_checkpoint_storage(plan):
    out = format_study_plan(plan)
    # 3 runs x (5 checkpoints' weights + the newest's 2 AdamW moments) = 3 x 7 x 7328 bytes,
    # and promotion's best merged model, 7328 bytes
    assert f"stage 1: expert training: {3 * run_seconds() * 2 / 3600:.3g} GPU-h; keeps 0.154 MB on storage" in out  # fmt: skip
    assert "communication 7.33 kB = 733 ms (DDP: float32 gradients all-reduced once a step)" in out  # fmt: skip
    assert "rows of 10 tokens padded to 16: the longest of 4 sets the pace" in out
    assert "checkpoints: 5 x 7.33 kB weights (float32: precision.checkpoint_dtype base) + 14.7 kB resume state (AdamW, masters) kept by the newest checkpoint only: 51.3 kB a run, 0.154 MB for 3" in out  # fmt: skip
    assert "checkpoint writes: 22 kB each, 22 s each: 0.18 GPU-h of the row" in out
    assert "storage when the study ends: 0.161 MB (train 0.154 MB, promotion 7.33 kB)" in out


def test_lora_keeps_the_forward_and_activation_backward(tmp_path):
    from layerswap.spaces.train_experiment import with_overrides
    from layerswap.trainables.train.model_shape import load_model_config, model_shape

    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    shape = model_shape(load_model_config(str(tmp_path))[0])
    loaded = load_study(make_study(tmp_path / "s"))
    lora = with_overrides(loaded.experts[0].experiment, {"mode": {"type": "lora", "rank": 2}})
    c = est.model_cost(shape, lora)
    # rank 2 on q, k, v, o (2*(8+8) each) and gate, up, down (2*(8+16) each): 272 a layer
    assert c.n_trained_mm == 544 and c.n_mm == N_MM + 544
    fwd_lora = 2 * c.n_mm + 2 * 2 * 10 * 8
    assert est.train_flops(c, 10, False) == 2 * fwd_lora + 2 * 2 * 10 * 8 + 2 * 544
    # Gradient checkpointing recomputes the decoder layers' forward, not the lm_head (32 x 8).
    assert c.n_head_mm == 32 * 8
    assert est.train_flops(c, 10, True) == est.train_flops(c, 10, False) + fwd_lora - 2 * 32 * 8


def test_unknown_task_and_source_are_problems(tmp_path):
    path = make_study(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["experts"][0]["sweep"]["indicators"] = ["no_such_task_xyz"]
    data["experts"][0]["overrides"] = {"datasets": [{"source": "no_such_source"}]}
    data["searches"][0]["experiment"]["target"] = "mgsm_direct_zz_missing"
    path.write_text(yaml.safe_dump(data))
    plan = plan_study(load_study(path), "toy", {"toy": TOY})
    text = "\n".join(plan.problems)
    assert "unknown task no_such_task_xyz" in text
    assert "unknown task mgsm_direct_zz_missing" in text and "target" in text
    assert "unknown source 'no_such_source'" in text
    # epochs over a Hub source of unknown size: listed, not guessed
    assert any("rows cannot be counted offline" in u for u in plan.unknowns)
    assert _row(plan, "train").hours is None and plan.hours is None


def test_sweep_trials_that_cannot_run_are_problems(tmp_path):
    path = make_study(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["experts"][0]["sweep"]["params"] = {"hyper.batch_size": {"choices": [4, 3]}}
    path.write_text(yaml.safe_dump(data))
    plan = plan_study(load_study(path), "toy", {"toy": TOY})
    assert any("{'hyper.batch_size': 3} cannot run" in p and "num_workers (2)" in p for p in plan.problems)  # fmt: skip


def test_unknown_profile_lists_the_known(tmp_path):
    with pytest.raises(ValueError, match=r"profile 'tpu': unknown \(known: toy\)"):
        plan_study(load_study(make_study(tmp_path)), "tpu", {"toy": TOY})


def test_generation_decodes_to_the_stop_strings_with_max_gen_toks_as_the_bound(tmp_path):
    path = make_study(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["tasks"]["mgsm_direct_en"] |= {"shot_tokens": 5, "answer_tokens": 2}
    data["experts"][0]["sweep"]["num_fewshot"] = 3
    path.write_text(yaml.safe_dump(data))
    r = _row(plan_study(load_study(path), "toy", {"toy": TOY}), "indicators")
    # 20 items x (20 + 3 x 5) prompt tokens; 3 batches of 8 x 2 steps to the stop strings
    prompts = 20 * 35 * fwd(35) / 1e6
    step = WEIGHT_BYTES / 1e3 + 0.5
    assert r.hours == pytest.approx(15 * (prompts + 3 * 2 * step) / 3600)
    assert r.hours_high == pytest.approx(15 * (prompts + 3 * 4 * step) / 3600)  # max_gen_toks 4
    assert any("2 steps a batch to the tasks' stop strings" in n for n in r.notes)
