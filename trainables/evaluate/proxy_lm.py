"""Model-side kernels of the proxy evaluator: choice loglikelihoods and greedy generation.

Each mirrors lm-eval 0.4.13's HFLM (batch size 1) on pre-tokenized ids; see trainables/evaluate/proxy.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lm_eval.models.utils import postprocess_generated_text


def _logprobs(logits: torch.Tensor) -> torch.Tensor:
    # HFLM._loglikelihood_tokens: log_softmax in the logits' own dtype (softmax_dtype=None).
    return F.log_softmax(logits, dim=-1)


def _score(logp: torch.Tensor, cont: list[int]) -> tuple[float, bool]:
    """(sum of log p(cont), cont is the greedy continuation) from logp [len(cont), vocab]."""
    target = torch.tensor(cont, dtype=torch.long)  # [n]
    ll = float(torch.gather(logp, 1, target[:, None]).sum())
    return ll, bool((logp.argmax(-1) == target).all())


def _full_forward(model, ctx: list[int], cont: list[int], max_length: int) -> tuple[float, bool]:
    """One (context, continuation) pair exactly as HFLM runs it, left truncation included."""
    inp = (ctx + cont)[-(max_length + 1) :][:-1]
    logits = model(torch.tensor([inp], dtype=torch.long)).logits[0]  # [len(inp), vocab]
    return _score(_logprobs(logits[len(inp) - len(cont) :]), cont)


@torch.inference_mode()
def choice_loglikelihoods(
    model, ctx: list[int], conts: list[list[int]], max_length: int
) -> list[tuple[float, bool]]:
    """Loglikelihood and is-greedy of each continuation after one shared context.

    The context plus the prefix every choice shares runs once; its KV cache serves each
    choice's remaining prefix (run on top, then cropped back). Choices that differ only in
    their last token (Belebele's " A".." D") cost one forward pass in all, like HFLM's
    logits_cache grouping. Pairs that HFLM would left-truncate fall back to its
    exact full forward.

    Args:
        model: causal LM in eval mode.
        ctx: context token ids (non-empty).
        conts: continuation token ids, one list per choice (each non-empty).
        max_length: the model's context window as HFLM resolves it.
    Returns:
        [(loglikelihood, is_greedy)] in choice order.
    """
    if any(len(ctx) + len(c) > max_length + 1 for c in conts):
        return [_full_forward(model, ctx, c, max_length) for c in conts]
    # The context and the prefix all choices share (e.g. a leading space token) run once.
    common = list(conts[0][:-1])
    for c in conts[1:]:
        n = 0
        while n < min(len(common), len(c) - 1) and common[n] == c[n]:
            n += 1
        common = common[:n]
    out = model(
        torch.tensor([ctx + common], dtype=torch.long),
        use_cache=True,
        logits_to_keep=len(common) + 1,
    )
    cache = out.past_key_values
    shared = _logprobs(out.logits[0])  # [len(common) + 1, vocab]
    by_rest: dict[tuple[int, ...], torch.Tensor] = {}
    results = []
    for cont in conts:
        rest = tuple(cont[len(common) : -1])  # this choice's own prefix beyond `common`
        if rest and rest not in by_rest:
            logits = model(
                torch.tensor([rest], dtype=torch.long), past_key_values=cache, use_cache=True
            ).logits[0]  # [len(rest), vocab]
            cache.crop(-len(rest))  # transformers 5: a negative count drops the tail
            by_rest[rest] = _logprobs(logits)
        logp = torch.cat([shared, by_rest[rest]]) if rest else shared  # [len(cont), vocab]
        results.append(_score(logp, cont))
    return results


def eos_ids(model, tokenizer) -> set[int]:
    """Token ids that end `model.generate` (generation config first, like transformers)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else {eos}


@torch.inference_mode()
def greedy_generate(
    model,
    tokenizer,
    ctxs: list[list[int]],
    until: list[str],
    max_gen_toks: int,
    stop_ids: set[int],
) -> list[str]:
    """Greedy continuations of a batch of contexts, cut at the first stop string.

    As HFLM.generate_until with `model.generate`: contexts left-padded (pad id, mask 0),
    positions counted from each row's first real token, KV cache. A row is done on an EOS id,
    on `max_gen_toks` new tokens, or as soon as a stop string appears in its decoded text
    (HFLM's MultiTokenEOSCriteria watches a short token window, so it can only stop later;
    both texts are then cut at the first stop string, so they agree). With one context there
    is no padding and the arithmetic is HFLM's at batch size 1.

    Args:
        model: causal LM in eval mode.
        tokenizer: the tokenizer the ids came from.
        ctxs: context ids per row, already left-truncated to max_length - max_gen_toks.
        until: stop strings, EOS string included (lm_eval handle_stop_sequences).
        max_gen_toks: new-token budget.
        stop_ids: EOS ids that end a row.
    Returns:
        Per row, the decoded continuation (special tokens skipped), cut at the stop strings.
    """
    n, width = len(ctxs), max(len(c) for c in ctxs)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(c)) + c for c in ctxs], dtype=torch.long)  # [n, w]
    mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in ctxs])  # [n, w]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [n, w]: as GenerationMixin builds position_ids
    gen: list[list[int]] = [[] for _ in range(n)]
    done = [False] * n
    # Without padding the mask is all ones: let the model take its plain causal path (cheaper).
    padded = any(len(c) != width for c in ctxs)

    def extra():
        return {"attention_mask": mask, "position_ids": pos} if padded else {}

    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **extra())
    for _ in range(max_gen_toks):
        nxt = out.logits[:, -1].argmax(-1).tolist()  # [n]
        for i, t in enumerate(nxt):
            if done[i]:
                continue
            gen[i].append(t)
            text = tokenizer.decode(gen[i], skip_special_tokens=False)
            done[i] = t in stop_ids or any(s and s in text for s in until)
        if all(done):
            break
        if padded:
            mask = torch.cat([mask, torch.ones(n, 1, dtype=mask.dtype)], dim=1)  # [n, w + step]
            pos = pos[:, -1:] + 1  # [n, 1]
        out = model(
            input_ids=torch.tensor(nxt)[:, None],
            past_key_values=out.past_key_values,
            use_cache=True,
            logits_to_keep=1,
            **extra(),
        )
    texts = [tokenizer.decode(g, skip_special_tokens=True) for g in gen]
    return [
        postprocess_generated_text(generation=t, stop=until, think_end_token=None) for t in texts
    ]
