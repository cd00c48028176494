"""The cached proxy evaluator (search trials, indicators) refuses a model whose logits are not
finite, as `layerswap eval` does: NaN logits scored as numbers (an argmax over NaNs picks the
first option), so a diverged model, or a bf16 kernel overflowing on a GPU, got a real-looking
score. Here a forward hook makes one forward's logits NaN.

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_cuda_nonfinite_proxy.py
"""

from __future__ import annotations

import pytest
import torch
from proxy_fixtures import tiny_models, write_world

from layerswap.trainables.evaluate.finite_outputs import NonFiniteOutputs
from layerswap.trainables.evaluate.proxy import ProxyEvaluator

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return write_world(tmp_path_factory.mktemp("nonfinite_world"), n_mgsm=4, n_bele=4)


def evaluator(world, tok):
    return ProxyEvaluator(["bele_dev", "mgsm_dev"], tok, include_path=str(world),
                          gen_kwargs={"max_gen_toks": 4}, batch_size=4)  # fmt: skip


def test_nan_logits_get_no_score_and_the_task_is_named(world, tok):
    model = tiny_models(tok, n=1, seed=3)[0]
    ev = evaluator(world, tok)
    ev.score(model)  # finite: scored
    calls = []

    def nan_on_generation(module, args, kwargs, out):
        calls.append(1)
        if kwargs.get("use_cache"):  # the generation task's forwards only
            out.logits[:, -1, 0] = float("nan")
        return out

    handle = model.register_forward_hook(nan_on_generation, with_kwargs=True)
    try:
        with pytest.raises(NonFiniteOutputs, match="on mgsm_dev: the model's outputs are not finite"):  # fmt: skip
            ev.score(model)
    finally:
        handle.remove()
    assert calls and not model._forward_hooks
    res = ev.score(model)  # the watch is gone with the call: a finite model scores again
    assert all(torch.isfinite(torch.tensor([ll for ll, _ in it.response])).all() for it in res.items["bele_dev"])  # fmt: skip
