"""Plain-torch SFT and quick scorers for world models (a check of the world, not the trainer).

`sft` fine-tunes on prompt/response pairs through the chat template (loss on response tokens
only; the world's template is lm-eval's "Question: ...\nAnswer: ..." layout, so what SFT teaches
shows on the evaluation prompts); `mgsm_accuracy` / `belebele_accuracy` score with lm-eval's
mgsm_direct / belebele prompts.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import torch

from layerswap.spaces.base import read_jsonl
from layerswap.world.items import belebele_prompt, mgsm_prompt

NUMBER = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # lm-eval mgsm flexible-extract


def read_rows(world: Path, rel: str) -> list[dict]:
    """The JSONL rows of one world file (`rel`, e.g. "data/mgsm/xa/dev.jsonl").

    Raises:
        ValueError: the file is missing, not UTF-8 or not JSON lines (naming file and line).
    """
    return read_jsonl(Path(world) / rel)


def load_base(world: Path):
    """The world's base model and tokenizer, on one torch thread (2 ran 5x slower on 2 shared
    cores). Returns (model, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    return (
        AutoModelForCausalLM.from_pretrained(Path(world) / "base"),
        AutoTokenizer.from_pretrained(Path(world) / "base"),
    )


def pairs(rows: list[dict]) -> list[tuple[str, str]]:
    """Orca rows (question/answer) or Aya rows (inputs/targets) -> (prompt, response) pairs."""
    return [
        (r["question"], r["answer"]) if "question" in r else (r["inputs"], r["targets"])
        for r in rows
    ]


def encode_pair(tok, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """One SFT example through the tokenizer's chat template.

    Returns:
        (input ids, labels): labels are -100 over the prompt, so only the response is learned.
    """
    head = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)  # fmt: skip
    full = tok.apply_chat_template(
        [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}],
        tokenize=False,
    )
    n_head = len(tok(head, add_special_tokens=False)["input_ids"])
    ids = tok(full, add_special_tokens=False)["input_ids"]
    return ids, [-100] * n_head + ids[n_head:]


def collate(tok, enc: list[tuple[list[int], list[int]]], device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Right-padded (input ids, labels, attention mask), each [len(enc), longest] on `device`
    (the model's), of examples encoded by `encode_pair`."""
    width = max(len(x) for x, _ in enc)
    ids = torch.full((len(enc), width), tok.pad_token_id, device=device)
    labels = torch.full((len(enc), width), -100, device=device)
    mask = torch.zeros((len(enc), width), dtype=torch.long, device=device)
    for row, (x, y) in enumerate(enc):
        ids[row, : len(x)] = torch.tensor(x, device=device)
        labels[row, : len(y)] = torch.tensor(y, device=device)
        mask[row, : len(x)] = 1
    return ids, labels, mask


def sft(model, tok, examples: list[tuple[str, str]], steps: int, lr: float, seed: int, batch_size: int = 16):  # fmt: skip
    """Fine-tune `model` in place with AdamW (constant LR after a short warmup).

    Args:
        model: a causal LM.
        tok: its tokenizer (with the world chat template and a pad token).
        examples: (prompt, response) pairs.
        steps, lr, seed, batch_size: the run.
    Returns:
        the list of per-step losses.
    """
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    enc = [encode_pair(tok, p, r) for p, r in examples]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    device = next(model.parameters()).device
    losses = []
    for step in range(steps):
        idx = torch.randint(len(enc), (batch_size,), generator=g).tolist()
        ids, labels, mask = collate(tok, [enc[i] for i in idx], device)
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 10)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def mgsm_accuracy(model, tok, rows: list[dict], max_new_tokens: int = 24, batch_size: int = 32) -> float:  # fmt: skip
    """Greedy generation on "Question: ...\\nAnswer:", cut at "Question:", last number == answer_number."""
    right = mgsm_correct(model, tok, rows, max_new_tokens, batch_size)
    return sum(right) / max(1, len(rows))


def mgsm_correct(model, tok, rows: list[dict], max_new_tokens: int = 24, batch_size: int = 32) -> list[bool]:  # fmt: skip
    """Per item, whether `mgsm_accuracy`'s rule counts it right (for paired comparisons)."""
    return [o == "right" for o in mgsm_outcomes(model, tok, rows, max_new_tokens, batch_size)]


# what went wrong with an MGSM answer: whether a gap between languages is reading or arithmetic
OUTCOMES = ("right", "slip", "misread", "no_equation")
EQUATION = re.compile(r"(\d+(?: [-+*/] \d+)+) =")


def _evaluate(lhs: str) -> Fraction | None:
    """The value of "a op b [op c ...]" with * and / before + and - (the worked answers' order);
    None for a division by zero."""
    tokens = lhs.split()
    terms, ops = [Fraction(int(tokens[0]))], []
    for op, num in zip(tokens[1::2], tokens[2::2], strict=True):
        n = Fraction(int(num))
        if op == "/" and not n:
            return None
        if op in "*/":
            terms[-1] = terms[-1] * n if op == "*" else terms[-1] / n
        else:
            terms.append(n)
            ops.append(op)
    value = terms[0]
    for op, t in zip(ops, terms[1:], strict=True):
        value = value + t if op == "+" else value - t
    return value


def answer_outcome(text: str, answer_number: int | str) -> str:
    """Classify one generated MGSM answer (OUTCOMES).

    Args:
        text: the generation after "Answer:", cut at the next "Question:".
        answer_number: the item's answer.
    Returns:
        "right" (lm-eval's flexible-extract rule: the last number is the answer), "slip" (the
        first equation's left side has the answer's value: read right, computed wrong),
        "misread" (an equation of other operands or operation) or "no_equation".
    """
    found = [m[0] or m[1] for m in NUMBER.findall(text)]
    guess = found[-1].strip("$.,").replace(",", "") if found else ""
    if guess == str(answer_number):
        return "right"
    eq = EQUATION.search(text)
    if eq is None:
        return "no_equation"
    return "slip" if _evaluate(eq.group(1)) == int(answer_number) else "misread"


# how a misread equation differs from the true one (`misread_kind`)
MISREADS = ("operands", "operation", "both", "order")


def _terms(lhs: str) -> tuple[list[int], list[str]]:
    """("3 + 4 - 2") -> ([2, 3, 4], ["+", "-"]): the operands and operators, sorted."""
    tokens = lhs.split()
    return sorted(int(t) for t in tokens[0::2]), sorted(tokens[1::2])


def misread_kind(text: str, equation: str) -> str | None:
    """What a misread answer got wrong, against the problem's true equation.

    Args:
        text: the generation, as `answer_outcome` takes it.
        equation: the problem's worked equation, e.g. "5 - 2 = 3" (`layerswap.world.items.Problem`).
    Returns:
        None unless `answer_outcome` calls it "misread"; else (MISREADS) "operands" (other
        numbers, right operations), "operation" (the problem's numbers, other operations), "both",
        or "order" (the same numbers and operations, arranged otherwise, e.g. "2 - 5").
        Numbers and operators are compared as multisets: an extra term ("5 + 2 + 1" for
        "5 + 2") is "both"; "3 - 4 + 2" for "3 + 4 - 2" is "order". The sign of a leading
        negative operand is not read (`EQUATION` starts at the first digit); the world's true
        equations have none.
    """
    answer = equation.rsplit("=", 1)[1].strip()
    if answer_outcome(text, answer) != "misread":
        return None
    got = _terms(EQUATION.search(text).group(1))
    true = _terms(equation.rsplit("=", 1)[0])
    operands, operation = got[0] != true[0], got[1] != true[1]
    return "both" if operands and operation else "operands" if operands else "operation" if operation else "order"  # fmt: skip


@torch.no_grad()
def mgsm_answers(model, tok, rows: list[dict], max_new_tokens: int = 24, batch_size: int = 32) -> list[str]:  # fmt: skip
    """Greedy generation on "Question: ...\\nAnswer:" per item, cut at the next "Question:".

    Args:
        model, tok: a causal LM and its tokenizer (left padding is set here).
        rows: MGSM rows ("question").
        max_new_tokens, batch_size: generation length and batch.
    Returns:
        The generated answer text per row, in the rows' order.
    """
    tok.padding_side = "left"
    texts = []
    device = next(model.parameters()).device
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        batch = tok([mgsm_prompt(r["question"]) for r in chunk], return_tensors="pt", padding=True, add_special_tokens=False).to(device)  # fmt: skip
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)  # fmt: skip
        texts += [tok.decode(seq, skip_special_tokens=True).split("Question:")[0] for seq in out[:, batch["input_ids"].shape[1] :]]  # fmt: skip
    return texts


def mgsm_outcomes(model, tok, rows: list[dict], max_new_tokens: int = 24, batch_size: int = 32) -> list[str]:  # fmt: skip
    """`mgsm_answers` per item, classified by `answer_outcome`.

    Args:
        As `mgsm_answers`; rows also carry "answer_number".
    Returns:
        One of OUTCOMES per row.
    """
    return classify(mgsm_answers(model, tok, rows, max_new_tokens, batch_size), rows)


def classify(texts: list[str], rows: list[dict]) -> list[str]:
    """`answer_outcome` of each generated answer against its row's "answer_number"."""
    return [answer_outcome(t, r["answer_number"]) for t, r in zip(texts, rows, strict=True)]


@torch.no_grad()
def belebele_option_logps(model, tok, rows: list[dict]) -> torch.Tensor:
    """Loglikelihood of " A".." D" after lm-eval's belebele prompt, per row: [len(rows), 4]."""
    letters = [tok(f" {c}", add_special_tokens=False)["input_ids"] for c in "ABCD"]
    device = next(model.parameters()).device
    # A host-side table on purpose: it is filled from .item() floats (already on the host), is
    # never fed to the model, and `_gold` makes its labels on the table's device. float64 keeps
    # the sums of float32 logps exact.
    out = torch.empty(len(rows), 4, dtype=torch.float64)
    for i, r in enumerate(rows):
        ctx = tok(belebele_prompt(r), add_special_tokens=False)["input_ids"]
        for j, cont in enumerate(letters):
            ids = torch.tensor([ctx + cont], device=device)
            logp = torch.log_softmax(model(input_ids=ids).logits[0, len(ctx) - 1 : -1], -1)
            out[i, j] = sum(logp[k, t].item() for k, t in enumerate(cont))
    return out


def _gold(rows: list[dict], device: torch.device) -> torch.Tensor:
    """The right option's index per row, on `device` (that of the option table it meets)."""
    labels = [int(r["correct_answer_num"]) - 1 for r in rows]
    return torch.tensor(labels, dtype=torch.long, device=device)


def belebele_accuracy(model, tok, rows: list[dict]) -> float:
    """Argmax over the loglikelihood of " A".." D" after lm-eval's belebele prompt."""
    return belebele_accuracy_of(belebele_option_logps(model, tok, rows), rows)


def belebele_accuracy_of(logps: torch.Tensor, rows: list[dict]) -> float:
    """Accuracy from `belebele_option_logps` (the first option of a tie, as lm-eval's argmax)."""
    if not rows:
        return 0.0
    return (logps.argmax(-1) == _gold(rows, logps.device)).double().mean().item()


def belebele_gold_prob(logps: torch.Tensor, rows: list[dict]) -> float:
    """Mean probability of the right option, the four options' likelihoods renormalised: the
    accuracy's continuous reading, which keeps ranking models that all answer every item right.

    Args:
        logps: `belebele_option_logps` of the rows, [len(rows), 4].
        rows: Belebele rows (their correct_answer_num).
    """
    if not rows:
        return 0.0
    probs = torch.softmax(logps, -1)  # [len(rows), 4]
    return probs.gather(1, _gold(rows, logps.device)[:, None]).mean().item()


def belebele_brier(logps: torch.Tensor, rows: list[dict]) -> float:
    """Mean multi-class Brier score of the four renormalised options (lower is better; 0.75
    for a uniform guess), as lm-eval's `brier_score` of the world_belebele_brier_* tasks.
    Arguments as `belebele_gold_prob`'s."""
    if not rows:
        return 0.0
    probs = torch.softmax(logps, -1)  # [len(rows), 4]
    onehot = torch.nn.functional.one_hot(_gold(rows, logps.device), 4).double()
    return ((probs - onehot) ** 2).sum(-1).mean().item()
