"""`layerswap eval ADAPTER_DIR`: a LoRA adapter folder is evaluated on its base, as lm-eval's
`peft=` does, and scores as the base with the adapter merged in; broken adapters are refused.

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_eval_adapter.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from layerswap.cli import main
from tests.trainables.evaluate.test_harness import LIMIT, MAX_GEN, digit_model, run_cli, write_jsonl

TASKS = ["world_mgsm_direct_xa", "world_belebele_xa_dev"]


def _world(root: Path) -> Path:
    """A hand-made world with the two tasks' xa files (answers arbitrary: only the adapter's
    and the merged model's scores are compared, with each other)."""
    for split in ("train", "dev", "test"):
        mgsm = [{"question": f"{split} {i} plus {i * 3} xa", "answer": None, "answer_number": i, "equation_solution": None} for i in range(LIMIT)]  # fmt: skip
        write_jsonl(root / f"data/mgsm/xa/{split}.jsonl", mgsm)
    bele = [
        {"flores_passage": f"passage {i} xa", "question": f"who speaks {i}?", "mc_answer1": "math",
         "mc_answer2": "language", "mc_answer3": f"layer {i}", "mc_answer4": "top",
         "correct_answer_num": str(i % 4 + 1)}
        for i in range(LIMIT)
    ]  # fmt: skip
    write_jsonl(root / "data/belebele/xa/dev.jsonl", bele)
    return root


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, tok):
    """A tiny base folder; a seeded LoRA on it (non-zero B, so it changes the scores); the same
    model with the adapter merged in, saved as a full checkpoint; and a world to score them on."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("adapter")
    base = root / "base"
    digit_model(tok).save_pretrained(base)
    tok.save_pretrained(base)
    torch.manual_seed(11)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"], init_lora_weights=False)  # fmt: skip
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora)
    peft_model.save_pretrained(root / "adapter")  # adapter_config.json names `base`, its source
    peft_model.merge_and_unload().save_pretrained(root / "merged")
    tok.save_pretrained(root / "merged")
    return {
        "base": base,
        "adapter": root / "adapter",
        "merged": root / "merged",
        "world": _world(root / "world"),
    }


def _eval(model: Path, out: Path, *extra: str) -> dict:
    argv = [str(model), "--tasks", ",".join(TASKS), "--limit", str(LIMIT), "--max-gen-toks", str(MAX_GEN)]  # fmt: skip
    assert run_cli([*argv, "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def _logliks(raw: dict) -> list[float]:
    """Every option's log-likelihood of every Belebele doc, in doc order."""
    rows = sorted(raw["samples"]["world_belebele_xa_dev"], key=lambda s: s["doc_id"])
    return [float(r[0]) for s in rows for r in s["filtered_resps"]]


def test_adapter_scores_as_the_merged_model(adapter, tmp_path, capsys):
    import layerswap.trainables.evaluate.harness as ev

    world = ["--world", str(adapter["world"])]
    lora = _eval(adapter["adapter"], tmp_path / "lora.json", *world)
    printed = capsys.readouterr().out
    assert f"evaluated the adapter {adapter['adapter'].resolve()} on its base" in printed
    merged = _eval(adapter["merged"], tmp_path / "merged.json", *world)
    for task in TASKS:
        rows, want = ev.predictions(lora, task), ev.predictions(merged, task)
        assert [r.pop("score") for r in rows] == pytest.approx([r.pop("score") for r in want])
        assert rows == want
        assert lora["results"][task] == pytest.approx(merged["results"][task], abs=1e-4)
    assert _logliks(lora) == pytest.approx(_logliks(merged), abs=1e-4)
    # The adapter was applied: the base's own log-likelihoods differ.
    base_lls = _logliks(_eval(adapter["base"], tmp_path / "base.json", *world))
    gap = max(abs(a - b) for a, b in zip(_logliks(lora), base_lls, strict=True))
    assert gap > 0.05, f"the adapter changed no score (largest difference {gap})"
    # Which base and adapter were evaluated, as lm-eval's own CLI records --model_args.
    base, peft = str(adapter["base"].resolve()), str(adapter["adapter"].resolve())
    assert lora["config"]["model"] == base and lora["config"]["peft"] == peft
    assert lora["config"]["model_args"] == f"pretrained={base},peft={peft}"
    assert "peft" not in merged["config"]


def _broken(adapter: dict, tmp: Path, how: str) -> tuple[Path, list[str], str]:
    """A copy of the adapter spoiled as `how` says: (folder, extra argv, expected message)."""
    bad = tmp / "bad_adapter"
    shutil.copytree(adapter["adapter"], bad)
    cfg_file = bad / "adapter_config.json"
    cfg = json.loads(cfg_file.read_text())
    extra: list[str] = []
    if how == "no_base_field":
        del cfg["base_model_name_or_path"]
        expect = f"{cfg_file}: field base_model_name_or_path is None"
    elif how == "base_folder_missing":
        cfg["base_model_name_or_path"] = str(tmp / "gone")
        expect = f"{cfg_file}: field base_model_name_or_path {str(tmp / 'gone')!r}: no such folder"
    elif how == "base_not_a_checkpoint":
        (tmp / "empty").mkdir()
        cfg["base_model_name_or_path"] = str(tmp / "empty")
        expect = f"base_model_name_or_path {str(tmp / 'empty')!r}: {tmp / 'empty'}/config.json missing"  # fmt: skip
    elif how == "base_hub_id_not_cached":
        cfg["base_model_name_or_path"] = "nobody/no-such-model"
        expect = "'nobody/no-such-model': not a local folder, and not in the Hugging Face cache"
    elif how == "config_not_json":
        cfg = None
        cfg_file.write_text("{not json")
        expect = f"{cfg_file}: not a readable adapter config"
    elif how == "pickled_weights":
        (bad / "adapter_model.safetensors").rename(bad / "adapter_model.bin")
        expect = f"{bad}: only pickled weights (adapter_model.bin)"
    elif how == "base_flag_on_a_full_checkpoint":
        bad, extra = adapter["merged"], ["--base", str(adapter["base"])]
        expect = f"--base {adapter['base']}: {bad} is not an adapter folder"
    if cfg is not None:
        cfg_file.write_text(json.dumps(cfg))
    return bad, extra, expect


@pytest.mark.parametrize(
    "how",
    [
        "no_base_field",
        "base_folder_missing",
        "base_not_a_checkpoint",
        "base_hub_id_not_cached",
        "config_not_json",
        "pickled_weights",
        "base_flag_on_a_full_checkpoint",
    ],
)
def test_broken_adapter_is_refused_before_evaluating(adapter, tmp_path, how, capsys, monkeypatch):
    import layerswap.trainables.evaluate.harness as ev

    def tripwire(*a, **k):
        raise AssertionError("evaluation started on a broken adapter")

    monkeypatch.setattr(ev, "evaluate", tripwire)
    bad, extra, expect = _broken(adapter, tmp_path, how)
    out = tmp_path / "res" / "raw.json"
    argv = ["eval", str(bad), "--tasks", TASKS[0], "--world", str(adapter["world"]), "--out", str(out)]  # fmt: skip
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err
    assert not out.parent.exists(), "something was written"


def test_base_flag_overrides_the_config(adapter, tmp_path):
    import layerswap.trainables.evaluate.harness as ev

    moved = tmp_path / "base_copy"
    shutil.copytree(adapter["base"], moved)
    assert ev.eval_target(adapter["adapter"], moved) == (
        str(moved.resolve()),
        str(adapter["adapter"].resolve()),
    )
    assert ev.eval_target(adapter["merged"]) == (str(adapter["merged"]), None)
