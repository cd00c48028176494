"""lm-eval evaluation: world task YAMLs, `layerswap eval`, and scores checked independently.

A tiny Llama (lm_head biased toward digit tokens so it "answers" with numbers) is scored on
fixture world files; the expected predictions are computed here, with the model directly,
from the built-in templates' prompt strings - never from lm-eval's own code.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import layerswap.cli.eval as cli_eval
import layerswap.trainables.evaluate.harness as ev
from layerswap.trainables.evaluate.scoring import task_score

MGSM_STOPS = ["Question:", "</s>", "<|im_end|>"]  # mgsm_direct_en.yaml's `until`
NUMBER = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # mgsm direct_yaml's flexible-extract
MAX_GEN = 6
N_DOCS = 6
LIMIT = 4


# ---------------------------------------------------------------- fixtures


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def mgsm_prompt(question: str) -> str:
    return f"Question: {question}\nAnswer:"  # mgsm_direct_en doc_to_text for answer=None


def belebele_prompt(d: dict) -> str:
    return (
        f"P: {d['flores_passage']}\nQ: {d['question'].strip()}\nA: {d['mc_answer1']}\n"
        f"B: {d['mc_answer2']}\nC: {d['mc_answer3']}\nD: {d['mc_answer4']}\nAnswer:"
    )


def greedy(model, tok, prompt: str) -> str:
    """Greedy decoding by hand (no KV cache, no generate()), cut at the task's stop strings."""
    ids = tok.encode(prompt, add_special_tokens=False)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(MAX_GEN):
            nxt = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
            if nxt == tok.eos_token_id:
                break
            out.append(nxt)
    text = tok.decode(out, skip_special_tokens=True)
    for stop in MGSM_STOPS:
        text = text.split(stop)[0]
    return text


def extract(text: str) -> str:
    found = NUMBER.findall(text)
    if not found:
        return "[invalid]"
    return next(g for g in found[-1] if g).strip()


def same_answer(pred: str, target: str) -> bool:
    strip = str.maketrans("", "", string.punctuation)
    return pred.lower().translate(strip) == target.lower().translate(strip)


def choice_logliks(model, tok, prompt: str) -> list[float]:
    """log P(" A".." D" | prompt), summed over the choice's tokens."""
    out = []
    ctx = tok.encode(prompt, add_special_tokens=False)
    with torch.no_grad():
        for letter in "ABCD":
            whole = tok.encode(prompt + " " + letter, add_special_tokens=False)
            logp = torch.log_softmax(model(torch.tensor([whole])).logits[0].double(), -1)
            out.append(sum(float(logp[i - 1, whole[i]]) for i in range(len(ctx), len(whole))))
    return out


def digit_model(tok):
    from transformers import LlamaForCausalLM

    from layerswap.world.tiny import tiny_config

    torch.manual_seed(3)
    model = LlamaForCausalLM(
        tiny_config(2, vocab_size=len(tok), max_position_embeddings=512)
    ).eval()
    digits = [i for i in range(len(tok)) if re.fullmatch(r" ?[0-9]+", tok.decode([i]) or "")]
    with torch.no_grad():
        model.lm_head.weight[digits] *= 30.0  # digits dominate the argmax
    return model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A model folder, the same model in memory, and a world whose answers are set from the
    independent predictions so that some docs are right and some wrong."""
    from layerswap.world.tiny import tiny_tokenizer

    root = tmp_path_factory.mktemp("evaluate")
    tok = tiny_tokenizer()
    model = digit_model(tok)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    world = root / "world"
    expect: dict[str, list] = {}
    for code in ("en", "xa"):
        write_jsonl(
            world / f"data/mgsm/{code}/train.jsonl",
            [
                {
                    "question": f"Question: {i} plus 1 {code}?",
                    "answer": f"Step-by-Step Answer: {i} plus 1 equals {i + 1}.",
                    "answer_number": i + 1,
                    "equation_solution": None,
                }
                for i in range(8)
            ],
        )
        for split in ("dev", "test"):
            mgsm, bele = [], []
            for i in range(N_DOCS):
                # Only the docs the tests score need the model's answers; the rest are filler.
                scored = code == "xa" and i < LIMIT
                q = f"the math expert {split} {i} plus {i * 3} {code}"
                pred = extract(greedy(model, tok, mgsm_prompt(q))) if scored else ""
                digits = re.sub(r"\D", "", pred)
                # even docs: the model's own answer (right); odd docs: a wrong one
                answer = int(digits) if digits and i % 2 == 0 else -1000 - i
                mgsm.append(
                    {
                        "question": q,
                        "answer": None,
                        "answer_number": answer,
                        "equation_solution": None,
                    }
                )
                d = {
                    "flores_passage": f"the language expert {split} {i} {code}",
                    "question": f" who speaks {i}? ",
                    "mc_answer1": "math",
                    "mc_answer2": "language",
                    "mc_answer3": f"layer {i}",
                    "mc_answer4": "top",
                }
                lls = choice_logliks(model, tok, belebele_prompt(d)) if scored else [0.0] * 4
                best = max(range(4), key=lambda k: (lls[k], -k))
                gold = best if i % 2 == 0 else (best + 1) % 4
                d["correct_answer_num"] = str(gold + 1)
                bele.append(d)
                expect.setdefault(f"mgsm/{code}/{split}", []).append((pred, str(answer)))
                expect.setdefault(f"belebele/{code}/{split}", []).append((best, gold, lls))
            write_jsonl(world / f"data/mgsm/{code}/{split}.jsonl", mgsm)
            write_jsonl(world / f"data/belebele/{code}/{split}.jsonl", bele)
    return {"root": root, "model": model, "tok": tok, "world": world, "expect": expect}


def run_cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="layerswap")
    cli_eval.add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["eval", *argv])
    return args.func(args)


def check_against_expectations(raw: dict, expect: dict) -> None:
    mg = expect["mgsm/xa/test"][:LIMIT]
    rows = ev.predictions(raw, "world_mgsm_direct_xa")
    assert [r["doc_id"] for r in rows] == list(range(LIMIT))
    assert [r["prediction"] for r in rows] == [p for p, _ in mg]
    assert [r["target"] for r in rows] == [t for _, t in mg]
    correct = [same_answer(p, t) for p, t in mg]
    assert any(correct) and not all(correct), "fixture should have right and wrong docs"
    assert [r["correct"] for r in rows] == correct
    assert task_score(raw, "world_mgsm_direct_xa") == pytest.approx(sum(correct) / LIMIT)
    assert raw["results"]["world_mgsm_direct_xa"]["exact_match,flexible-extract"] == (
        pytest.approx(sum(correct) / LIMIT)
    )

    bb = expect["belebele/xa/dev"][:LIMIT]
    rows = ev.predictions(raw, "world_belebele_xa_dev")
    assert [r["prediction"] for r in rows] == [b for b, _, _ in bb]
    assert [r["target"] for r in rows] == [g for _, g, _ in bb]
    assert [r["correct"] for r in rows] == [b == g for b, g, _ in bb]
    assert task_score(raw, "world_belebele_xa_dev") == pytest.approx(
        sum(b == g for b, g, _ in bb) / LIMIT
    )
    for sample, (_, _, lls) in zip(
        sorted(raw["samples"]["world_belebele_xa_dev"], key=lambda s: s["doc_id"]), bb, strict=True
    ):
        assert [r[0] for r in sample["filtered_resps"]] == pytest.approx(lls, abs=1e-4)


# ---------------------------------------------------------------- tests


def test_world_task_yamls(setup, tmp_path):
    import yaml

    (tmp_path / "world_stale_xx.yaml").write_text("task: world_stale_xx\n")
    names = ev.write_world_tasks(setup["world"], tmp_path)
    assert names == sorted(
        f"world_{s}_{c}{v}"
        for s in ("mgsm_direct", "belebele", "belebele_brier")
        for c in ("en", "xa")
        for v in ("", "_dev")
    )
    assert sorted(p.stem for p in tmp_path.glob("*.yaml")) == names  # stale file removed
    dev = yaml.safe_load((tmp_path / "world_mgsm_direct_xa_dev.yaml").read_text())
    assert Path(dev["include"]).is_file()
    assert Path(dev["include"]).parent.parent.parent == ev.lm_eval_tasks_dir()
    assert dev["tag"] == ["world_mgsm_direct_dev"]
    files = dev["dataset_kwargs"]["data_files"]
    assert set(files) == {"train", "dev"} and dev["test_split"] == "dev"
    test = yaml.safe_load((tmp_path / "world_belebele_en.yaml").read_text())
    assert test["include"].endswith("belebele/belebele_eng_Latn.yaml")
    assert set(test["dataset_kwargs"]["data_files"]) == {"test"}
    # The Brier twin: the same items and prompt, reported by brier_score (lower is better).
    brier = yaml.safe_load((tmp_path / "world_belebele_brier_xa_dev.yaml").read_text())
    plain = yaml.safe_load((tmp_path / "world_belebele_xa_dev.yaml").read_text())
    assert (
        brier["dataset_kwargs"] == plain["dataset_kwargs"] and brier["include"] == plain["include"]
    )
    assert brier["metric_list"][0] == {
        "metric": "brier_score",
        "aggregation": "brier_score",
        "higher_is_better": False,
    }
    assert brier["tag"] == ["world_belebele_brier_dev"] and brier["test_split"] == "dev"

    # world-only indexing still resolves the built-in includes (absolute file paths)
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(tmp_path), include_defaults=False)
    assert {"world_mgsm_direct", "world_belebele_dev"} <= set(tm.all_tags)
    assert "mgsm_direct" not in tm.all_tags  # the built-in tag is not inherited
    cfg = tm.task_index["world_mgsm_direct_xa"].cfg
    assert cfg["output_type"] == "generate_until"
    assert cfg["generation_kwargs"]["until"] == MGSM_STOPS
    assert cfg["filter_list"][1]["name"] == "flexible-extract"


def test_empty_world_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no world evaluation data"):
        ev.write_world_tasks(tmp_path)


def test_cli_scores_match_independent_predictions(setup, tmp_path, capsys):
    out = tmp_path / "res" / "raw.json"
    tasks = "world_mgsm_direct_xa,world_belebele_xa_dev"
    code = run_cli(
        [str(setup["root"] / "model"), "--tasks", tasks, "--world", str(setup["world"]),
         "--limit", str(LIMIT), "--max-gen-toks", str(MAX_GEN), "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "world_mgsm_direct_xa" in printed and "flexible-extract" in printed
    assert not list(out.parent.glob(".*tmp*")), "atomic write left a temporary file"
    raw = json.loads(out.read_text())
    assert raw["n-samples"]["world_mgsm_direct_xa"]["effective"] == LIMIT
    # no request cache, ever
    assert raw["config"]["use_cache"] is None
    gen = raw["configs"]["world_mgsm_direct_xa"]["generation_kwargs"]
    assert gen["max_gen_toks"] == MAX_GEN and gen["until"] == MGSM_STOPS
    check_against_expectations(raw, setup["expect"])


def test_in_memory_model_matches_folder(setup, tmp_path):
    tasks_dir = tmp_path / "tasks"
    ev.write_world_tasks(setup["world"], tasks_dir)
    tasks = ["world_mgsm_direct_xa", "world_belebele_xa_dev"]
    kw = dict(include_path=tasks_dir, limit=LIMIT, max_gen_toks=MAX_GEN)
    mem = ev.evaluate(setup["model"], tasks, tokenizer=setup["tok"], **kw)
    check_against_expectations(mem, setup["expect"])
    disk = ev.evaluate(setup["root"] / "model", tasks, **kw)
    for t in tasks:
        assert ev.predictions(mem, t) == ev.predictions(disk, t)
        assert mem["results"][t] == disk["results"][t]


def test_model_errors(setup, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        run_cli([str(tmp_path / "nope"), "--tasks", "world_belebele_xa"])
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text("{}")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin"):
        run_cli([str(pickled), "--tasks", "world_belebele_xa"])
    with pytest.raises(ValueError, match="tokenizer"):
        ev.evaluate(setup["model"], ["world_belebele_xa"], include_path=tmp_path)
    with pytest.raises(ValueError, match="not in these results"):
        ev.predictions({"configs": {}}, "world_belebele_xa")


@pytest.mark.slow
def test_unknown_task_is_named(setup):
    # Unknown to the world index, so lm-eval's built-in index is searched too (seconds).
    with pytest.raises(ValueError, match="world_mgsm_direct_zz"):
        run_cli(
            [str(setup["root"] / "model"), "--world", str(setup["world"]),
             "--tasks", "world_mgsm_direct_xa,world_mgsm_direct_zz"]
        )  # fmt: skip


def test_offline_env_defaults():
    # Importing the module changes nothing (the CLI imports it for every command); the entry
    # points that load datasets call offline_defaults() first.
    code = (
        "import os; before = os.environ.get('HF_DATASETS_OFFLINE');"
        "import layerswap.trainables.evaluate.harness as ev; assert os.environ.get('HF_DATASETS_OFFLINE') == before;"
        "ev.offline_defaults();"
        "import datasets, huggingface_hub.constants as c;"
        "print(os.environ['HF_DATASETS_OFFLINE'], datasets.config.HF_DATASETS_OFFLINE,"
        " c.HF_HUB_OFFLINE)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_HUB_", "HF_DATASETS_"))}
    got = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert got == ["1", "True", "True"]
    # a user who has network and says so is not overridden
    env["HF_DATASETS_OFFLINE"] = "0"
    got = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert got[:2] == ["0", "False"]


def test_fewshot_examples_never_come_from_test(setup, tmp_path):
    tasks_dir = tmp_path / "tasks"
    ev.write_world_tasks(setup["world"], tasks_dir)
    tasks = ["world_mgsm_direct_xa_dev", "world_belebele_xa_dev"]
    raw = ev.evaluate(
        setup["model"], tasks, tokenizer=setup["tok"], include_path=tasks_dir, limit=2,
        num_fewshot=2, max_gen_toks=2,
    )  # fmt: skip
    assert raw["n-shot"] == {t: 2 for t in tasks}
    for sample in raw["samples"]["world_mgsm_direct_xa_dev"]:
        prompt = sample["arguments"][0][0]
        # two MGSM train items (the built-in template: question + "\nAnswer:" + number)
        assert len(re.findall(r"Question: \d plus 1 xa\?\nAnswer:\d", prompt)) == 2
        assert prompt.endswith(mgsm_prompt(sample["doc"]["question"]))
    for sample in raw["samples"]["world_belebele_xa_dev"]:
        prompt = sample["arguments"][0][0]
        assert prompt.count("P: the language expert dev") == 3 and " test " not in prompt


# ---------------------------------------------------------------- devices and batch sizes


def test_resolve_device_auto_follows_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ev.resolve_device("auto") == ev.resolve_device(None) == "cpu"
    assert ev.resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match=r"device 'cuda': torch .* sees no usable CUDA GPU"):
        ev.resolve_device("cuda")
    # a GPU is seen: auto picks it (nothing is run there)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert ev.resolve_device("auto") == "cuda"
    assert ev.resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(ValueError, match=r"device 'cuda:1': only 1 CUDA GPU"):
        ev.resolve_device("cuda:1")
    for bad in ("gpu", "CUDA", "cuda:x", ""):
        with pytest.raises(ValueError, match=f"device {bad!r}: expected auto, cpu"):
            ev.resolve_device(bad)


def test_check_batch_size():
    assert ev.check_batch_size("auto") == "auto"
    assert ev.check_batch_size(4) == ev.check_batch_size("4") == 4
    for bad in (0, -2, "0", "big", "auto:4", 1.5, True, None):
        with pytest.raises(ValueError, match=f"batch size {bad!r}: expected a positive int"):
            ev.check_batch_size(bad)


def test_cli_device_and_batch_size_arguments(monkeypatch, capsys):
    p = argparse.ArgumentParser(prog="layerswap")
    cli_eval.add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["eval", "m", "--tasks", "t"])
    assert (args.device, args.batch_size) == ("auto", 1)
    args = p.parse_args(["eval", "m", "--tasks", "t", "--batch-size", "auto"])
    assert args.batch_size == "auto"
    assert p.parse_args(["eval", "m", "--tasks", "t", "--batch-size", "8"]).batch_size == 8
    with pytest.raises(SystemExit):
        p.parse_args(["eval", "m", "--tasks", "t", "--batch-size", "many"])
    assert "invalid --batch-size 'many' (a positive int or auto)" in capsys.readouterr().err


def test_in_memory_model_is_moved_and_device_recorded(setup, tmp_path, monkeypatch):
    """An object on another device is moved to the resolved one; "auto" batch sizes run
    (lm-eval's search), and the result's config names the device used."""
    tasks_dir = tmp_path / "tasks"
    ev.write_world_tasks(setup["world"], tasks_dir)
    tasks = ["world_mgsm_direct_xa", "world_belebele_xa_dev"]
    moved: list[str] = []
    model = setup["model"]
    real_to = model.to

    def to(*a, **k):
        moved.append(str(a[0]) if a else str(k))
        return real_to(*a, **k)

    monkeypatch.setattr(model, "to", to)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    raw = ev.evaluate(
        model, tasks, tokenizer=setup["tok"], include_path=tasks_dir, limit=LIMIT,
        max_gen_toks=MAX_GEN, batch_size="auto", device="auto",
    )  # fmt: skip
    assert moved == ["cpu"]
    assert raw["config"]["device"] == "cpu" and raw["config"]["batch_size"] == "auto"
    check_against_expectations(raw, setup["expect"])


def test_an_evaluation_outside_git_prints_no_git_error(setup, tmp_path, monkeypatch, capfd):
    """lm-eval records the working directory's git commit; outside a checkout its probe printed
    "fatal: not a git repository" for every evaluated model (seen in every demo run elsewhere)."""
    tasks_dir = tmp_path / "tasks"
    ev.write_world_tasks(setup["world"], tasks_dir)
    here = tmp_path / "not_a_repo"
    here.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repository above it
    monkeypatch.chdir(here)
    capfd.readouterr()
    raw = ev.evaluate(setup["root"] / "model", ["world_mgsm_direct_xa"], include_path=tasks_dir, limit=LIMIT, max_gen_toks=MAX_GEN)  # fmt: skip
    err = capfd.readouterr().err
    assert "not a git repository" not in err, err[-2000:]
    assert raw["git_hash"] is None  # recorded as lm-eval records it outside git
