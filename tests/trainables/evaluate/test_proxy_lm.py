"""Batched kernels of the proxy evaluator: same predictions as batch 1, inputs on the model's
device, out-of-memory back-off, and stop detection that only ever saves compute.

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_proxy_lm.py
"""

from __future__ import annotations

import pytest
import torch
from proxy_fixtures import tiny_models, write_world

from layerswap.trainables.evaluate.proxy import ProxyEvaluator
from layerswap.trainables.evaluate.proxy_lm import BatchSizer, greedy_generate, stop_triggers

GEN = {"max_gen_toks": 16}
TASKS = ["mgsm_dev", "bele_dev"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return write_world(tmp_path_factory.mktemp("proxy_lm_world"), n_mgsm=14, n_bele=14)


@pytest.fixture(scope="module")
def models(tok):
    return tiny_models(tok, n=3, seed=1)


def evaluator(world, tok, batch_size):
    return ProxyEvaluator(
        TASKS, tok, include_path=str(world), gen_kwargs=GEN, batch_size=batch_size
    )


def predictions(result) -> dict:
    return {t: [(r.doc_id, r.prediction) for r in items] for t, items in result.items.items()}


def test_batched_rows_predict_as_batch_one(world, tok, models):
    one = evaluator(world, tok, 1)
    batched = [evaluator(world, tok, b) for b in (3, 8, "auto")]
    for model in models:
        ref = one.score(model)
        for ev in batched:
            res = ev.score(model)
            assert predictions(res) == predictions(ref)
            for a, b in zip(res.items["bele_dev"], ref.items["bele_dev"], strict=True):
                # float32: padding moves the last bits at most.
                assert [x for x, _ in a.response] == pytest.approx([x for x, _ in b.response], abs=1e-4)  # fmt: skip
            texts = [r.response for r in res.items["mgsm_dev"]]
            assert texts == [r.response for r in ref.items["mgsm_dev"]]


def test_every_input_is_made_on_the_models_device(world, tok, models):
    """With another default device, a tensor made without `device=` breaks the forward pass.

    This is what happened on a GPU (inputs built on the CPU for a model on cuda).
    """
    ev = evaluator(world, tok, 4)
    ref = ev.score(models[0])
    with torch.device("meta"):
        assert torch.tensor([1]).device.type == "meta"  # the trap is set
        res = ev.score(models[0])
    assert predictions(res) == predictions(ref)


def test_auto_batch_halves_on_out_of_memory(world, tok, models, monkeypatch):
    model = models[0]
    forward, widths = model.forward, []

    def small_memory(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        widths.append(ids.shape[0])
        if ids.shape[0] > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate (test)")
        return forward(*args, **kwargs)

    ref = evaluator(world, tok, 1).score(model)
    ev = evaluator(world, tok, "auto")
    monkeypatch.setattr(model, "forward", small_memory)
    res = ev.score(model)
    assert predictions(res) == predictions(ref)
    assert widths[:4] == [14, 8, 4, 2]  # 14 rows at 16, then 8, 4, 2; 2 is remembered
    assert ev.sizer.fitted == {("cpu", "loglikelihood"): 2, ("cpu", "generate_until"): 2}
    # A fixed size is the user's choice: an OOM is raised, not hidden.
    with pytest.raises(torch.OutOfMemoryError):
        evaluator(world, tok, 8).score(model)


def test_batch_size_is_validated():
    for bad in (0, -1, "big", 2.5):
        with pytest.raises(ValueError, match=repr(bad)):
            BatchSizer(bad)


def test_stop_detection_only_saves_compute(tok, models):
    """Checking the text after trigger tokens only, or never, gives the same answers."""
    model = models[1]
    until = ["2", "Question:", tok.eos_token]
    ctxs = [tok.encode(f"Question: {a} plus {b}? Answer:") for a, b in ((3, 4), (12, 9), (7, 5))]
    stops = {tok.eos_token_id}
    every = greedy_generate(model, tok, ctxs, until, 24, stops, None)
    triggered = greedy_generate(model, tok, ctxs, until, 24, stops, stop_triggers(tok, until))
    never = greedy_generate(model, tok, ctxs, until, 24, stops, [])
    assert every == triggered == never
    digits = stop_triggers(tok, ["2"])
    assert digits and all("2" in tok.decode([i]) or "\ufffd" in tok.decode([i]) for i in digits)


def test_finished_rows_leave_the_batch_without_changing_the_rest(tok, models, monkeypatch):
    from transformers.cache_utils import DynamicCache

    drops, select = [], DynamicCache.batch_select_indices

    def counted(self, indices):
        drops.append(len(indices))
        return select(self, indices)

    monkeypatch.setattr(DynamicCache, "batch_select_indices", counted)
    model = models[0]
    until = ["9", "6", tok.eos_token]  # the tiny models stop after 1 to many tokens
    ctxs = [tok.encode(f"Question: {a} plus {b}? Answer:") for a in range(1, 7) for b in (2, 30)]
    stops = {tok.eos_token_id}
    together = greedy_generate(model, tok, ctxs, until, 16, stops, stop_triggers(tok, until))
    alone = [greedy_generate(model, tok, [c], until, 16, stops)[0] for c in ctxs]
    assert together == alone
    assert drops, "no row finished early: the test lost its point"
