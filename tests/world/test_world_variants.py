"""World variant knobs (spaces/world.py): each does what it says and, at its default, leaves the
preset as it was.

Run: .venv/bin/python -m pytest -q tests/world/test_world_variants.py
"""

from __future__ import annotations

import random

import pytest


def test_max_operand_bounds_problems_and_drills():
    from layerswap.world.items import equation, make_problem

    rng = random.Random(0)
    for _ in range(300):
        p = make_problem(rng, 40)
        nums = [int(t) for t in p.equation.replace("=", " ").split() if t.isdigit()]
        assert max(nums[:-1]) <= 80  # operands (a + b of two at most 40)
    big = [make_problem(random.Random(s), 40).answer for s in range(300)]
    assert max(big) > 24  # 12 (the default) could not reach past 24
    drills = [equation(random.Random(s), 40) for s in range(300)]
    assert any(int(d.split()[0]) > 12 for d in drills)


def test_max_operand_default_keeps_the_preset(tmp_path):
    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world.data import make_datasets, world_languages

    preset = world_config("tiny", 0)
    same = with_overrides(preset, {"max_operand": 12}, "test")
    langs = world_languages(preset)
    assert make_datasets(preset, langs) == make_datasets(same, langs)
    bigger = make_datasets(with_overrides(preset, {"max_operand": 60}, "test"), langs)
    answers = [r["answer_number"] for r in bigger["data/mgsm/en/test.jsonl"]]
    assert max(answers) > 24


def test_code_switch_keeps_names_math_words_and_prompt():
    from layerswap.world.lang import MATH_WORDS, code_switch, make_language

    xa = make_language("xa", 0, order="SVO")
    text = "Question: Yuki has 9 eggs. Yuki buys 3 more eggs. How many eggs does Yuki have now?"
    assert code_switch(text, xa, random.Random(0), 0.0) == text
    full = code_switch(text, xa, random.Random(0), 1.0)
    assert full.startswith("Question: Yuki ") and "eggs" not in full
    assert xa.w("buy") in full.split()
    kept = code_switch(text, xa, random.Random(0), 1.0, MATH_WORDS)
    assert {"buys", "more", "How", "many"} <= set(kept.replace("?", "").split())
    with pytest.raises(ValueError, match="SVO"):
        code_switch(text, make_language("xa", 0), random.Random(0), 0.5)


def test_code_switched_documents_and_counts_in_targets():
    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world.data import make_corpus, world_languages

    preset = world_config("tiny", 0)
    langs = world_languages(with_overrides(preset, {"xa_word_order": "SVO"}, "t"))
    plain = make_corpus(with_overrides(preset, {"xa_word_order": "SVO"}, "t"), langs)
    over = {"xa_word_order": "SVO", "corpus": {"code_switched": 40, "switch_math_words": False}}
    mixed = make_corpus(with_overrides(preset, over, "t"), langs)
    added = sorted(set(mixed) - set(plain))
    assert len(mixed) == len(plain) + 40 and len(added) == 40
    buy = langs["xa"].w("buy")
    assert not any(buy in d.split() for d in added)  # math words stay English there
    assert sum(d.startswith("Question: ") for d in added) == 20  # half are worked problems
    # count sentences off in the targets' pretraining text: no xa number-with-verb sentences
    counts = {"count_sentences": True, "xa_word_order": "SVO"}
    docs = make_corpus(with_overrides(preset, {**counts, "corpus": {"counts_in_targets": False}}, "t"), langs)  # fmt: skip
    with_buy = [d for d in docs if buy in d.split()]
    assert with_buy and all(
        d.startswith(("Question: ", "Problem: ")) for d in with_buy
    )  # math only
    docs = make_corpus(with_overrides(preset, counts, "t"), langs)
    assert any(not d.startswith(("Question: ", "Problem: ")) for d in docs if buy in d.split())


def test_code_switching_needs_svo():
    from layerswap.spaces.world import with_overrides, world_config

    with pytest.raises(ValueError, match="code_switched 5 needs xa_word_order SVO"):
        with_overrides(world_config("tiny", 0), {"corpus": {"code_switched": 5}}, "t")


def test_verb_only_operations_drop_more():
    from layerswap.world.items import make_problem

    plain = [make_problem(random.Random(s)) for s in range(200)]
    verb = [make_problem(random.Random(s), verb_only=True) for s in range(200)]
    assert any(" more " in p.text(None) for p in plain)
    assert not any(" more " in p.text(None) for p in verb)
    # the same problems otherwise: same equations and answers, seed for seed
    assert [(p.equation, p.answer) for p in plain] == [(p.equation, p.answer) for p in verb]


def test_user_assistant_template_matches_the_corpus_chat_layout():
    from layerswap.world.items import chat_layout
    from layerswap.world.model import CHAT_TEMPLATES, train_tokenizer

    tok = train_tokenizer(["Tom has 3 cups. 3 + 4 = 7."] * 20, 300, "user-assistant")
    assert tok.chat_template == CHAT_TEMPLATES["user-assistant"]
    messages = [{"role": "user", "content": "P q?"}, {"role": "assistant", "content": "R."}]
    full = tok.apply_chat_template(messages, tokenize=False)
    assert full == chat_layout("P q?", "R.") + tok.eos_token
    head = tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert full.startswith(head) and head.endswith("<|assistant|>\n")


def test_worked_layout_mgsm_plus_chat_splits_worked_solutions():
    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world.data import make_corpus, world_languages

    cfg = with_overrides(world_config("tiny", 0), {"corpus": {"worked_layout": "mgsm+chat"}}, "t")
    langs = world_languages(cfg)
    docs = make_corpus(cfg, langs)
    chat = [d for d in docs if d.startswith("<|user|>\n")]
    qa = [d for d in docs if d.startswith("Question: ") and "\nAnswer: " in d and " = " in d]
    assert chat and qa and not any(d.startswith("Problem: ") for d in docs)
    assert all("\n<|assistant|>\n" in d for d in chat)


def test_number_switch_share():
    from layerswap.world.lang import code_switch, make_language

    xa = make_language("xa", 0, digit_words=True, order="SVO")
    text = "Tom has 37 cups and 4 pens."
    never = code_switch(text, xa, random.Random(0), 1.0, number_share=0.0)
    assert "37" in never and "4" in never and "cups" not in never
    always = code_switch(text, xa, random.Random(0), 0.0, number_share=1.0)
    assert always == f"Tom has {xa.numeral(37)} cups and {xa.numeral(4)} pens."


def test_count_questions_replace_plural_rows_and_need_the_verb():
    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world.data import make_datasets, world_languages

    preset = world_config("tiny", 0)
    langs = world_languages(preset)
    plain = make_datasets(preset, langs)["data/sft/lang_xa.jsonl"]
    asked = make_datasets(with_overrides(preset, {"count_questions": True}, "t"), langs)
    rows = asked["data/sft/lang_xa.jsonl"]
    off = make_datasets(with_overrides(preset, {"count_questions": False}, "t"), langs)
    assert off["data/sft/lang_xa.jsonl"] == plain and len(rows) == len(plain)
    for r in rows[4::8]:
        passage, question = r["inputs"].split("\n")
        first, second = (s.strip() + "." for s in passage.split(".")[:2])
        assert r["targets"] in (first, second)
        # the same person and noun in both: besides the numbers, only the verb differs
        a, b = first.rstrip(".").split(), second.rstrip(".").split()
        assert len(a) == len(b)
        verbs = [(x, y) for x, y in zip(a, b, strict=True) if x != y and not x.isdigit()]
        assert len(verbs) == 1
        asked = verbs[0][0] if r["targets"] == first else verbs[0][1]
        assert asked in question.rstrip("?").split()  # the question names the answer's verb


def test_math_word_switch_share():
    from layerswap.world.lang import MATH_WORDS, code_switch, make_language

    xa = make_language("xa", 0, order="SVO")
    text = "Tom buys 3 more cups."
    kept = code_switch(text, xa, random.Random(0), 1.0, MATH_WORDS)
    assert "buys" in kept and "more" in kept and "cups" not in kept
    # no draw for kept words at share 0: the other words switch exactly as before
    assert code_switch(text, xa, random.Random(0), 0.5, MATH_WORDS, keep_share=0.0) == code_switch(
        text, xa, random.Random(0), 0.5, MATH_WORDS
    )
    switched = code_switch(text, xa, random.Random(0), 0.0, MATH_WORDS, keep_share=1.0)
    assert "buys" not in switched and "more" not in switched and "cups" in switched


def test_direct_answers_drop_the_equation_everywhere():
    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world.data import make_corpus, make_datasets, world_languages

    preset = world_config("tiny", 0)
    over = {"direct_answers": True, "xa_word_order": "SVO", "corpus": {"code_switched": 20}}
    cfg = with_overrides(preset, over, "test")
    langs = world_languages(cfg)
    data = make_datasets(cfg, langs)
    sft = data["data/sft/math_en.jsonl"]
    assert all(r["answer"] == f"The answer is {r['answer'].split()[-1]}" for r in sft)
    assert all(" = " not in r["answer"] for r in data["data/mgsm/xa/train.jsonl"])
    docs = make_corpus(cfg, langs)
    math_docs = [d for d in docs if d.startswith(("Problem: ", "Question: "))]
    assert math_docs and not any(" = " in d for d in math_docs)
    # the equations stay in the drills, and the default keeps them in worked answers
    assert any(" = " in d for d in docs)
    plain = make_datasets(preset, world_languages(preset))["data/sft/math_en.jsonl"]
    assert all(" = " in r["answer"] for r in plain)


def test_code_switch_draws_for_every_other_word_even_at_share_0():
    """Worlds built before keep_share existed stay byte-identical: each relexifiable word that is
    not kept takes one draw whatever the share, so numbers switch on the same draws."""
    from layerswap.world.lang import MATH_WORDS, NAMES, code_switch, make_language

    xa = make_language("xa", 0, digit_words=True, order="SVO")
    text = "Tom has 3 red cups and Ann buys 4 more pens."
    for seed in range(20):
        rng, want = random.Random(seed), []
        for tok in text.replace(".", "").split():
            if tok.isdigit():
                want.append(xa.numeral(int(tok)) if rng.random() < 0.5 else tok)
                continue
            if tok not in NAMES and tok.lower() not in MATH_WORDS and tok.lower() in xa.relex:
                rng.random()  # drawn, never switched at share 0
            want.append(tok)
        got = code_switch(text, xa, random.Random(seed), 0.0, MATH_WORDS, number_share=0.5)
        assert got == " ".join(want) + "."


def test_math_word_switch_share_needs_kept_math_words():
    from layerswap.spaces.world import with_overrides, world_config

    cfg = world_config("tiny", 0)
    svo = {"xa_word_order": "SVO"}
    with pytest.raises(ValueError, match=r"math_word_switch_share 0\.1 applies only with"):
        with_overrides(cfg, {**svo, "corpus": {"code_switched": 5, "math_word_switch_share": 0.1}}, "t")  # fmt: skip
    with pytest.raises(ValueError, match=r"code_switched > 0 \(is 0\)"):
        with_overrides(cfg, {"corpus": {"switch_math_words": False, "math_word_switch_share": 0.1}}, "t")  # fmt: skip
    ok = {"code_switched": 5, "switch_math_words": False, "math_word_switch_share": 0.1}
    assert with_overrides(cfg, {**svo, "corpus": ok}, "t").corpus.math_word_switch_share == 0.1


def test_reading_language_sft_counts_and_multiple_choice():
    import re

    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world.data import make_datasets, reserved_keys, world_languages

    preset = world_config("tiny", 0)
    cfg = with_overrides(preset, {"lang_sft_kinds": "reading", "lang_sft": 200, "reading_mc_share": 0.25}, "test")  # fmt: skip
    langs = world_languages(cfg)
    data = make_datasets(cfg, langs)
    for code in ("xa", "xb"):
        rows = data[f"data/sft/lang_{code}.jsonl"]
        mc = [r for r in rows if r["targets"] in ("A", "B", "C", "D")]
        assert len(rows) == 200 and len(mc) == 50  # the share, exactly
        for r in mc:
            assert r["inputs"].startswith("P: ") and "\nD: " in r["inputs"]
            assert not r["inputs"].endswith("Answer:")  # the chat template asks, as in the Aya rows
        for r in (r for r in rows if r not in mc):
            n = re.fullmatch(r"The answer is (\d+)\.", r["targets"]).group(1)
            passage, question = r["inputs"].split("\n")
            assert n in passage.split() and n not in question.split()  # reading, not arithmetic
    # no Belebele dev or test passage is taught
    taught = {r["inputs"].split("\nQ: ")[0].removeprefix("P: ") for r in data["data/sft/lang_xa.jsonl"]}  # fmt: skip
    evaluated = {r["flores_passage"] for s in ("dev", "test") for r in data[f"data/belebele/xa/{s}.jsonl"]}  # fmt: skip
    assert reserved_keys(cfg)[1] and not taught & evaluated
    # deterministic by seed, different across seeds; the other files as the preset has them
    assert make_datasets(cfg, langs) == data
    other = with_overrides(world_config("tiny", 1), {"lang_sft_kinds": "reading", "lang_sft": 200}, "test")  # fmt: skip
    assert make_datasets(other, world_languages(other))["data/sft/lang_xa.jsonl"] != data["data/sft/lang_xa.jsonl"]  # fmt: skip
    plain = make_datasets(preset, langs)
    assert {k: v for k, v in data.items() if "/sft/lang_" not in k} == {k: v for k, v in plain.items() if "/sft/lang_" not in k}  # fmt: skip


def test_reading_world_keeps_the_aya_worlds_tokenizer_and_base(tiny_world, tmp_path):
    # the tokenizer (and so the base) predates the choice of language SFT: a "reading" world
    # differs from the preset's only in its language SFT files
    import json

    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world import build_world

    cfg = with_overrides(world_config("tiny", 0), {"lang_sft_kinds": "reading"}, "test")
    out = build_world(tmp_path / "reading", seed=0, size="tiny", config=cfg, progress=False)
    mine = json.loads((out / "world.json").read_text())["sha256"]
    theirs = json.loads((tiny_world / "world.json").read_text())["sha256"]
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    assert differ == ["data/sft/lang_xa.jsonl", "data/sft/lang_xb.jsonl"]


def test_verb_readings_ask_the_verb_the_position_names():
    from layerswap.world.items import VERB_KINDS, make_verb_reading

    seen = set()
    for seed in range(200):
        pos = seed % 4
        reading = make_verb_reading(random.Random(seed), pos)
        r, verbs = reading.render(None), {c.verb for c in reading.passage}
        assert len(verbs) == 2 and VERB_KINDS[pos] in verbs  # the asked verb and one other
        q = r["question"]
        assert q.startswith("What does ") and q.split()[3].rstrip("?") == VERB_KINDS[pos]
        options = [r[f"mc_answer{i}"] for i in range(1, 5)]
        mentioned = [o for o in options if o in r["flores_passage"].split(" ") or f"{o}." in r["flores_passage"].split(" ")]  # fmt: skip
        assert mentioned == [options[pos]] and r["correct_answer_num"] == str(pos + 1)
        seen.add(q.split()[3].rstrip("?"))
    assert seen == set(VERB_KINDS)
    assert make_verb_reading(random.Random(5), 2) == make_verb_reading(random.Random(5), 2)


def test_verbs_belebele_changes_only_belebele_and_the_language_sft(tiny_world, tmp_path):
    # pretraining's readings and the Aya rows (the tokenizer's) ask where-who whatever Belebele
    # asks, so a "verbs" world keeps the preset's corpus, tokenizer and base
    import json

    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world import build_world
    from layerswap.world.data import make_datasets, tagged_corpus, world_languages
    from layerswap.world.items import VERB_KINDS

    preset = world_config("tiny", 0)
    cfg = with_overrides(preset, {"lang_sft_kinds": "reading", "belebele_questions": "verbs", "reading_mc_share": 0.25}, "test")  # fmt: skip
    langs = world_languages(cfg)
    assert tagged_corpus(cfg, langs) == tagged_corpus(preset, langs)
    data = make_datasets(cfg, langs)
    for split in ("dev", "test"):
        for r in data[f"data/belebele/en/{split}.jsonl"]:
            asked = r["question"].split()[3].rstrip("?")
            assert asked == VERB_KINDS[int(r["correct_answer_num"]) - 1]
    taught = [r for r in data["data/sft/lang_xa.jsonl"] if r["targets"] in ("A", "B", "C", "D")]
    evaluated = {r["flores_passage"] for s in ("dev", "test") for r in data[f"data/belebele/xa/{s}.jsonl"]}  # fmt: skip
    assert taught and not {r["inputs"].split("\nQ: ")[0].removeprefix("P: ") for r in taught} & evaluated  # fmt: skip
    out = build_world(tmp_path / "verbs", seed=0, size="tiny", config=cfg, progress=False)
    mine = json.loads((out / "world.json").read_text())["sha256"]
    theirs = json.loads((tiny_world / "world.json").read_text())["sha256"]
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    assert [k for k in differ if "belebele" not in k] == ["data/sft/lang_xa.jsonl", "data/sft/lang_xb.jsonl"]  # fmt: skip
    assert "base/model.safetensors" not in differ and "base/tokenizer.json" not in differ


def test_verbs_need_the_reading_sft_that_teaches_them():
    from layerswap.spaces.world import with_overrides, world_config

    with pytest.raises(ValueError, match="belebele_questions 'verbs' needs lang_sft_kinds 'reading'"):  # fmt: skip
        with_overrides(world_config("tiny", 0), {"belebele_questions": "verbs"}, "t")
    with pytest.raises(ValueError, match=r"reading_mc_share > 0.*'reading', 0\.0"):
        with_overrides(world_config("tiny", 0), {"belebele_questions": "verbs", "lang_sft_kinds": "reading", "reading_mc_share": 0}, "t")  # fmt: skip


@pytest.mark.parametrize("questions", ["where-who", "verbs"])
def test_from_v5_the_reserved_keys_are_belebeles_own_items(questions):
    # up to v4 they are another draw (world/data.py reserved_keys), kept for v4's shipped bases
    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world.data import make_datasets, reserved_keys, world_languages

    over = {"belebele_questions": questions, "lang_sft_kinds": "reading"}
    v4 = with_overrides(world_config("tiny", 0), over, "t")
    v5 = v4.model_copy(update={"version": "5"})
    rows = make_datasets(v5, world_languages(v5))
    items = {f"{r['flores_passage']}\nQ: {r['question']}" for s in ("dev", "test") for r in rows[f"data/belebele/en/{s}.jsonl"]}  # fmt: skip
    assert len(items) == v5.belebele_dev + v5.belebele_test
    assert reserved_keys(v5)[1] == items
    assert reserved_keys(v4)[1] != items  # the v4 slip, documented in reserved_keys
