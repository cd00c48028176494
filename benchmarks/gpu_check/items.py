"""Belebele- and MGSM-format task files whose prompts have real lengths, for the GPU check.

The world tokenizer's tokens stand in for Llama-3's: passages and questions are drawn word by
word until they reach the token counts the real 5-shot Belebele / 8-shot MGSM prompts have, and
the YAMLs `include:` lm-eval's own belebele_eng_Latn / mgsm_direct_en configs. Used by
evaluator.py (stage 2); `write_tasks(root, tok, sizes)` returns the include folder.
"""

from __future__ import annotations

import json
from pathlib import Path

SHOTS = {"bele_dev": 5, "mgsm_dev": 8}  # real_llama31_8b_sw_search.yaml's proxies
WORDS = (
    "the river city market farmer children school water mountain village road bread teacher "
    "morning family garden price number train station history people country music doctor "
    "island forest winter summer language government a of and in to was for on with"
).split()
BELE_TEMPLATE = "P: \nQ: \nA: \nB: \nC: \nD: \nAnswer: B\n\n"  # belebele's doc_to_text + target
MGSM_TEMPLATE = "Question: \nAnswer:12\n\n"


def n_tokens(tok, text: str) -> int:
    """Tokens of `text` without special tokens."""
    return len(tok(text, add_special_tokens=False)["input_ids"])


def text_of_tokens(tok, n: int, rng) -> str:
    """Random words from WORDS whose encoding has at least `n` tokens (and, with a one-token
    word in WORDS, at most `n` + 1: the space before the first word may merge differently).

    Args:
        tok: the tokenizer that counts.
        n: tokens wanted.
        rng: a numpy Generator.
    """
    cost = {w: n_tokens(tok, " " + w) for w in WORDS}
    cheapest = min(WORDS, key=cost.get)
    words: list[str] = []
    est = 0
    while True:
        w = WORDS[int(rng.integers(len(WORDS)))]
        if est + cost[w] > n:  # the last word: the cheapest, so the text does not overshoot
            w = cheapest
        words.append(w)
        est += cost[w]
        # Byte-level BPE splits at spaces, so word costs add up; the whole text decides.
        if est >= n and n_tokens(tok, " ".join(words)) >= n:
            return " ".join(words)


def belebele_rows(tok, n: int, doc_tokens: int, seed: int) -> list[dict]:
    """`n` Belebele-schema rows of about `doc_tokens` tokens each, rendered with the template."""
    import numpy as np

    rng = np.random.default_rng(seed)
    q, a = max(1, doc_tokens // 12), max(1, doc_tokens // 40)
    passage = max(1, doc_tokens - n_tokens(tok, BELE_TEMPLATE) - q - 4 * a)
    return [
        {
            "flores_passage": text_of_tokens(tok, passage, rng) + ".",
            "question": text_of_tokens(tok, q, rng) + "?",
            **{f"mc_answer{j}": text_of_tokens(tok, a, rng) for j in range(1, 5)},
            "correct_answer_num": str(int(rng.integers(1, 5))),
        }
        for _ in range(n)
    ]


def mgsm_rows(tok, n: int, doc_tokens: int, seed: int, *, train: bool) -> list[dict]:
    """`n` MGSM-schema rows of about `doc_tokens` tokens each (train rows carry answers)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        a, b = int(rng.integers(1, 50)), int(rng.integers(1, 50))
        tail = f" {a} plus {b}?"
        body = max(1, doc_tokens - n_tokens(tok, MGSM_TEMPLATE + tail))
        q = text_of_tokens(tok, body, rng) + "." + tail
        rows.append(
            {
                "question": f"Question: {q}" if train else q,  # as in MGSM's train split
                "answer": f"Step-by-Step Answer: {a} plus {b} is {a + b}." if train else None,
                "answer_number": a + b,
                "equation_solution": f"{a} + {b} = {a + b}" if train else None,
            }
        )
    return rows


def write_tasks(root: Path, tok, sizes: dict) -> Path:
    """JSONL items and task YAMLs `bele_dev`, `mgsm_dev` (lm-eval's own configs, included)."""
    import yaml
    from proxy_fixtures import BELEBELE_EN, MGSM_EN

    root.mkdir(parents=True, exist_ok=True)

    def jsonl(name: str, rows: list[dict]) -> str:
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(root / name)

    bele_doc = sizes["bele_tokens"] // (SHOTS["bele_dev"] + 1)
    mgsm_doc = sizes["mgsm_tokens"] // (SHOTS["mgsm_dev"] + 1)
    bele = [belebele_rows(tok, SHOTS["bele_dev"], bele_doc, 1),
            belebele_rows(tok, sizes["n_bele"], bele_doc, 2)]  # fmt: skip
    mgsm = [mgsm_rows(tok, SHOTS["mgsm_dev"], mgsm_doc, 3, train=True),
            mgsm_rows(tok, sizes["n_mgsm"], mgsm_doc, 4, train=False)]  # fmt: skip
    # Few-shot examples in a split of their own, so any item count can take all the shots.
    data = {
        "bele_dev": (BELEBELE_EN, "fewshot", {"fewshot": jsonl("bele_fewshot.jsonl", bele[0]),
                                              "dev": jsonl("bele_dev.jsonl", bele[1])}),
        "mgsm_dev": (MGSM_EN, "train", {"train": jsonl("mgsm_train.jsonl", mgsm[0]),
                                        "dev": jsonl("mgsm_dev.jsonl", mgsm[1])}),
    }  # fmt: skip
    for task, (include, shots_split, files) in data.items():
        cfg = {
            "include": str(include), "task": task, "dataset_path": "json", "dataset_name": None,
            "dataset_kwargs": {"data_files": files}, "test_split": "dev",
            "fewshot_split": shots_split, "training_split": shots_split,
            "num_fewshot": SHOTS[task],  # HFLM reads it here; the evaluator is given SHOTS too
        }  # fmt: skip
        (root / f"{task}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return root
