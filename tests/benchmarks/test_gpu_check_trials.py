"""benchmarks/gpu_check/trials.py: the arithmetic that turns measured trials into the shipped
search config's trials per GPU-hour (on made-up numbers), and (slow) the stage's smoke run.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_gpu_check_trials.py [-m "not slow"]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_check import trial_cost as C  # noqa: E402
from gpu_check import trials as T  # noqa: E402
from gpu_check.figures import per_hour  # noqa: E402

from layerswap.spaces.search_experiment import Fidelity  # noqa: E402
from layerswap.spaces.study import load_profiles  # noqa: E402
from layerswap.spaces.task_families import TaskShape  # noqa: E402
from layerswap.study.estimate import ModelCost, evals_cost, forward_flops  # noqa: E402

# A made-up 8B-like model: 7e9 matmul weights, 32 layers, 16 GB of weights.
COST = ModelCost(params=8e9, n_mm=7e9, n_trained_mm=0, layers=32, d_attn=4096, weight_bytes=16e9, trained=0)  # fmt: skip
BELE = TaskShape(items=900, prompt_tokens=350, shot_tokens=350, choices=4, continuation_tokens=15)
MGSM = TaskShape(items=250, prompt_tokens=150, shot_tokens=150)
TASKS = [(BELE, 5), (MGSM, 8)]
SHIPPED = dict(limit=None, gen_toks=256, batch=64, screen=0.25)


def test_device_depth_is_the_placement_rule():
    # 80 GB x 0.7 = 56 GB over 4 copies (3 checkpoints + the live model): 14 GB each, 2 GB of
    # embeddings, 0.5 GB a layer -> 24 layers
    assert C.device_depth(0.5e9, 2e9, 32, 80e9, 0.3) == 24
    assert C.device_depth(0.5e9, 2e9, 32, 800e9, 0.3) == 32  # never deeper than the model
    assert C.device_depth(0.5e9, 20e9, 32, 80e9, 0.3) == 0  # embeddings alone do not fit
    # Llama-3.1-8B (436 MB a layer, 2.1 GB outside them) on an H100's 79.1 GiB: 29 of 32
    assert C.device_depth(436_207_616, 2_101_354_496, 32, 79.1 * 2**30, 0.3) == 29


def test_screen_counts_split_a_trial_as_the_evaluator_does():
    assert C.screen_counts(900, 0.25) == [225, 675]
    assert C.screen_counts(250, 0.25) == [63, 187]  # ceil(62.5)
    assert C.screen_counts(20, None) == [20]
    assert C.screen_counts(1, 0.25) == [1]  # at least one item, nothing left after


def test_proxy_seconds_at_measured_rates():
    profs = C.rate_profiles(mc_flops_per_s=1e14, prefill_flops_per_s=2e14, step_s=0.05)
    got = C.proxy_seconds(profs, COST, TASKS, **SHIPPED)
    row = 350 + 5 * 350 + 4 * 15  # one row per item: the 5-shot prompt and the four options
    ctx = 150 + 8 * 150
    mc = 900 * row * (2 * 7e9 + 2 * 32 * row * 4096) / 1e14
    prefill = 250 * ctx * (2 * 7e9 + 2 * 32 * ctx * 4096) / 2e14
    # screened 63 items: one batch of 64; the other 187: three; 256 steps a batch
    assert got["kept"] == pytest.approx({"mc": mc, "prefill": prefill, "decode": 4 * 256 * 0.05})
    assert got["pruned"] == pytest.approx({"mc": mc * 225 / 900, "prefill": prefill * 63 / 250, "decode": 256 * 0.05})  # fmt: skip


def test_the_plans_profile_gives_the_plans_seconds():
    """With the h100 profile, a kept trial's proxies cost what `layerswap plan` counts."""
    prof = load_profiles()["h100"]
    got = C.proxy_seconds({"mc": prof, "gen": prof}, COST, TASKS, **SHIPPED)
    plan, items, _ = evals_cost(COST, TASKS, None, 256, 64, prof, row_per_option=False)
    assert items == 1150 and sum(got["kept"].values()) == pytest.approx(plan)
    assert 0 < sum(got["pruned"].values()) < plan / 2


def test_pass_rates_and_the_shipped_trial():
    rows = [{"first": True, "compose_s": 9.0, "move_s": 9.0, "score_s": 9.0, "mc_s": 9.0, "gen_s": 9.0,
             "prefill_s": 9.0, "steps": 9, "step_rows": 99}]  # fmt: skip
    rows += [{"first": False, "compose_s": c, "move_s": 0.5, "score_s": 5.5, "mc_s": 2.0, "gen_s": 3.0,
              "prefill_s": 1.0, "steps": 40, "step_rows": 800} for c in (0.1, 0.3, 0.2)]  # fmt: skip
    # mc 4e14 FLOPs in 2 s, prefill 1e14 in 1 s, 2 s of decoding over 40 steps
    rates = C.pass_rates(rows[1:], 4e14, 1e14, step_scale=2.0)
    assert rates == pytest.approx(
        {"mc_flops_per_s": 2e14, "prefill_flops_per_s": 1e14, "step_s": 0.1}
    )
    # the pass's model had half the weights: its decoding step doubles at the full depth
    p = {"rows": rows, "flops": (4e14, 1e14), "weight_bytes": COST.weight_bytes / 2}
    shipped = SimpleNamespace(proxy_eval=SimpleNamespace(limit=None, max_gen_toks=256),
                              search=SimpleNamespace(fidelity=Fidelity(policy="screen", screen=0.25), multi_objective=False))  # fmt: skip
    s = T.shipped_trial(p, COST, TASKS, shipped, 64)
    assert s["median"] == {"compose_s": 0.2, "move_s": 0.5, "score_s": 5.5}  # the first is left out
    assert s["step_rows"] == 20 and s["other_s"] == pytest.approx(0.5)
    want = C.proxy_seconds(C.rate_profiles(2e14, 1e14, 0.1), COST, TASKS, **SHIPPED)
    assert s["kept"]["total_s"] == pytest.approx(0.2 + 0.5 + 0.5 + sum(want["kept"].values()))
    assert s["pruned"]["decode"] == pytest.approx(256 * 0.1)
    assert per_hour(s["kept"]["total_s"]) < per_hour(s["pruned"]["total_s"])


def test_a_pass_at_reduced_depth_scales_compose_and_move_to_the_full_depth():
    """The space is in fractions of depth: at 29 of 32 layers a recipe swaps ~29/32 as many
    layers, so a device pass's compose and move stand for 32/29 times as much."""
    assert T.swap_scale(32, 29) == pytest.approx(32 / 29) and T.swap_scale(32, 32) == 1.0
    assert T.swap_scale(32, 0) == 1.0  # nothing fitted: no pass to scale
    rows = [{"first": f, "compose_s": 0.29, "move_s": 0.58, "score_s": 5.5, "mc_s": 2.0, "gen_s": 3.0,
             "prefill_s": 1.0, "steps": 40, "step_rows": 800} for f in (True, False)]  # fmt: skip
    p = {"rows": rows, "flops": (4e14, 1e14), "weight_bytes": COST.weight_bytes}
    shipped = SimpleNamespace(proxy_eval=SimpleNamespace(limit=None, max_gen_toks=256),
                              search=SimpleNamespace(fidelity=Fidelity(policy="screen", screen=0.25), multi_objective=False))  # fmt: skip
    plain, scaled = (T.shipped_trial(p, COST, TASKS, shipped, 64, k) for k in (1.0, 32 / 29))
    assert scaled["median"]["compose_s"] == pytest.approx(0.32)
    assert scaled["median"]["move_s"] == pytest.approx(0.64)
    assert scaled["kept"]["total_s"] - plain["kept"]["total_s"] == pytest.approx(0.03 + 0.06)


def test_pass_figures_without_a_profile_for_the_gpu_assume_nothing():
    """On a GPU spaces/throughput.yaml has no profile for (an H200 today) nothing is assumed,
    and the report still renders (an empty dict as 'assumed' broke it)."""
    from gpu_check.report import _row

    rows = [{"first": f, "compose_s": 0.2, "move_s": 0.5, "score_s": 5.5, "mc_s": 2.0, "gen_s": 3.0, "prefill_s": 1.0,
             "steps": 40, "step_rows": 800, "moved": 9, "moved_bytes": 2**30} for f in (True, False)]  # fmt: skip
    p = {"rows": rows, "flops": (4e14, 1e14), "weight_bytes": COST.weight_bytes, "depth": 32}
    shipped = SimpleNamespace(proxy_eval=SimpleNamespace(limit=None, max_gen_toks=256),
                              search=SimpleNamespace(fidelity=Fidelity(policy="screen", screen=0.25), multi_objective=False))  # fmt: skip
    s = T.shipped_trial(p, COST, TASKS, shipped, 64)
    figs = T._pass_figures("host", p, s, None, {"limit": 4, "gen_toks": 4})
    assert figs and all(f.assumed is None for f in figs)
    assert all(_row(f).startswith(f"| {f.name} |") for f in figs)


def test_forward_flops_is_the_plans_rule():
    # item_flops counts with study.estimate.forward_flops; pin the rule it relies on
    assert forward_flops(COST, 100) == 2 * 7e9 + 2 * 32 * 100 * 4096


@pytest.mark.slow
def test_smoke_run_measures_both_placements(gpu_check_smoke):
    out = gpu_check_smoke
    rec = json.loads((out / "03_trials.json").read_text())
    res = rec["result"]
    for key in ("device", "host"):
        rows = res["measured"]["passes"][key]["rows"]
        assert rows[0]["first"] and len(rows) >= 2
        assert rows[1]["moved"] > 0 and rows[1]["mc_s"] > 0 and rows[1]["steps"] > 0
        assert res["shipped"][key]["kept"]["total_s"] > res["shipped"][key]["pruned"]["total_s"]
    names = [f["name"] for f in res["figures"]]
    assert "shipped-config trials per GPU-hour, every trial kept (experts in host memory)" in names
    assert "throughput" not in res  # measured on a GPU only
