"""Model-side kernels of the proxy evaluator: batched choice loglikelihoods and greedy generation.

Each mirrors lm-eval 0.4.13's HFLM on pre-tokenized ids, on the model's own device. With one row
per forward pass nothing is padded, as in HFLM at batch size 1 (its predictions; log-likelihoods
within 1e-4, not bit for bit: only the logits needed are computed); batches are left-padded
(attention mask, positions counted from each row's first real token): a float near-tie may move.
Used by trainables/evaluate/proxy.py.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from lm_eval.models.utils import DEFAULT_MAX_LENGTH, postprocess_generated_text, resolve_max_length
from transformers.generation import LogitsProcessorList

from layerswap.trainables.devices import is_out_of_memory
from layerswap.trainables.evaluate.harness import check_batch_size

# Rows per forward pass when the batch size is "auto": where to start on each device type. On a
# GPU the evaluator halves it on out-of-memory and remembers what fit; on a CPU rows are cheap
# to add until the cores are busy (benchmarks/bench_eval.py measured 16 as the knee).
AUTO_START = {"cpu": 16, "cuda": 64}


def hflm_max_length(model, tokenizer) -> int:
    """The context window lm-eval's HFLM gives `model` when no max_length is passed.

    Args:
        model: the causal LM (its config; an object without one gets HFLM's default).
        tokenizer: its tokenizer (model_max_length, when the config names no length).
    """
    config = getattr(model, "config", None)
    return resolve_max_length(config, tokenizer, default=DEFAULT_MAX_LENGTH)  # HFLM's default


def model_device(model) -> torch.device:
    """The device of the model's first parameter (where every input must be made)."""
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


class BatchSizer:
    """Rows per forward pass: a fixed number, or "auto" (device default, halved on OOM).

    Args:
        setting: a positive int, or "auto".
    """

    def __init__(self, setting: int | str = "auto"):
        self.setting = check_batch_size(setting)  # the rule lm-eval runs share
        self.fitted: dict[tuple[str, str], int] = {}  # (device type, kind) -> size that fit
        self.backoffs = 0  # out-of-memory retries so far (benchmarks report it)

    def size(self, device: torch.device, kind: str) -> int:
        if self.setting != "auto":
            return int(self.setting)
        return self.fitted.get((device.type, kind), AUTO_START.get(device.type, 16))

    def run(self, n: int, chunk: Callable[[int, int], None], device: torch.device, kind: str):
        """Call `chunk(start, stop)` over rows [0, n) in batches, halving on OOM under "auto".

        `chunk` must be safe to call again on the same rows (it writes their results only).
        """
        size, i = self.size(device, kind), 0
        while i < n:
            try:
                chunk(i, min(n, i + size))
                i += size
                continue
            except (RuntimeError, torch.OutOfMemoryError) as e:
                if self.setting != "auto" or size == 1 or not is_out_of_memory(e):
                    raise
            # Out of the except block: the error's traceback held the failed chunk's logits, so
            # an empty_cache inside it gave nothing back before the smaller retry.
            if device.type == "cuda":
                torch.cuda.empty_cache()
            size = max(1, size // 2)
            self.fitted[(device.type, kind)] = size
            self.backoffs += 1


def _logprobs(logits: torch.Tensor) -> torch.Tensor:
    # HFLM._loglikelihood_tokens: log_softmax in the logits' own dtype (softmax_dtype=None).
    return F.log_softmax(logits, dim=-1)


def _left_pad(rows: Sequence[Sequence[int]], pad: int, device) -> tuple[torch.Tensor, dict]:
    """Rows left-padded to one width, and the mask/positions HF generate would use.

    Without padding no mask is passed: the model takes its plain causal path, as in a
    batch-size-1 HFLM call.
    Returns:
        (ids [n, width], {"attention_mask", "position_ids"} or {} when no row is padded)
    """
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], device=device)
    if all(len(r) == width for r in rows):
        return ids, {}
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [n, w]: as GenerationMixin builds position_ids
    return ids, {"attention_mask": mask, "position_ids": pos}


def _full_forward(model, ctx: list[int], cont: list[int], max_length: int) -> tuple[float, bool]:
    """One (context, continuation) pair exactly as HFLM runs it, left truncation included."""
    device = model_device(model)
    inp = (ctx + cont)[-(max_length + 1) :][:-1]
    logits = model(torch.tensor([inp], device=device), use_cache=False).logits[0]  # [len, vocab]
    logp = _logprobs(logits[len(inp) - len(cont) :])  # [len(cont), vocab]
    target = torch.tensor(cont, device=device)  # [n]
    ll = torch.gather(logp, 1, target[:, None]).sum()
    return float(ll), bool((logp.argmax(-1) == target).all())


@torch.inference_mode()
def choice_loglikelihoods(
    model,
    items: Sequence[tuple[list[int], list[list[int]]]],
    max_length: int,
    sizer: BatchSizer | None = None,
    pad_id: int = 0,
) -> list[list[tuple[float, bool]]]:
    """Loglikelihood and is-greedy of every choice of every item, many items per forward pass.

    One row per item and distinct continuation prefix: choices that differ only in their last
    token (Belebele's " A".." D") share one row, like HFLM's logits-cache grouping. Rows run
    longest first, left-padded, keeping only the logits of the last max-continuation positions.
    Pairs HFLM would left-truncate fall back to its exact full forward, one at a time.

    Args:
        model: causal LM in eval mode.
        items: (context ids, [continuation ids per choice]) per item; all non-empty.
        max_length: the model's context window as HFLM resolves it.
        sizer: rows per forward pass (default: one row, unpadded as HFLM at batch size 1).
        pad_id: id written into padding (masked out).
    Returns:
        per item, [(loglikelihood, is_greedy)] in choice order.
    """
    sizer = sizer or BatchSizer(1)
    device = model_device(model)
    out: list[list] = [[None] * len(conts) for _, conts in items]
    rows: list[tuple[int, list[int], list[int]]] = []  # (item, input ids, choices it serves)
    for i, (ctx, conts) in enumerate(items):
        if any(len(ctx) + len(c) > max_length + 1 for c in conts):
            out[i] = [_full_forward(model, ctx, c, max_length) for c in conts]
            continue
        by_prefix: dict[tuple[int, ...], list[int]] = {}
        for j, c in enumerate(conts):
            by_prefix.setdefault(tuple(c[:-1]), []).append(j)
        rows += [(i, ctx + list(p), js) for p, js in by_prefix.items()]
    rows.sort(key=lambda r: -len(r[1]))  # like HFLM's Collator: longest first, less padding

    def chunk(start: int, stop: int) -> None:
        batch = rows[start:stop]
        pairs = [(b, items[i][1][j]) for b, (i, _, js) in enumerate(batch) for j in js]
        k = max(len(c) for _, c in pairs)
        ids, extra = _left_pad([r[1] for r in batch], pad_id, device)
        # No KV cache: nothing reuses it, and at 8B it costs ~128 KB per token.
        fwd = model(input_ids=ids, logits_to_keep=k, use_cache=False, **extra)
        logp = _logprobs(fwd.logits)  # [b, k, V]
        # Continuations right-aligned in a [pairs, k] grid; positions left of one are masked.
        tgt = torch.tensor([[0] * (k - len(c)) + c for _, c in pairs], device=device)
        used = torch.tensor([[0] * (k - len(c)) + [1] * len(c) for _, c in pairs], device=device)
        row = torch.tensor([b for b, _ in pairs], device=device)  # [pairs]
        vals = logp[row[:, None], torch.arange(k, device=device)[None, :], tgt]  # [pairs, k]
        ll = torch.where(used.bool(), vals, torch.zeros((), dtype=vals.dtype, device=device))
        greedy = ((logp.argmax(-1)[row] == tgt) | ~used.bool()).all(-1)  # [pairs]
        lls, gs = ll.sum(-1).tolist(), greedy.tolist()
        n = 0
        for i, _, js in batch:
            for j in js:
                out[i][j] = (float(lls[n]), bool(gs[n]))
                n += 1

    sizer.run(len(rows), chunk, device, "loglikelihood")
    return out


def eos_ids(model, tokenizer) -> set[int]:
    """Token ids that end `model.generate` (generation config first, like transformers)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else {eos}


def stop_triggers(tokenizer, until: list[str]) -> list[int]:
    """Token ids after which a stop string can newly appear in the decoded text.

    A stop string completes with its last character, which the completing token decodes to
    (or, for a byte split over tokens, a replacement character). Generation checks the text
    only after these tokens; a stop missed here costs only compute, never a different answer,
    because every text is cut at its first stop string at the end. Decoding the vocabulary
    takes about a second at 128k tokens, so it runs once per tokenizer and stop set.
    """
    per_tok = _TRIGGERS.setdefault(tokenizer, {})
    key = tuple(until)
    if key not in per_tok:
        last = {s[-1] for s in until if s} | {"\ufffd"}
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        per_tok[key] = [i for i, t in enumerate(texts) if any(ch in t for ch in last)]
    return per_tok[key]


# tokenizer -> {stop strings: trigger ids}; a trial's screening and full evaluators share one.
_TRIGGERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@torch.inference_mode()
def _one_step_on(extra: dict) -> dict:
    """A padded batch's attention mask and positions for its next single token ({} unpadded)."""
    if not extra:
        return extra
    mask = extra["attention_mask"]  # [a, w + step]
    return {
        "attention_mask": torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1),
        "position_ids": extra["position_ids"][:, -1:] + 1,  # [a, 1]
    }


def greedy_generate(
    model,
    tokenizer,
    ctxs: list[list[int]],
    until: list[str],
    max_gen_toks: int,
    stop_ids: set[int],
    triggers: list[int] | None = None,
    processors: Callable[[torch.Tensor], LogitsProcessorList | None] | None = None,
) -> list[str]:
    """Greedy continuations of a batch of contexts, cut at the first stop string.

    As HFLM.generate_until with `model.generate`: contexts left-padded (pad id, mask 0),
    positions counted from each row's first real token, KV cache. A row is done on an EOS id,
    on `max_gen_toks` new tokens, or once a stop string appears in its decoded text (checked
    only after a `triggers` token; HFLM's MultiTokenEOSCriteria watches a short token window,
    so it can only stop later; both texts are then cut at the first stop string, so they
    agree). Finished rows leave the batch once a quarter of it is done. With one context
    there is no padding, as in HFLM at batch size 1.

    Args:
        model: causal LM in eval mode.
        tokenizer: the tokenizer the ids came from.
        ctxs: context ids per row, already left-truncated to max_length - max_gen_toks.
        until: stop strings, EOS string included (lm_eval handle_stop_sequences).
        max_gen_toks: new-token budget.
        stop_ids: EOS ids that end a row.
        triggers: see `stop_triggers` (None: check the text after every token).
        processors: pad lengths [rows] -> the logits processors generate() would apply
            (decoding.DecodingRules.processors), run as generate runs them: on float32 logits,
            over each row's padded context and the tokens chosen so far.
    Returns:
        Per row, the decoded continuation (special tokens skipped), cut at the stop strings.
    """
    device = model_device(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids, extra = _left_pad(ctxs, pad, device)
    # long: an empty list would make a float tensor, and isin would compare ids as floats
    stop_t = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
    trig_t = (
        torch.tensor(triggers, dtype=torch.long, device=device) if triggers is not None else None
    )
    gen: list[list[int]] = [[] for _ in ctxs]
    done: set[int] = set()
    pad_lens = torch.tensor([ids.shape[1] - len(c) for c in ctxs], device=device)  # [a]
    live = _Rows(list(range(len(ctxs))), extra, ids, pad_lens, processors)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **extra)
    cache_kw = cache_argument(model)
    for step in range(max_gen_toks):
        nxt = live.choose(out.logits[:, -1])  # [a]
        eos = torch.isin(nxt, stop_t)
        check = torch.isin(nxt, trig_t) if trig_t is not None else torch.ones_like(eos)
        toks, eos_l, check_l = torch.stack([nxt, eos.long(), check.long()]).tolist()  # one sync
        for b, row in enumerate(live.rows):
            if row in done:
                continue
            gen[row].append(toks[b])
            if eos_l[b] or (check_l[b] and _has_stop(tokenizer, gen[row], until)):
                done.add(row)
        if len(done) == len(ctxs) or step == max_gen_toks - 1:
            break  # the budget's last token is chosen: no forward for a token never used
        keep = [b for b, row in enumerate(live.rows) if row not in done]
        if len(keep) <= 0.75 * len(live.rows):  # drop finished rows: less work per step
            nxt = live.select(keep, cache_of(out), nxt)
        live.extra = _one_step_on(live.extra)
        out = model(
            input_ids=nxt[:, None],
            **{cache_kw: cache_of(out)},
            use_cache=True,
            logits_to_keep=1,
            **live.extra,
        )
    texts = tokenizer.batch_decode(gen, skip_special_tokens=True)
    return [
        postprocess_generated_text(generation=t, stop=until, think_end_token=None) for t in texts
    ]


class _Rows:
    """The rows greedy_generate still runs, in batch order, and what each next step reads.

    Args:
        rows: batch position -> row of the caller's contexts.
        extra: the forward's per-row inputs (attention mask [a, w + step], positions).
        seq: [a, w] the padded contexts (the processors read them and the tokens chosen).
        pad_lens: [a] left padding per row.
        processors: pad lengths -> the logits processors (None: argmax of the logits).
    """

    def __init__(self, rows, extra, seq, pad_lens, processors):
        self.rows: list[int] = rows
        self.extra: dict[str, torch.Tensor] = extra
        self.seq, self.pad_lens, self.processors = seq, pad_lens, processors
        self.procs = processors(pad_lens) if processors is not None else None

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token of every row from its last logits [a, V]; the processors see it."""
        if self.procs is None:
            return logits.argmax(-1)
        logits = self.procs(self.seq, logits.to(dtype=torch.float32, copy=True))
        nxt = logits.argmax(-1)  # [a]
        self.seq = torch.cat([self.seq, nxt[:, None]], dim=1)
        return nxt

    def select(self, keep: list[int], cache, nxt: torch.Tensor) -> torch.Tensor:
        """Keep only batch positions `keep` (here and in the KV cache); returns nxt of those."""
        idx = torch.tensor(keep, device=nxt.device)
        cache.batch_select_indices(idx)
        self.extra = {k: v[idx] for k, v in self.extra.items()}
        self.rows = [self.rows[b] for b in keep]
        if self.procs is not None:  # their state is per row: made again for the rows left
            self.seq, self.pad_lens = self.seq[idx], self.pad_lens[idx]
            self.procs = self.processors(self.pad_lens)
        return nxt[idx]


def cache_argument(model) -> str:
    """The forward argument taking the KV cache: `cache` since transformers renamed it (5.2x;
    `past_key_values` is deprecated there, removed in 5.40), `past_key_values` before."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_of(out):
    """The KV cache of a model output, under either name (see `cache_argument`)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _has_stop(tokenizer, tokens: list[int], until: list[str]) -> bool:
    text = tokenizer.decode(tokens, skip_special_tokens=False)
    return any(s and s in text for s in until)
