"""benchmarks/gpu_check/promotion.py: the promotion memory estimate, byte by byte on a made-up
shape and against issue 40's figure for Llama-3.1-8B, and (slow) the stage's smoke run through
run.py (HFLM on a tiny model; no device memory to measure on CPU).

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_gpu_check_promotion.py [-m "not slow"]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_check import promotion as P  # noqa: E402

GIB = 2**30
# 1000 weights, 2 layers of 2 KV heads of 4 dims (64 B of cache a token in bf16), vocab 100
# (the estimate's own tests: tests/trainables/evaluate/test_fit.py).
SHAPE = SimpleNamespace(params={"w": 600, "v": 400}, layers=2, kv_heads=2, head_dim=4, hidden=8, intermediate=16, vocab=100)  # fmt: skip


def test_longest_fitting_prompt():
    # steady state: 2000 + 3 x (4 x T x 100 x 2) = 2000 + 2400 T
    assert P.longest_fitting(SHAPE, 4, 2000 + 2400 * 7) == 7
    assert P.longest_fitting(SHAPE, 4, 2000 + 2400 * 7 - 1) == 6
    assert P.longest_fitting(SHAPE, 4, 1000) == 0


def test_shipped_promotion_is_read_from_the_real_configs():
    shipped = P.shipped_promotion()
    assert set(shipped) == {p.name for p in P.SHIPPED}
    sw = shipped["real_llama31_8b_sw_search.yaml"]
    assert sw["batch_size"] == 32 and sw["max_gen_toks"] == 256
    assert dict(sw["shot_groups"])[5] == ["belebele_swh_Latn"]


@pytest.mark.slow
def test_smoke_run_measures_every_case(gpu_check_smoke):
    out = gpu_check_smoke
    res = json.loads((out / "05_promotion.json").read_text())["result"]
    assert res["batch_size"] == P.SMOKE_BATCH
    cases = res["cases"]
    assert [c["case"] for c in cases] == [c[0] for c in P.SMOKE_CASES]
    for c, (_, kind, tokens, batches) in zip(cases, P.SMOKE_CASES, strict=True):
        assert c["request"] == kind and c["rows"] == P.SMOKE_BATCH * batches
        assert c["fits"] and c["peak_gib"] is None and c["estimate_gib"]["peak"] > 0
        assert abs(c["padded_tokens"] - tokens) <= 2, c  # the texts tokenize to their length
    assert all(f["value"] is None for f in res["figures"])  # nothing measurable on CPU
