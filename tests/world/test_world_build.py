"""Building the embedded world: reproducible by seed, idempotent, verified by sha256, modes that
follow the umask, loadable with transformers, CLI.

Run `.venv/bin/python -m pytest -q tests/world/test_world_build.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from layerswap.cli.world import add_parser as add_world_parser
from layerswap.trainables.outputs import OutputError
from layerswap.world import build_world
from layerswap.world.build import verify_world

LAYERSWAP = Path(sys.executable).parent / "layerswap"


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_same_seed_same_bytes(tiny_world, tmp_path):
    again = build_world(tmp_path / "again", seed=0, size="tiny", progress=False)
    a, b = _files(tiny_world), _files(again)
    assert set(a) == set(b)
    # the output marker records when and by which command: not world content
    differ = [name for name in a if a[name] != b[name] and name != ".layerswap.json"]
    assert not differ, f"files differ between two builds with seed 0: {differ}"


def test_other_seed_other_world(tiny_world, tmp_path):
    other = build_world(tmp_path / "other", seed=1, size="tiny", progress=False)
    a, b = _files(tiny_world), _files(other)
    for name in ("data/mgsm/xa/test.jsonl", "data/sft/lang_xb.jsonl", "base/model.safetensors"):
        assert a[name] != b[name], name
    # a different world at the same path is not silently replaced...
    with pytest.raises(OutputError, match=r"holds another world \(seed 1, not 2\)"):
        build_world(other, seed=2, size="tiny", progress=False)
    # ...unless asked to
    build_world(other, seed=2, size="tiny", overwrite=True, progress=False)
    assert json.loads((other / "world.json").read_text())["seed"] == 2


def test_second_call_is_a_fast_no_op(tiny_world):
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tiny_world.rglob("*") if p.is_file()}  # fmt: skip
    t0 = time.perf_counter()
    assert build_world(tiny_world, seed=0, size="tiny", progress=False) == tiny_world
    assert time.perf_counter() - t0 < 1.0
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tiny_world.rglob("*") if p.is_file()}  # fmt: skip
    assert before == after


def test_manifest_hashes_match(tiny_world):
    import hashlib

    m = json.loads((tiny_world / "world.json").read_text())
    for rel, digest in m["sha256"].items():
        assert hashlib.sha256((tiny_world / rel).read_bytes()).hexdigest() == digest, rel


def test_base_loads_with_auto_classes(tiny_world):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_world / "base")
    model = AutoModelForCausalLM.from_pretrained(tiny_world / "base")
    assert model.config.model_type == "llama"
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>" and tok.pad_token == "<pad>"
    assert len(tok) == model.config.vocab_size
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
        tokenize=False,
    )
    assert text == "Question: Hi\nAnswer: Yo</s>"  # lm-eval's QA layout
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "Question: Hi\nAnswer:"
    # digits are single tokens and text round-trips
    q = "Question: Tom has 12 apples.\nAnswer: 12"
    assert tok.decode(tok(q)["input_ids"]) == q
    assert "12" not in tok.convert_ids_to_tokens(tok("12")["input_ids"])
    with torch.no_grad():
        out = model.generate(**tok(q, return_tensors="pt"), max_new_tokens=3, do_sample=False)
    assert out.shape[1] >= len(tok(q)["input_ids"]) + 1


def test_cli_parser(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="layerswap")
    add_world_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["world", "build", "--out", str(tmp_path / "w"), "--size", "tiny", "--seed", "3"])  # fmt: skip
    assert (args.out, args.size, args.seed, args.overwrite) == (tmp_path / "w", "tiny", 3, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["world", "build", "--out", "x", "--size", "huge"])
    assert args.func(args) == 0
    assert json.loads((tmp_path / "w/world.json").read_text())["seed"] == 3


def test_unknown_size_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="unknown world size"):
        build_world(tmp_path / "w", size="huge", progress=False)  # type: ignore[arg-type]


def test_damaged_world_is_named_not_complete(tiny_world, tmp_path):
    w = tmp_path / "w"
    shutil.copytree(tiny_world, w)
    assert verify_world(w) == []
    with open(w / "data/mgsm/xa/test.jsonl", "ab") as f:
        f.write(b"\n")
    (w / "corpus/pretrain.txt").unlink()
    assert verify_world(w) == [
        "corpus/pretrain.txt: missing",
        "data/mgsm/xa/test.jsonl: sha256 differs from world.json",
    ]
    with pytest.raises(ValueError, match=r"damaged: corpus/pretrain\.txt: missing; data/mgsm/xa/test\.jsonl: sha256 differs.*pass --overwrite to rebuild it"):  # fmt: skip
        build_world(w, seed=0, size="tiny", progress=False)
    run = subprocess.run(
        [str(LAYERSWAP), "world", "build", "--out", str(w), "--size", "tiny"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "data/mgsm/xa/test.jsonl: sha256 differs" in run.stderr
    build_world(w, seed=0, size="tiny", overwrite=True, progress=False)
    assert verify_world(w) == []
    # the same bytes as an undamaged build: world.json lists every file's sha256
    assert (w / "world.json").read_bytes() == (tiny_world / "world.json").read_bytes()


def test_verify_world_names_a_bad_manifest(tmp_path):
    assert verify_world(tmp_path) == ["world.json: missing"]
    (tmp_path / "world.json").write_text('{"sha256": {"../outside": "00"}}')
    assert verify_world(tmp_path) == ["../outside: not a path inside the world"]
    (tmp_path / "world.json").write_text("{")
    assert verify_world(tmp_path)[0].startswith("world.json: not valid JSON")


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775)], ids=["022", "002"])  # fmt: skip
def test_modes_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    before = os.umask(umask)
    try:
        w = build_world(tmp_path / "w", seed=0, size="tiny", progress=False)
    finally:
        os.umask(before)
    modes = {p.relative_to(w).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in w.rglob("*")}
    # safetensors writes 0o600 on its own (safetensors#782); it must follow the umask too
    assert modes["base/model.safetensors"] == file_mode
    assert modes["base"] == dir_mode and stat.S_IMODE(w.stat().st_mode) == dir_mode
    odd = {rel: oct(m) for rel, m in modes.items() if m != (dir_mode if (w / rel).is_dir() else file_mode)}  # fmt: skip
    assert not odd, odd


VARIANT = {"digit_words": True, "count_sentences": True, "xa_word_order": "SVO"}


def test_variant_is_built_recorded_and_told_apart(tiny_world, tmp_path, jsonl):
    from layerswap.spaces.world import with_overrides, world_config

    config = with_overrides(world_config("tiny", 0), VARIANT, "test")
    out = build_world(tmp_path / "v", seed=0, size="tiny", config=config, progress=False)
    m = json.loads((out / "world.json").read_text())
    assert {k: m["config"][k] for k in VARIANT} == VARIANT
    assert verify_world(out) == []
    # xa writes numbers with digit words of its own: no 0-9 in its problems, English has them
    xa = jsonl(out / "data/mgsm/xa/test.jsonl")
    en = jsonl(out / "data/mgsm/en/test.jsonl")
    assert not any(c.isdigit() for r in xa for c in r["question"])
    assert all(any(c.isdigit() for c in r["question"]) for r in en)
    # SVO xa is English word for word: as many words as the English question (names kept)
    for a, b in zip(xa, en, strict=True):
        assert len(a["question"].split()) >= len(b["question"].split())
        names = [w for w in b["question"].split() if w[0].isupper() and w.isalpha()]
        assert all(n in a["question"] for n in names if n not in ("How", "Each"))
    # the same variant again is a no-op; the preset at that path is another world
    before = _files(out)
    assert build_world(out, seed=0, size="tiny", config=config, progress=False) == out
    assert _files(out) == before
    with pytest.raises(OutputError, match=r"holds another world \(another variant of this seed and size: \w[^;]*, not .*\); pass --overwrite"):  # fmt: skip
        build_world(out, seed=0, size="tiny", progress=False)
    # and the variant's other datasets differ from the preset's
    assert _files(out)["data/sft/lang_xa.jsonl"] != _files(tiny_world)["data/sft/lang_xa.jsonl"]


def test_digit_words_leave_every_other_word_alone():
    from layerswap.world.lang import NUMERALS, make_language

    plain, digits = make_language("xa", 0), make_language("xa", 0, digit_words=True)
    assert {k: v for k, v in digits.words.items() if k not in NUMERALS} == plain.words
    assert digits.plural_affix == plain.plural_affix
    assert len({digits.w(n) for n in NUMERALS} | set(plain.words.values())) == len(digits.words)
    assert (plain.numeral(307), digits.numeral(307)) == ("307", " ".join(digits.w(f"n{d}") for d in "307"))  # fmt: skip


def test_cli_config_flag(tmp_path):
    cfg = tmp_path / "variant.yaml"
    cfg.write_text("digit_words: true\nmodel:\n  steps: 3\n")
    out = tmp_path / "w"
    r = subprocess.run([str(LAYERSWAP), "world", "build", "--out", str(out), "--size", "tiny", "--config", str(cfg)], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "world.json").read_text())
    assert m["config"]["digit_words"] is True and m["config"]["model"]["steps"] == 3


def test_worked_layout_moves_worked_solutions_under_the_mgsm_prompt():
    from layerswap.spaces.world import with_overrides, world_config
    from layerswap.world.data import make_corpus, world_languages

    preset = world_config("tiny", 0)
    mgsm = with_overrides(preset, {"corpus": {"worked_layout": "mgsm"}}, "test")
    langs = world_languages(preset)
    textbook, moved = make_corpus(preset, langs), make_corpus(mgsm, langs)
    assert any(d.startswith("Problem: ") for d in textbook)
    assert not any(d.startswith("Problem: ") for d in moved)
    # the same documents in the same order, only the worked ones re-laid as Question/Answer
    relaid = [
        d.replace("Problem: ", "Question: ", 1).replace("\nSolution: ", "\nAnswer: ", 1)
        if d.startswith("Problem: ")
        else d
        for d in textbook
    ]
    assert relaid == moved


def test_mgsm_problems_are_the_worlds_mgsm_rows(tiny_world, jsonl):
    """The true equations a diagnosis takes from `mgsm_problems` are those of the rows the world
    wrote (dev and test rows carry none), item by item and in every language."""
    from layerswap.world.build import world_config_of
    from layerswap.world.data import mgsm_problems, world_languages

    cfg = world_config_of(tiny_world)
    problems = mgsm_problems(cfg)
    assert [len(problems[s]) for s in ("train", "dev", "test")] == [8, cfg.mgsm_dev, cfg.mgsm_test]
    for code, lang in world_languages(cfg).items():
        for split, probs in problems.items():
            rows = jsonl(tiny_world / f"data/mgsm/{code}/{split}.jsonl")
            assert [r["question"] for r in rows] == [p.text(lang) for p in probs]
            assert [r["answer_number"] for r in rows] == [p.answer for p in probs]
    train = jsonl(tiny_world / "data/mgsm/en/train.jsonl")
    assert [r["equation_solution"] for r in train] == [p.equation for p in problems["train"]]


def test_nothing_to_do_clears_a_killed_writers_leftovers(tiny_world, tmp_path, capsys):
    """A `world build --overwrite` killed while building left its temporary folder and its
    lock beside a complete world; the same-config re-run said "nothing to do" and left both
    (guarantees.md: temporaries live until the next writer of that output takes over)."""
    import socket

    from layerswap.trainables.lock_files import lock_path

    out = tmp_path / "wb"
    shutil.copytree(tiny_world, out)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)  # fmt: skip
    pid = int(dead.stdout)
    owner = {"pid": pid, "host": socket.gethostname(), "command": "world build", "since": "s"}
    lock_path(out).write_text(json.dumps(owner))
    temp = tmp_path / f".wb.tmp-{pid}-0123abcd"
    temp.mkdir()
    (temp / "half.jsonl").write_text("{")
    build_world(out, seed=0, size="tiny", progress=True)
    said = capsys.readouterr()
    assert "nothing to do" in said.out
    assert f"removed {temp.name}" in said.err, said.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wb"]
