"""The proxy evaluator decodes by the rules model.generate gives lm-eval's HFLM, or refuses.

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_decoding.py
"""

from __future__ import annotations

import pytest
from proxy_fixtures import lm_eval_samples, tiny_models, write_world

from layerswap.trainables.evaluate.proxy import ProxyEvaluator

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return write_world(tmp_path_factory.mktemp("decoding_world"))


@pytest.fixture
def model(tok):
    return tiny_models(tok, n=1)[0]


def texts_match_lm_eval(model, tok, world, gen) -> dict[int, str]:
    """The proxy's texts at batch 1, asserted equal to HFLM's; returned by doc id."""
    ev = ProxyEvaluator(["mgsm_dev"], tok, include_path=str(world), gen_kwargs=gen)
    ours = {r.doc_id: r.response for r in ev.score(model).items["mgsm_dev"]}
    ref = lm_eval_samples(model, tok, world, ["mgsm_dev"], gen)["mgsm_dev"]
    assert ours == {d: s["resps"][0][0] for (d, f), s in ref.items() if f == "flexible-extract"}
    return ours


def test_generation_config_and_task_kwargs_decode_as_lm_eval(model, tok, world):
    gen = {"max_gen_toks": 16}
    plain = texts_match_lm_eval(model, tok, world, gen)
    # Qwen2.5-Instruct's shape: sampling settings (lm-eval's do_sample=False turns them off),
    # a repetition penalty (kept), and a list of EOS ids ("6", id 24, is one: rows stop on it).
    six = tok.convert_tokens_to_ids("6")
    model.generation_config.update(
        do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.3,
        eos_token_id=[tok.eos_token_id, six],
    )  # fmt: skip
    penalized = texts_match_lm_eval(model, tok, world, gen)
    assert penalized != plain
    assert all("6" not in t[:-1] for t in penalized.values())  # stopped at the first "6"
    # generation_config's max_new_tokens wins over lm-eval's max_gen_toks, as in generate.
    model.generation_config.update(repetition_penalty=1.0, eos_token_id=tok.eos_token_id)
    model.generation_config.max_new_tokens = 4
    short = texts_match_lm_eval(model, tok, world, gen)
    assert max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in short.values()) < 16
    # A task's own kwargs: no_repeat_ngram_size, and a repetition penalty.
    model.generation_config.max_new_tokens = None
    texts_match_lm_eval(model, tok, world, {**gen, "no_repeat_ngram_size": 2})
    texts_match_lm_eval(model, tok, world, {**gen, "repetition_penalty": 1.2})


def test_batched_rows_apply_the_rules_as_batch_one(model, tok, world):
    gen, inc = {"max_gen_toks": 16}, str(world)
    one = ProxyEvaluator(["mgsm_dev"], tok, include_path=inc, gen_kwargs=gen)
    four = ProxyEvaluator(["mgsm_dev"], tok, include_path=inc, gen_kwargs=gen, batch_size=4)
    plain = [r.response for r in one.score(model).items["mgsm_dev"]]
    model.generation_config.update(repetition_penalty=1.3, no_repeat_ngram_size=3)
    ruled = [r.response for r in one.score(model).items["mgsm_dev"]]
    assert ruled != plain  # left-padded rows, some leaving the batch early: same texts
    assert [r.response for r in four.score(model).items["mgsm_dev"]] == ruled


@pytest.mark.parametrize(
    ("setting", "value"),
    [("num_beams", 2), ("min_new_tokens", 3), ("suppress_tokens", [5]), ("stop_strings", ["x"])],
)
def test_a_generation_config_setting_not_applied_is_refused(model, tok, world, setting, value):
    setattr(model.generation_config, setting, value)
    model.config.name_or_path = "tiny-expert"
    ev = ProxyEvaluator(["mgsm_dev"], tok, include_path=str(world), gen_kwargs={"max_gen_toks": 4})  # fmt: skip
    with pytest.raises(ValueError, match=rf"task mgsm_dev on model tiny-expert: .*{setting}"):
        ev.score(model)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"num_beams": 3}, "num_beams"), ({"do_sample": True, "temperature": 0.5}, "do_sample"),
     ({"max_length": 40}, "max_length"), ({"foo": 1}, "foo")],
)  # fmt: skip
def test_a_task_setting_not_applied_is_refused_before_any_work(tok, world, kwargs, named):
    with pytest.raises(ValueError, match=rf"task mgsm_dev: .*{named}"):
        ProxyEvaluator(["mgsm_dev"], tok, include_path=str(world), gen_kwargs=kwargs)
