"""The cached proxy evaluator agrees with lm-eval's own HFLM run, item by item.

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_proxy.py
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from proxy_fixtures import lm_eval_samples, tiny_models, write_world

from layerswap.trainables.evaluate.proxy import ProxyEvaluator

GEN = {"max_gen_toks": 16}
TASKS = ["mgsm_dev", "bele_dev"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return write_world(tmp_path_factory.mktemp("proxy_world"))


@pytest.fixture(scope="module")
def models(tok):
    return tiny_models(tok, n=3)


@pytest.fixture(scope="module")
def evaluator(world, tok):
    return ProxyEvaluator(TASKS, tok, include_path=str(world), gen_kwargs=GEN)


def assert_same_as_lm_eval(result, samples) -> int:
    """Every scored item equals lm-eval's; returns how many generations held a number."""
    with_numbers = 0
    for r in result.items["bele_dev"]:
        s = samples["bele_dev"][(r.doc_id, "none")]
        ref = [resp[0] for resp in s["resps"]]  # [(ll, is_greedy)] per choice
        assert r.prediction == int(np.argmax([ll for ll, _ in ref])), r.doc_id
        np.testing.assert_allclose([ll for ll, _ in r.response], [ll for ll, _ in ref], atol=1e-4)
        assert [g for _, g in r.response] == [g for _, g in ref]
        assert r.metrics["acc,none"] == s["acc"] and r.metrics["acc_norm,none"] == s["acc_norm"]
    for r in result.items["mgsm_dev"]:
        for fname, filtered in r.prediction.items():
            s = samples["mgsm_dev"][(r.doc_id, fname)]
            assert r.response == s["resps"][0][0], r.doc_id
            assert filtered == s["filtered_resps"][0], (r.doc_id, fname)
            assert r.metrics[f"exact_match,{fname}"] == s["exact_match"]
        with_numbers += r.prediction["flexible-extract"] != "[invalid]"
    return with_numbers


def test_matches_lm_eval_on_several_models(evaluator, models, tok, world):
    # Batched (left-padded) rows too: no float near-tie moves on these models.
    batched = ProxyEvaluator(TASKS, tok, include_path=str(world), gen_kwargs=GEN, batch_size=4)
    numbers, responses = 0, set()
    for model in models:
        result = evaluator.score(model)
        samples = lm_eval_samples(model, tok, world, TASKS, GEN)
        numbers += assert_same_as_lm_eval(result, samples)
        assert_same_as_lm_eval(batched.score(model), samples)
        responses |= {r.response for r in result.items["mgsm_dev"]}
        assert {len(v) for v in result.items.values()} == {10}
    # The comparison means something: models differ, and extraction finds numbers.
    assert numbers >= 5 and len(responses) >= 20


@pytest.mark.slow
def test_stop_strings_and_truncation_match_lm_eval(world, tok):
    """A stop string that fires mid-generation, and a window short enough to left-truncate."""
    from transformers import LlamaForCausalLM

    gen = {"max_gen_toks": 12, "until": ["2", "Question:"]}
    model = tiny_models(tok, n=1, seed=3)[0]
    short = LlamaForCausalLM(
        model.config.__class__(**{**model.config.to_dict(), "max_position_embeddings": 48})
    )
    short.load_state_dict(model.state_dict())
    short.eval()
    ev = ProxyEvaluator(TASKS, tok, include_path=str(world), gen_kwargs=gen)
    assert max(len(it.ctx_ids) for it in ev.tasks["bele_dev"].items) > 48
    for m in (model, short):
        result = ev.score(m)
        assert_same_as_lm_eval(result, lm_eval_samples(m, tok, world, TASKS, gen))
    # The "2" stop fired: each response is the unstopped generation cut before its first "2".
    plain = ProxyEvaluator(
        ["mgsm_dev"], tok, include_path=str(world), gen_kwargs={"max_gen_toks": 12}
    )
    stopped = {r.doc_id: r.response for r in ev.score(model).items["mgsm_dev"]}
    raw = {r.doc_id: r.response for r in plain.score(model).items["mgsm_dev"]}
    cut = [i for i in raw if "2" in raw[i]]
    assert cut and all(stopped[i] == raw[i].split("2")[0] for i in cut)


def test_fidelity_is_a_prefix_with_equal_item_results(evaluator, models):
    model = models[1]
    full = evaluator.score(model, fidelity=1.0)
    for task in TASKS:
        ids = {f: evaluator.subset(task, f) for f in (0.1, 0.3, 0.5, 1.0)}
        assert len(ids[0.3]) == math.ceil(0.3 * 10) and len(ids[1.0]) == 10
        assert ids[0.1] == ids[0.3][:1] and ids[0.3] == ids[0.5][:3] and ids[0.5] == ids[1.0][:5]
        assert sorted(ids[1.0]) == list(range(10)) and ids[1.0] != sorted(ids[1.0])
    part = evaluator.score(model, fidelity=0.3)
    for task in TASKS:
        by_id = {r.doc_id: r for r in full.items[task]}
        assert [r.doc_id for r in part.items[task]] == evaluator.subset(task, 0.3)
        for r in part.items[task]:
            assert r.prediction == by_id[r.doc_id].prediction
            assert r.metrics == by_id[r.doc_id].metrics
        key = "acc,none" if task == "bele_dev" else "exact_match,flexible-extract"
        assert part.aggregate[task][key] == pytest.approx(
            np.mean([r.metrics[key] for r in part.items[task]])
        )
    with pytest.raises(ValueError, match="fidelity"):
        evaluator.score(model, fidelity=0.0)


def test_access_log_names_splits_and_doc_ids(world, tok, models):
    ev = ProxyEvaluator(TASKS, tok, include_path=str(world), gen_kwargs=GEN, limit=6)
    assert [it.doc_id for it in ev.tasks["mgsm_dev"].items] == list(range(6))
    before = len(ev.access_log)
    ev.score(models[0], fidelity=0.5)
    log = ev.access_log
    assert {(a.task, a.split, a.purpose, a.doc_ids) for a in log[:before]} == {
        ("mgsm_dev", "dev", "prompt", tuple(range(6))),
        ("bele_dev", "dev", "prompt", tuple(range(6))),
    }
    scored = {a.task: a.doc_ids for a in log[before:]}
    assert all(a.purpose == "score" for a in log[before:])
    assert scored == {t: tuple(ev.subset(t, 0.5)) for t in TASKS}
    # The proxy stage never reads a test split (zero-shot: no fewshot reads either).
    assert all(a.split == "dev" for a in log)
    assert ev.splits_read() == {("mgsm_dev", "dev"), ("bele_dev", "dev")}
    # A subset logs only what it scores: its prompts were read (and logged) by `ev`.
    part = ev.restricted({"bele_dev": [5, 2]})
    assert [it.doc_id for it in part.tasks["bele_dev"].items] == [2, 5] and list(part.tasks) == ["bele_dev"]  # fmt: skip
    part.score(models[0])
    assert [(a.task, a.purpose, sorted(a.doc_ids)) for a in part.access_log] == [("bele_dev", "score", [2, 5])]  # fmt: skip
    with pytest.raises(ValueError, match=r"bele_dev: doc ids \[7\] are not among"):
        ev.restricted({"bele_dev": [7]})


def test_a_subset_keeps_the_few_shot_prompts_lm_eval_gives_its_docs(world, tok, models):
    """A search rung scores a subset (search/trial.py). lm-eval's few-shot sampler draws each
    doc's examples from one generator, doc after doc: rebuilt over the subset, 7 of 13 of a
    red-team's rung prompts differed from lm-eval's. The subset keeps the whole split's."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    full = ProxyEvaluator(["mgsm_dev"], tok, include_path=str(world), gen_kwargs=GEN, num_fewshot=3)  # fmt: skip
    ids = full.subset("mgsm_dev", 1.0)[3:8]  # a later rung's docs: not a prefix of the split
    part = full.restricted({"mgsm_dev": ids})
    result = part.score(models[0]).items["mgsm_dev"]
    out = lm_eval.simple_evaluate(
        model=HFLM(pretrained=models[0], tokenizer=tok),
        tasks=["mgsm_dev"],
        task_manager=TaskManager(include_path=str(world), include_defaults=False),
        num_fewshot=3, log_samples=True, gen_kwargs=dict(GEN), bootstrap_iters=0,
        cache_requests=False,
    )  # fmt: skip
    samples = {(s["doc_id"], s["filter"]): s for s in out["samples"]["mgsm_dev"]}
    assert sorted(r.doc_id for r in result) == sorted(ids)
    for it in part.tasks["mgsm_dev"].items:
        (ctx, _), *_ = samples[(it.doc_id, "flexible-extract")]["arguments"]
        assert tok.decode(it.ctx_ids, skip_special_tokens=True) == ctx, it.doc_id
        assert ctx.count("Answer:") == 4  # three examples and the doc
    for r in result:
        for fname, filtered in r.prediction.items():
            s = samples[(r.doc_id, fname)]
            assert (r.response, filtered) == (s["resps"][0][0], s["filtered_resps"][0]), r.doc_id


def test_brier_scored_belebele_matches_lm_eval_and_the_option_probabilities(world, tok, models):
    """A multiple-choice task reported by brier_score: lm-eval's number, and the textbook one
    computed here from the four options' log-likelihoods."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    ev = ProxyEvaluator(["bele_brier_dev"], tok, include_path=str(world))
    model = models[1]
    result = ev.score(model)
    ours = result.aggregate["bele_brier_dev"]
    out = lm_eval.simple_evaluate(
        model=HFLM(pretrained=model, tokenizer=tok),
        tasks=["bele_brier_dev"],
        task_manager=TaskManager(include_path=str(world), include_defaults=False),
        bootstrap_iters=0,
        cache_requests=False,
    )
    ref = out["results"]["bele_brier_dev"]
    assert ours["brier_score,none"] == pytest.approx(ref["brier_score,none"], abs=1e-6)
    assert ours["acc,none"] == ref["acc,none"]
    by_hand = []
    for r in result.items["bele_brier_dev"]:
        lls = np.array([ll for ll, _ in r.response])
        p = np.exp(lls - lls.max())
        p /= p.sum()
        gold = int(
            ev.tasks["bele_brier_dev"].task.doc_to_target(
                next(it.doc for it in ev.tasks["bele_brier_dev"].items if it.doc_id == r.doc_id)
            )
        )
        by_hand.append(((p - np.eye(4)[gold]) ** 2).sum())
    assert ours["brier_score,none"] == pytest.approx(float(np.mean(by_hand)), abs=1e-9)
    # Not a constant: a random model's options are not uniform (Brier of uniform is 0.75).
    assert 0 < ours["brier_score,none"] < 2 and ours["brier_score,none"] != pytest.approx(0.75)
