"""Grafted pretraining (spaces.world.GraftConfig): stage two teaches the target languages to the
outer layers only, and leaves the middle exactly as English left it.

Run: .venv/bin/python -m pytest -q tests/world/test_world_graft.py
"""

from __future__ import annotations

import pytest
import torch


def _tiny_corpus():
    from layerswap.spaces.world import world_config
    from layerswap.world.data import tagged_corpus, world_languages
    from layerswap.world.model import train_tokenizer

    cfg = world_config("tiny", 0)
    tagged = tagged_corpus(cfg, world_languages(cfg))
    tok = train_tokenizer([d for _, d in tagged], cfg.model.vocab_size)
    return cfg, tagged, tok


def test_tagged_corpus_is_make_corpus_with_tags():
    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world.data import SOURCE_TAGS, make_corpus, tagged_corpus, world_languages

    cfg = with_overrides(world_config("tiny", 0), {"xa_word_order": "SVO", "corpus": {"code_switched": 20}}, "t")  # fmt: skip
    langs = world_languages(cfg)
    tagged = tagged_corpus(cfg, langs)
    assert [d for _, d in tagged] == make_corpus(cfg, langs)
    assert {t for t, _ in tagged} == set(SOURCE_TAGS)
    xa = langs["xa"]
    # an English document never has an xa-only word; an xa passage does
    xa_words = {xa.w("buy"), xa.w("answer")} - {"buy", "answer"}
    en_docs = [d for t, d in tagged if t == "en"]
    assert not any(set(d.split()) & xa_words for d in en_docs)
    assert any(set(d.replace(".", " ").split()) & xa_words for t, d in tagged if t == "xa")


def test_graft_trains_the_outer_layers_only():
    from layerswap.spaces.world import GraftConfig
    from layerswap.world.model import ENGLISH_STAGE, pretrain

    cfg, tagged, tok = _tiny_corpus()
    mc = cfg.model.model_copy(update={"steps": 4})
    docs, tags = [d for _, d in tagged], [t for t, _ in tagged]
    english = [d for d, t in zip(docs, tags, strict=True) if t in ENGLISH_STAGE]
    one, _ = pretrain(english, tok, mc, seed=0, progress=False)
    graft = GraftConfig(steps=3, bottom=1, top=1, warmup=1)
    two, _ = pretrain(docs, tok, mc.model_copy(update={"graft": graft}), seed=0, progress=False, tags=tags)  # fmt: skip
    a, b = one.state_dict(), two.state_dict()
    n = mc.num_layers  # 4 in the tiny preset: layers 1 and 2 are the middle
    for key in a:
        middle = any(f"layers.{i}." in key for i in range(1, n - 1))
        assert torch.equal(a[key], b[key]) == middle, key
    for p in two.parameters():
        assert p.requires_grad  # the model comes back trainable, as a one-stage base does


def test_graft_bottom_only_without_replay():
    from layerswap.spaces.world import GraftConfig
    from layerswap.world.model import ENGLISH_STAGE, pretrain

    cfg, tagged, tok = _tiny_corpus()
    docs, tags = [d for _, d in tagged], [t for t, _ in tagged]
    mc = cfg.model.model_copy(update={"steps": 2})
    one, _ = pretrain([d for d, t in zip(docs, tags, strict=True) if t in ENGLISH_STAGE], tok, mc, seed=0, progress=False)  # fmt: skip
    graft = GraftConfig(steps=2, bottom=1, top=0, replay=0.0, warmup=1)
    two, _ = pretrain(docs, tok, mc.model_copy(update={"graft": graft}), seed=0, progress=False, tags=tags)  # fmt: skip
    a, b = one.state_dict(), two.state_dict()
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    assert any("layers.0." in k for k in changed) and not any(f"layers.{i}." in k for k in changed for i in (1, 2, 3))  # fmt: skip
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= changed


def test_graft_needs_tags_and_a_middle():
    from layerswap.spaces.world import GraftConfig, with_overrides, world_config
    from layerswap.world.model import pretrain

    cfg, tagged, tok = _tiny_corpus()
    mc = cfg.model.model_copy(update={"graft": GraftConfig(steps=1)})
    with pytest.raises(ValueError, match="one tag per document"):
        pretrain([d for _, d in tagged], tok, mc, seed=0, progress=False)
    with pytest.raises(ValueError, match=r"bottom 3 \+ top 2 must be between 1 and num_layers - 1 \(3\)"):  # fmt: skip
        with_overrides(world_config("tiny", 0), {"model": {"graft": {"steps": 5}}}, "v.yaml")
    with pytest.raises(ValueError, match="graft"):
        with_overrides(world_config("tiny", 0), {"model": {"graft": {"steps": 5, "depth": 2}}}, "v.yaml")  # fmt: skip
    with pytest.raises(ValueError, match=r"bottom 0 \+ top 0 must be between 1"):
        with_overrides(world_config("tiny", 0), {"model": {"graft": {"steps": 5, "bottom": 0, "top": 0}}}, "v.yaml")  # fmt: skip
    docs, tags = [d for _, d in tagged], [t for t, _ in tagged]
    with pytest.raises(ValueError, match=r"unknown corpus tags \['EN'\]"):
        pretrain(docs, tok, mc, seed=0, progress=False, tags=["EN" if t == "en" else t for t in tags])  # fmt: skip
    english = [(d, t) for d, t in zip(docs, tags, strict=True) if t in ("en", "drill")]
    with pytest.raises(ValueError, match=r"no documents for the graft stage \(xa, xb, code-switched\)"):  # fmt: skip
        pretrain([d for d, _ in english], tok, mc, seed=0, progress=False, tags=[t for _, t in english])  # fmt: skip


def test_xa_instructions_join_the_corpus_in_the_qa_layout():
    from collections import Counter

    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world.data import make_datasets, tagged_corpus, world_languages

    preset = world_config("tiny", 0)
    langs = world_languages(preset)
    plain = Counter(tagged_corpus(preset, langs))
    more = Counter(tagged_corpus(with_overrides(preset, {"corpus": {"xa_instructions": 16}}, "t"), langs))  # fmt: skip
    added = more - plain
    assert plain - more == Counter()  # every other document is still there
    assert added.total() == 16 and {t for t, _ in added} == {"xa"}
    assert all(d.startswith("Question: ") and "\nAnswer: " in d for _, d in added)
    # a random stream of their own: mostly other rows than the language SFT data's (short kinds
    # such as plurals may repeat some)
    sft = make_datasets(preset, langs)["data/sft/lang_xa.jsonl"]
    as_docs = {("xa", f"Question: {r['inputs']}\nAnswer: {r['targets']}") for r in sft}
    assert len(set(added) - as_docs) >= 10
    assert not any(d.split("\nAnswer: ")[1] in ("A", "B", "C", "D") for _, d in added)  # no MC


def test_graft_stage_learns_from_the_target_documents():
    from layerswap.spaces.world import GraftConfig
    from layerswap.world.model import ENGLISH_STAGE, pretrain

    cfg, tagged, tok = _tiny_corpus()
    docs, tags = [d for _, d in tagged], [t for t, _ in tagged]
    other = [d if t in ENGLISH_STAGE else d.upper() for d, t in zip(docs, tags, strict=True)]
    mc = cfg.model.model_copy(update={"steps": 2, "graft": GraftConfig(steps=2, bottom=1, top=1, replay=0.0, warmup=1)})  # fmt: skip
    a = pretrain(docs, tok, mc, seed=0, progress=False, tags=tags)[0].state_dict()
    b = pretrain(other, tok, mc, seed=0, progress=False, tags=tags)[0].state_dict()
    assert torch.equal(a["model.layers.1.mlp.up_proj.weight"], b["model.layers.1.mlp.up_proj.weight"])  # fmt: skip
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], b["model.layers.0.mlp.up_proj.weight"])  # fmt: skip
