"""Fixtures for the proxy evaluator: MGSM/Belebele-schema JSONL, task YAMLs, tiny models.

The YAMLs `include:` lm-eval's built-in configs and override only the data source.
"""

from __future__ import annotations

import json
from pathlib import Path

import lm_eval
import torch
import yaml

from layerswap.spaces.task_families import BRIER_METRICS

LM_EVAL_TASKS = Path(lm_eval.__file__).parent / "tasks"
MGSM_EN = LM_EVAL_TASKS / "mgsm" / "direct" / "mgsm_direct_en.yaml"
BELEBELE_EN = LM_EVAL_TASKS / "belebele" / "belebele_eng_Latn.yaml"

WORDS = "the math expert solves word problems step by step plus minus times equals".split()


def _sentence(rng, n: int) -> str:
    return " ".join(WORDS[int(rng.integers(len(WORDS)))] for _ in range(n))


def mgsm_rows(n: int, seed: int, *, train: bool = False) -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        a, b = int(rng.integers(1, 20)), int(rng.integers(1, 20))
        q = f"{_sentence(rng, 3)} {a} plus {b}?"
        rows.append(
            {
                "question": q,
                "answer": f"Step-by-Step Answer: {a} plus {b} equals {a + b}." if train else None,
                "answer_number": a + b,
                "equation_solution": f"{a} + {b} = {a + b}" if train else None,
            }
        )
    return rows


def belebele_rows(n: int, seed: int) -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [
        {
            "flores_passage": _sentence(rng, 6) + ".",
            "question": _sentence(rng, 3) + "?",
            **{f"mc_answer{j}": _sentence(rng, 2) for j in range(1, 5)},
            "correct_answer_num": str(int(rng.integers(1, 5))),
        }
        for _ in range(n)
    ]


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_world(root: Path, n_mgsm: int = 10, n_bele: int = 10) -> Path:
    """Task YAMLs `mgsm_{dev,test}`, `bele_{dev,test}` and `bele_brier_{dev,test}` (Belebele
    scored by brier_score) over JSONL files under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    train = _jsonl(root / "mgsm_train.jsonl", mgsm_rows(8, 0, train=True))
    for split, seed in (("dev", 1), ("test", 2)):
        data = _jsonl(root / f"mgsm_{split}.jsonl", mgsm_rows(n_mgsm, seed))
        (root / f"mgsm_{split}.yaml").write_text(
            f"include: {MGSM_EN}\ntask: mgsm_{split}\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    train: {train}\n    {split}: {data}\n"
            f"training_split: train\ntest_split: {split}\n"
        )
        data = _jsonl(root / f"bele_{split}.jsonl", belebele_rows(n_bele, seed + 10))
        (root / f"bele_{split}.yaml").write_text(
            f"include: {BELEBELE_EN}\ntask: bele_{split}\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    {split}: {data}\n"
            f"test_split: {split}\nfewshot_split: {split}\n"
        )
        # The same items scored by lm-eval's brier_score first (as the world's Brier twins).
        (root / f"bele_brier_{split}.yaml").write_text(
            f"include: {BELEBELE_EN}\ntask: bele_brier_{split}\ndataset_path: json\n"
            f"dataset_name: null\ndataset_kwargs:\n  data_files:\n    {split}: {data}\n"
            f"test_split: {split}\nfewshot_split: {split}\n"
            + yaml.safe_dump({"metric_list": BRIER_METRICS})
        )
    return root


def tiny_models(tok, n: int = 3, seed: int = 0):
    """A random tiny Llama and `n - 1` seeded perturbed copies, in eval mode.

    Weights are larger than the default init so greedy choices are not float near-ties, and the
    lm_head rows of digit tokens are scaled up so greedy generation often emits numbers.
    """
    from transformers import LlamaForCausalLM

    from layerswap.world.tiny import perturbed, tiny_config

    torch.manual_seed(seed)
    cfg = tiny_config(2, vocab_size=len(tok), max_position_embeddings=256, initializer_range=0.2)
    base = LlamaForCausalLM(cfg)
    digits = [i for t, i in tok.get_vocab().items() if any(ch.isdigit() for ch in t)]
    with torch.no_grad():
        base.lm_head.weight[digits] *= 3.0
    state = base.state_dict()
    models = [base.eval()]
    for i in range(1, n):
        m = LlamaForCausalLM(cfg)
        m.load_state_dict(perturbed(state, 0.05, seed * 100 + i))
        models.append(m.eval())
    return models


def lm_eval_samples(model, tok, world, tasks, gen_kwargs) -> dict:
    """lm-eval's own per-sample log: {task: {(doc_id, filter): sample}}."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model=HFLM(pretrained=model, tokenizer=tok),
        tasks=tasks,
        task_manager=TaskManager(include_path=str(world), include_defaults=False),
        log_samples=True,
        gen_kwargs=dict(gen_kwargs),
        bootstrap_iters=0,
        cache_requests=False,
    )
    return {t: {(s["doc_id"], s["filter"]): s for s in out["samples"][t]} for t in tasks}
