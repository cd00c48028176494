"""benchmarks/gpu_check/promotion.py: the promotion memory estimate, byte by byte on a made-up
shape and against issue 40's figure for Llama-3.1-8B, and (slow) the stage's smoke run through
run.py (HFLM on a tiny model; no device memory to measure on CPU).

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_gpu_check_promotion.py [-m "not slow"]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu_check"))
import promotion as P  # noqa: E402

GIB = 2**30
# 1000 weights, 2 layers of 2 KV heads of 4 dims (64 B of cache a token in bf16), vocab 100.
SHAPE = SimpleNamespace(params={"w": 600, "v": 400}, layers=2, kv_heads=2, head_dim=4, hidden=8, intermediate=16, vocab=100)  # fmt: skip


def test_kv_cache_bytes_per_token():
    assert P.kv_bytes_per_token(SHAPE, 2) == 2 * 2 * 2 * 4 * 2 == 64


def test_loglikelihood_peak_is_weights_logits_and_their_log_softmax():
    # 4 rows x 10 tokens: logits 40 x 100 x 2 B = 8000; the forward pass's KV cache (2560),
    # hidden states (1280) and logits (8000) stay under logits + log-softmax (16000)
    one = P.loglikelihood_memory(SHAPE, 4, 10)
    assert one == {"weights": 2000, "logits": 8000, "log_softmax": 8000, "kv_cache": 2560,
                   "hidden": 1280, "previous_batch": 0, "peak": 18000}  # fmt: skip
    # from the second batch on, the previous batch's log-softmax is still held
    assert P.loglikelihood_memory(SHAPE, 4, 10, batches=2)["peak"] == 26000
    # an fp32 log-softmax (HFLM's softmax_dtype) is twice the size
    fp32 = P.loglikelihood_memory(SHAPE, 4, 10, batches=2, softmax_b=4)
    assert fp32["log_softmax"] == fp32["previous_batch"] == 16000 and fp32["peak"] == 42000


def test_loglikelihood_peak_in_the_forward_pass_when_the_vocabulary_is_small():
    small = SimpleNamespace(**{**vars(SHAPE), "vocab": 10})
    # logits 800 < the last layer's MLP (3 x 40 x 16 x 2 = 3840): cache 2560 + hidden 1280 + MLP
    assert P.loglikelihood_memory(small, 4, 10)["peak"] == 2000 + 2560 + 1280 + 3840


def test_generate_peak_is_prefill_or_the_grown_cache():
    got = P.generate_memory(SHAPE, 4, 10, 5)
    # prefill: cache 40 x 64 = 2560 + transient 40 x (3 x 16 + 2 x 8) x 2 = 5120;
    # decoding: cache 4 x 15 x 64 = 3840 + one layer's copy 1920
    assert got == {"weights": 2000, "kv_cache": 3840, "prefill_transient": 5120, "peak": 9680}
    long = P.generate_memory(SHAPE, 4, 10, 200)  # a long generation: the cache decides
    assert long["kv_cache"] == 4 * 210 * 64 and long["peak"] == 2000 + long["kv_cache"] * 3 // 2


def test_longest_fitting_prompt():
    # steady state: 2000 + 3 x (4 x T x 100 x 2) = 2000 + 2400 T
    assert P.longest_fitting(SHAPE, 4, 2000 + 2400 * 7) == 7
    assert P.longest_fitting(SHAPE, 4, 2000 + 2400 * 7 - 1) == 6
    assert P.longest_fitting(SHAPE, 4, 1000) == 0


def test_llama31_8b_belebele_batch_is_issue_40s_figure():
    """32 Belebele 5-shot prompts of ~2,100 tokens at Llama-3.1-8B's shape: ~47 GiB (issue 40)."""
    from layerswap.trainables.train.model_shape import load_model_config, model_shape

    shape = model_shape(load_model_config("meta-llama/Llama-3.1-8B")[0])  # built in, offline
    got = P.loglikelihood_memory(shape, 32, 2100)
    assert got["logits"] == 32 * 2100 * 128256 * 2
    assert got["weights"] == 8_030_261_248 * 2
    assert 46.5 < got["peak"] / GIB < 47.5
    # two such batches in a row need a third logits-sized tensor; a 5,000-token batch does not
    # fit an 80 GB H100 even alone
    assert 62.5 < P.loglikelihood_memory(shape, 32, 2100, batches=2)["peak"] / GIB < 63.5
    assert P.loglikelihood_memory(shape, 32, 5000)["peak"] / GIB > 80


def test_shipped_promotion_is_read_from_the_real_configs():
    shipped = P.shipped_promotion()
    assert set(shipped) == {p.name for p in P.SHIPPED}
    sw = shipped["real_llama31_8b_sw_search.yaml"]
    assert sw["batch_size"] == 32 and sw["max_gen_toks"] == 256
    assert dict(sw["shot_groups"])[5] == ["belebele_swh_Latn"]


@pytest.mark.slow
def test_smoke_run_measures_every_case(tmp_path, tiny_world):
    out = tmp_path / "o"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check" / "run.py"), "--smoke",
                          "--stages", "promotion", "--out", str(out), "--world", str(tiny_world)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    res = json.loads((out / "06_promotion.json").read_text())["result"]
    assert res["batch_size"] == P.SMOKE_BATCH
    cases = res["cases"]
    assert [c["case"] for c in cases] == [c[0] for c in P.SMOKE_CASES]
    for c, (_, kind, tokens, batches) in zip(cases, P.SMOKE_CASES, strict=True):
        assert c["request"] == kind and c["rows"] == P.SMOKE_BATCH * batches
        assert c["fits"] and c["peak_gib"] is None and c["estimate_gib"]["peak"] > 0
        assert abs(c["padded_tokens"] - tokens) <= 2, c  # the texts tokenize to their length
    assert all(f["value"] is None for f in res["figures"])  # nothing measurable on CPU
