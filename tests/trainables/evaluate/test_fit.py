"""trainables/evaluate/fit.py: the evaluation memory estimate's arithmetic, the batch it picks,
and the out-of-memory back-off.

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_fit.py
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from layerswap.trainables.evaluate import fit
from layerswap.trainables.evaluate.fit import (
    RowShape,
    backing_off,
    fitting_batch,
    is_out_of_memory,
    row_bytes,
)

GIB = 2**30
# 1000 weights, 2 layers of 2 KV heads of 4 dims (64 B of cache a token in bf16), vocab 100.
SHAPE = SimpleNamespace(params={"w": 600, "v": 400}, layers=2, kv_heads=2, head_dim=4, hidden=8, intermediate=16, vocab=100)  # fmt: skip


def test_kv_cache_bytes_per_token():
    assert fit.kv_bytes_per_token(SHAPE, 2) == 2 * 2 * 2 * 4 * 2 == 64


def test_loglikelihood_peak_is_weights_logits_and_their_log_softmax():
    # 4 rows x 10 tokens: logits 40 x 100 x 2 B = 8000; the forward pass's KV cache (2560),
    # hidden states (1280) and logits (8000) stay under logits + log-softmax (16000)
    one = fit.loglikelihood_memory(SHAPE, 4, 10)
    assert one == {"weights": 2000, "logits": 8000, "log_softmax": 8000, "kv_cache": 2560,
                   "hidden": 1280, "previous_batch": 0, "peak": 18000}  # fmt: skip
    # from the second batch on, the previous batch's log-softmax is still held
    assert fit.loglikelihood_memory(SHAPE, 4, 10, batches=2)["peak"] == 26000
    # an fp32 log-softmax (HFLM's softmax_dtype) is twice the size
    fp32 = fit.loglikelihood_memory(SHAPE, 4, 10, batches=2, softmax_b=4)
    assert fp32["log_softmax"] == fp32["previous_batch"] == 16000 and fp32["peak"] == 42000


def test_loglikelihood_peak_in_the_forward_pass_when_the_vocabulary_is_small():
    small = SimpleNamespace(**{**vars(SHAPE), "vocab": 10})
    # logits 800 < the last layer's MLP (3 x 40 x 16 x 2 = 3840): cache 2560 + hidden 1280 + MLP
    assert fit.loglikelihood_memory(small, 4, 10)["peak"] == 2000 + 2560 + 1280 + 3840


def test_generate_peak_is_prefill_or_the_grown_cache():
    got = fit.generate_memory(SHAPE, 4, 10, 5)
    # prefill: cache 40 x 64 = 2560 + transient 40 x (3 x 16 + 2 x 8) x 2 = 5120;
    # decoding: cache 4 x 15 x 64 = 3840 + one layer's copy 1920
    assert got == {"weights": 2000, "kv_cache": 3840, "prefill_transient": 5120, "peak": 9680}
    long = fit.generate_memory(SHAPE, 4, 10, 200)  # a long generation: the cache decides
    assert long["kv_cache"] == 4 * 210 * 64 and long["peak"] == 2000 + long["kv_cache"] * 3 // 2


def test_llama31_8b_belebele_batch_is_issue_40s_figure():
    """32 Belebele 5-shot prompts of ~2,100 tokens at Llama-3.1-8B's shape: ~47 GiB (issue 40)."""
    from layerswap.trainables.train.model_shape import load_model_config, model_shape

    shape = model_shape(load_model_config("meta-llama/Llama-3.1-8B")[0])  # built in, offline
    got = fit.loglikelihood_memory(shape, 32, 2100)
    assert got["logits"] == 32 * 2100 * 128256 * 2
    assert got["weights"] == 8_030_261_248 * 2
    assert 46.5 < got["peak"] / GIB < 47.5
    # two such batches in a row need a third logits-sized tensor; a 5,000-token batch does not
    # fit an 80 GB H100 even alone
    assert 62.5 < fit.loglikelihood_memory(shape, 32, 2100, batches=2)["peak"] / GIB < 63.5
    assert fit.loglikelihood_memory(shape, 32, 5000)["peak"] / GIB > 80


def test_a_row_costs_the_steady_state_peak_less_the_weights():
    # 1 row x 10 tokens, batches=2: 3 x (10 x 100 x 2) = 6000 beyond the 2000 of weights
    assert row_bytes(RowShape("loglikelihood", 10), SHAPE) == 6000
    assert row_bytes(RowShape("generate", 10, 5), SHAPE) == fit.generate_memory(SHAPE, 1, 10, 5)["peak"] - 2000  # fmt: skip
    with pytest.raises(ValueError, match="request kind 'rank'"):
        row_bytes(RowShape("rank", 10), SHAPE)


def test_the_batch_is_the_largest_that_fits_and_never_above_the_configured():
    from layerswap.trainables.train.model_shape import load_model_config, model_shape

    L8B = model_shape(load_model_config("meta-llama/Llama-3.1-8B")[0])  # built in, offline
    row = RowShape("loglikelihood", 2100)
    per = row_bytes(row, L8B)
    free = 60 * 2**30  # an H100 with the 16 GB model loaded
    got = fitting_batch([row], L8B, free, want=32)
    assert got == min(32, int(0.8 * free // per))
    assert fitting_batch([row], L8B, 30 * 2**30, want=32) == int(0.8 * 30 * 2**30 // per) < 32
    assert fitting_batch([row], L8B, 1, want=32) == 1  # nothing fits: 1, the back-off reports it
    assert fitting_batch([], L8B, 1, want=32) == 32
    # the costliest task decides
    long_gen = RowShape("generate", 6000, 256)
    assert fitting_batch([row, long_gen], L8B, free, want=32) == got


def test_back_off_halves_on_out_of_memory_down_to_one():
    tried, said = [], []

    def run(b):
        tried.append(b)
        if b > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return f"ok at {b}"

    assert backing_off(run, 32, lambda a, b: said.append((a, b))) == ("ok at 2", 2)
    assert tried == [32, 16, 8, 4, 2] and said == [(32, 16), (16, 8), (8, 4), (4, 2)]

    def never(b):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):
        backing_off(never, 4)


def test_other_errors_are_not_retried():
    tried = []

    def run(b):
        tried.append(b)
        raise ValueError("bad task")

    with pytest.raises(ValueError, match="bad task"):
        backing_off(run, 8)
    assert tried == [8]
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_auto_on_a_cpu_bounds_lm_evals_probe_to_the_longest_row(monkeypatch):
    """lm-eval's "auto" probes 64 rows at HFLM's max_length, which on a CPU never runs out of
    memory and cost 86 % of a 2-item promotion at the model's own max_length: bounded to the
    longest prompt plus max_gen_toks on every device. An int on a CPU is taken as it is."""
    from layerswap.trainables.evaluate import proxy

    monkeypatch.setattr(proxy, "ProxyEvaluator", lambda *a, **kw: "evaluator")
    rows = [RowShape("loglikelihood", 50), RowShape("generate", 30, 24)]
    monkeypatch.setattr(fit, "task_rows", lambda ev, model=None: rows if ev == "evaluator" else [])
    model = torch.nn.Linear(2, 2)  # on the CPU
    kw = dict(include_path=None, limit=2, num_fewshot=0, max_gen_toks=24)
    auto = fit.eval_batch(model, None, ["t"], want="auto", **kw)
    assert (auto.batch_size, auto.max_length) == ("auto", 54)
    four = fit.eval_batch(model, None, ["t"], want=4, **kw)
    assert (four.batch_size, four.max_length) == (4, None)


def test_the_bound_never_passes_the_models_own_window(tok, tmp_path):
    """A prompt longer than the model's window: lm-eval at the bounded "auto" truncates it as
    at its default window (it read past max_position_embeddings, 2.9 nats off on the world)."""
    from proxy_fixtures import tiny_models, write_world

    from layerswap.trainables.evaluate.harness import evaluate

    world, model = write_world(tmp_path), tiny_models(tok, n=1)[0]
    model.config.max_position_embeddings = 48  # rotary positions: nothing else reads it
    kw = dict(include_path=str(world), limit=3, num_fewshot=None)
    plan = fit.eval_batch(model, tok, ["bele_dev"], max_gen_toks=8, want="auto", **kw)
    assert plan.max_length == 48
    run = dict(tokenizer=tok, device="cpu", verbose=False, **kw)
    bounded = evaluate(model, ["bele_dev"], batch_size="auto", max_length=plan.max_length, **run)
    default = evaluate(model, ["bele_dev"], batch_size=1, **run)
    lls = [
        {s["doc_id"]: [r[0][0] for r in s["resps"]] for s in raw["samples"]["bele_dev"]}
        for raw in (bounded, default)
    ]
    assert lls[0].keys() == lls[1].keys()
    for d in lls[1]:
        assert lls[0][d] == pytest.approx(lls[1][d], abs=1e-4)


def test_a_generation_config_budget_sizes_the_generate_rows(tok, tmp_path):
    """generate() obeys generation_config's max_new_tokens over the max_length lm-eval passes
    (the proxy does too), so promotion's memory estimate and bound must count it, not the
    task's max_gen_toks: an int batch sized for 8 new tokens would run out of memory at 2048."""
    from proxy_fixtures import tiny_models, write_world

    from layerswap.trainables.evaluate.proxy import ProxyEvaluator
    from layerswap.trainables.evaluate.proxy_lm import hflm_max_length

    world, model = write_world(tmp_path), tiny_models(tok, n=1)[0]
    kw = dict(include_path=str(world), limit=3, num_fewshot=None)
    ev = ProxyEvaluator(["mgsm_dev"], tok, gen_kwargs={"max_gen_toks": 8}, **kw)
    assert [r.new_tokens for r in fit.task_rows(ev)] == [8]
    assert [r.new_tokens for r in fit.task_rows(ev, model)] == [8]
    model.generation_config.max_new_tokens = 40
    assert [r.new_tokens for r in fit.task_rows(ev, model)] == [40]
    plan = fit.eval_batch(model, tok, ["mgsm_dev"], max_gen_toks=8, want="auto", **kw)
    longest = max(r.tokens for r in fit.task_rows(ev))
    assert plan.max_length == min(longest + 40, hflm_max_length(model, tok))


def test_a_gpu_batch_counts_the_allocators_cached_bytes_as_free(monkeypatch):
    """Promotion builds its model on the GPU with random weights, then replaces every parameter:
    the old storage stays in PyTorch's cache, free to PyTorch but not to the driver, and the
    first batch was sized as if one model less fitted. mem_get_info's free plus reserved less
    allocated is what the process can use; on a CPU none of them is read."""
    from layerswap.trainables.evaluate import proxy, proxy_lm
    from layerswap.trainables.train import model_shape

    monkeypatch.setattr(proxy, "ProxyEvaluator", lambda *a, **kw: "evaluator")
    rows = [RowShape("loglikelihood", 50)]
    monkeypatch.setattr(fit, "task_rows", lambda ev, model=None: rows)
    monkeypatch.setattr(model_shape, "model_shape", lambda config: SHAPE)
    monkeypatch.setattr(proxy_lm, "hflm_max_length", lambda model, tok: 4096)

    def unread(*a, **kw):
        raise AssertionError("CUDA memory read for a CPU model")

    for name in ("mem_get_info", "memory_reserved", "memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, unread)
    model = torch.nn.Linear(2, 2)
    model.config = None
    kw = dict(include_path=None, limit=2, num_fewshot=0, max_gen_toks=24)
    assert fit.eval_batch(model, None, ["t"], want=512, **kw).batch_size == 512  # CPU: as is

    per_row = row_bytes(rows[0], SHAPE, 4)
    monkeypatch.setattr(proxy_lm, "model_device", lambda m: torch.device("cuda", 0))
    # the driver: 10 rows free; the cache: 50 rows reserved, 40 of them free since the rebuild
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (10 * per_row, 100 * per_row))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 50 * per_row)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 10 * per_row)
    plan = fit.eval_batch(model, None, ["t"], want=512, **kw)
    assert plan.batch_size == fitting_batch(rows, SHAPE, 50 * per_row, 512, 4)
    assert plan.batch_size > fitting_batch(rows, SHAPE, 10 * per_row, 512, 4)
