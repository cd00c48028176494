"""Cached proxy evaluator: lm-eval prompts tokenized once, scored on many candidate models.

`ProxyEvaluator(["belebele_dev"], tok, include_path=...).score(model, fidelity=0.5)`;
`.restricted({task: doc_ids})` scores a subset of the items with the prompts built here.
"""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

from layerswap.trainables.evaluate.decoding import decoding_rules
from layerswap.trainables.evaluate.finite_outputs import watch_logits
from layerswap.trainables.evaluate.lm_eval_api import apply_filters, load_tasks
from layerswap.trainables.evaluate.proxy_lm import (
    BatchSizer,
    choice_loglikelihoods,
    eos_ids,
    greedy_generate,
    hflm_max_length,
    model_device,
    stop_triggers,
)

# lm-eval's default fewshot sampler seed (lm_eval.evaluator.simple_evaluate).
FEWSHOT_SEED = 1234


@dataclass(frozen=True)
class Access:
    """One read of task data: which task, split and doc ids, and why."""

    task: str
    split: str
    doc_ids: tuple[int, ...] | None  # None: the whole split may be sampled (fewshot)
    purpose: str  # "prompt" (construction), "score", "fewshot"


@dataclass
class _Item:
    """One doc, prompted and tokenized once."""

    doc_id: int
    doc: dict
    ctx_ids: list[int]
    cont_ids: list[list[int]] = field(default_factory=list)  # multiple_choice: one per choice
    request: Any = None  # the lm-eval Instance (generate_until): carries doc and metadata


@dataclass
class _TaskCache:
    name: str
    task: Any
    kind: str  # "multiple_choice" | "generate_until"
    split: str
    items: list[_Item]
    order: list[int]  # seeded permutation of item positions; fidelity takes a prefix
    until: list[str] = field(default_factory=list)
    max_gen_toks: int = 0
    gen_kwargs: dict = field(default_factory=dict)  # generate_until: see decoding.py
    triggers: list[int] | None = None  # generate_until: see proxy_lm.stop_triggers


@dataclass
class ItemResult:
    """Per-item outcome. `prediction`: choice index, or {filter name: filtered response}."""

    task: str
    doc_id: int
    prediction: Any
    response: Any  # [(loglikelihood, is_greedy)] per choice, or the raw generated text
    metrics: dict[str, float]  # lm-eval keys, e.g. "acc,none", "exact_match,flexible-extract"


@dataclass
class ProxyResult:
    items: dict[str, list[ItemResult]]  # per task, in fidelity order
    aggregate: dict[str, dict[str, float]]  # per task, lm-eval metric keys
    fidelity: float
    seconds: float


def _split_of(task) -> str:
    """The split `task.eval_docs` reads (lm-eval: test if present, else validation)."""
    return task.config.test_split if task.has_test_docs() else task.config.validation_split


def _memoize_per_doc(task, *methods: str) -> None:
    """Cache `task.<method>(doc)` per doc object on this (private) Task instance.

    Task.process_results re-renders doc_to_target's Jinja template on every call, which costs
    as much as a tiny model's forward pass; the docs held by the evaluator never change.
    """
    for name in methods:
        fn, memo = getattr(task, name), {}

        def cached(doc, *args, _fn=fn, _memo=memo, **kwargs):
            if args or kwargs:
                return _fn(doc, *args, **kwargs)
            hit = _memo.get(id(doc))
            if hit is None or hit[0] is not doc:
                hit = _memo[id(doc)] = (doc, _fn(doc))
            return hit[1]

        setattr(task, name, cached)


def _seeded_order(seed: int, task: str, n: int) -> list[int]:
    """The seeded permutation of a task's n item positions (fidelity takes a prefix of it)."""
    order = list(range(n))
    random.Random(f"{seed}:{task}").shuffle(order)
    return order


class ProxyEvaluator:
    """Scores candidate models on a fixed list of lm-eval docs, prompts tokenized once.

    Args:
        task_names: lm-eval task (or group) names; the caller picks the variant (e.g. a dev split).
        tokenizer: the candidates' shared HF tokenizer.
        include_path: folder(s) of task YAMLs.
        limit: keep the first `limit` docs of each task's eval split (as lm-eval's `limit`).
        num_fewshot: lm-eval num_fewshot, one for all tasks or {task: shots} (0 by default;
            fewshot reads are logged).
        gen_kwargs: overrides merged into generate_until tasks' generation_kwargs, as
            simple_evaluate(gen_kwargs=...) does (e.g. {"max_gen_toks": 32}).
        add_bos_token: HFLM's add_bos_token argument.
        seed: seed of the fidelity permutation.
        batch_size: rows per forward pass, for both kinds of task: an int, or "auto"
            (trainables/evaluate/proxy_lm.AUTO_START per device, halved on out-of-memory).
            1 is unpadded, as HFLM at batch size 1: the same predictions and texts (tested,
            float32 CPU) and log-likelihoods within 1e-4, not bit for bit (only the
            continuation's logits are computed: up to 9.3e-6 nats measured); larger batches
            are left-padded (faster, but padding may move a float near-tie).
    """

    def __init__(
        self,
        task_names: list[str],
        tokenizer,
        *,
        include_path: str | list[str],
        limit: int | None = None,
        num_fewshot: int | dict[str, int] = 0,
        gen_kwargs: dict | None = None,
        add_bos_token: bool | None = None,
        seed: int = 0,
        batch_size: int | str = 1,
    ):
        from lm_eval.models.utils import configure_pad_token

        self.tokenizer = configure_pad_token(tokenizer)  # HFLM.__init__ does the same
        self.add_bos_token = add_bos_token
        self.sizer = BatchSizer(batch_size)
        self.seed = seed
        self.access_log: list[Access] = []
        self.tasks: dict[str, _TaskCache] = {}
        for name, task in load_tasks(task_names, include_path).items():
            shots = num_fewshot.get(name, 0) if isinstance(num_fewshot, dict) else num_fewshot
            self.tasks[name] = self._build(name, task, limit, shots, gen_kwargs, seed)

    def restricted(self, doc_ids: dict[str, list[int]]) -> ProxyEvaluator:
        """This evaluator over some of its items, each with the prompt built here.

        Prompts are never rebuilt for a subset: lm-eval's few-shot sampler draws every doc's
        examples from one generator, doc after doc, so a doc built among fewer docs would get
        other examples than lm-eval (and this evaluator) give it over the whole split.

        Args:
            doc_ids: {task: doc ids} to keep; tasks not named are left out.
        Returns:
            an evaluator sharing this one's tokenizer, prompts and batch sizer, whose items are
            in doc id order and shuffled by the same seeded rule; its access log starts empty
            (the prompts were read, and logged, here).
        """
        out = copy.copy(self)
        out.access_log, out.tasks = [], {}
        for name, ids in doc_ids.items():
            c = self.tasks[name]
            by_id = {it.doc_id: it for it in c.items}
            if missing := sorted(set(ids) - set(by_id)):
                raise ValueError(f"{name}: doc ids {missing[:5]} are not among this evaluator's items")  # fmt: skip
            items = [by_id[d] for d in sorted(set(ids))]
            out.tasks[name] = replace(c, items=items, order=_seeded_order(self.seed, name, len(items)))  # fmt: skip
        return out

    # -- tokenization, as HFLM (causal backend) -------------------------------------------
    def _prefix_token_id(self) -> int:
        tok = self.tokenizer
        return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id

    def _tok_encode(self, s: str, add_special_tokens: bool | None = None) -> list[int]:
        # HFLM.tok_encode + lm_eval.models.utils._add_special_kwargs / has_bos_prefix.
        kw = {}
        if add_special_tokens is not None:
            kw["add_special_tokens"] = add_special_tokens
        elif self.add_bos_token is not None:
            kw["add_special_tokens"] = self.add_bos_token
        if add_special_tokens is None and s.startswith(
            self.tokenizer.decode(self._prefix_token_id())
        ):
            kw["add_special_tokens"] = False
        return self.tokenizer.encode(s, **kw)

    def _encode_pair(self, ctx: str, cont: str) -> tuple[list[int], list[int]]:
        # TemplateLM.loglikelihood + _encode_pair: trailing context spaces move to the
        # continuation; the continuation is the tail of the whole string's encoding.
        if ctx == "":
            cont_enc = self._tok_encode(cont, add_special_tokens=False)
            if self._prefix_token_id() != cont_enc[0]:
                return [self._prefix_token_id()], cont_enc
            return cont_enc[:1], cont_enc[1:]
        n = len(ctx) - len(ctx.rstrip())
        if n:
            ctx, cont = ctx[:-n], ctx[-n:] + cont
        whole = self._tok_encode(ctx + cont)
        ctx_enc = self._tok_encode(ctx)
        return ctx_enc, whole[len(ctx_enc) :]

    def _gen_encode(self, ctx: str) -> list[int]:
        # HFLM.tok_batch_encode for one string (no padding): BOS check on the bos string.
        kw = {}
        bos = self.tokenizer.bos_token
        if bos is not None and ctx.startswith(bos):
            kw["add_special_tokens"] = False
        elif self.add_bos_token is not None:
            kw["add_special_tokens"] = self.add_bos_token
        return self.tokenizer([ctx], **kw)["input_ids"][0]

    # -- construction ----------------------------------------------------------------------
    def _build(self, name, task, limit, num_fewshot, gen_kwargs, seed) -> _TaskCache:
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

        kind = task.get_config("output_type")
        if kind not in ("multiple_choice", "generate_until"):
            raise ValueError(f"{name}: output_type {kind!r} is not supported")
        # simple_evaluate's overrides, in its order.
        if kind == "generate_until" and gen_kwargs:
            task.set_config(key="generation_kwargs", value=dict(gen_kwargs), update=True)
        if num_fewshot is not None and task.get_config("num_fewshot") != 0:
            task.set_config(key="num_fewshot", value=num_fewshot)  # None: the task's own
        task.set_fewshot_seed(seed=FEWSHOT_SEED)
        shots = task.get_config("num_fewshot") or 0

        _memoize_per_doc(task, "doc_to_target", "doc_to_choice")
        split = _split_of(task)
        docs = task.eval_docs
        ids = list(range(len(docs)))[:limit]  # every doc in order, as lm-eval builds them
        self.access_log.append(Access(name, split, tuple(ids), "prompt"))
        if shots:
            fs = task.config.fewshot_split or task.config.training_split or split
            self.access_log.append(Access(name, fs, None, "fewshot"))

        items = []
        for doc_id in ids:
            doc = docs[doc_id]
            # Task.build_all_requests: the fewshot context, then construct_requests.
            ctx = task.fewshot_context(doc, num_fewshot=shots, gen_prefix=task.doc_to_prefix(doc))
            reqs = task.construct_requests(
                doc=doc, ctx=ctx, metadata=(name, doc_id, task.config.repeats)
            )
            if kind == "multiple_choice":
                pairs = [self._encode_pair(*r.args) for r in reqs]
                if any(p[0] != pairs[0][0] for p in pairs):
                    raise ValueError(f"{name}/{doc_id}: choices do not share one context")
                items.append(_Item(doc_id, doc, pairs[0][0], [p[1] for p in pairs]))
            else:
                items.append(_Item(doc_id, doc, self._gen_encode(reqs.args[0]), request=reqs))
        cache = _TaskCache(name, task, kind, split, items, _seeded_order(seed, name, len(items)))
        if kind == "generate_until":
            kw = normalize_gen_kwargs(task.config.generation_kwargs, 256)  # HFLM max_gen_toks
            eos = self.tokenizer.decode(self.tokenizer.eos_token_id, skip_special_tokens=False)
            cache.until = handle_stop_sequences(kw.pop("until", None), eos=eos)
            cache.max_gen_toks = kw.pop("max_gen_toks")
            cache.gen_kwargs = kw  # what HFLM passes on to model.generate
            decoding_rules(None, kw, cache.max_gen_toks, f"task {name}")  # refused before any work
            cache.triggers = stop_triggers(self.tokenizer, cache.until)
        return cache

    def splits_read(self) -> set[tuple[str, str]]:
        """Every (task, split) this evaluator has read docs from, e.g. to assert no test split."""
        return {(a.task, a.split) for a in self.access_log}

    # -- scoring ---------------------------------------------------------------------------
    def subset(self, task: str, fidelity: float) -> list[int]:
        """Doc ids scored at `fidelity`: a prefix of the task's seeded permutation.

        Args:
            task: task name.
            fidelity: fraction in (0, 1]; at least one item is kept.
        Returns:
            doc ids in scoring order.
        """
        if not 0 < fidelity <= 1:
            raise ValueError(f"fidelity must be in (0, 1], got {fidelity}")
        c = self.tasks[task]
        k = max(1, math.ceil(fidelity * len(c.items) - 1e-9))
        return [c.items[i].doc_id for i in c.order[:k]]

    def score(self, model, fidelity: float = 1.0) -> ProxyResult:
        """Score one candidate on every task's fidelity subset.

        Args:
            model: in-memory transformers causal LM (put in eval mode here).
            fidelity: fraction of each task's items to score (see `subset`).
        Returns:
            ProxyResult with per-item predictions and lm-eval-keyed aggregates per task.
        """
        t0 = time.perf_counter()
        model.eval()
        max_length = hflm_max_length(model, self.tokenizer)
        # NaN logits score as numbers (an argmax over NaNs picks the first option), as in
        # lm-eval; watched per forward without a sync, read once per task (_score_tasks).
        with watch_logits(model) as logits:
            items, aggregate = self._score_tasks(model, fidelity, max_length, logits)
        return ProxyResult(items, aggregate, fidelity, time.perf_counter() - t0)

    def _score_tasks(self, model, fidelity: float, max_length: int, logits) -> tuple[dict, dict]:
        """Each task's items and aggregates; NonFiniteOutputs naming the task whose forwards
        gave a NaN or Inf logit (a diverged model, or a kernel's overflow on a GPU)."""
        items: dict[str, list[ItemResult]] = {}
        aggregate: dict[str, dict[str, float]] = {}
        for name, c in self.tasks.items():
            k = len(self.subset(name, fidelity))
            chosen = [c.items[i] for i in c.order[:k]]
            self.access_log.append(
                Access(name, c.split, tuple(it.doc_id for it in chosen), "score")
            )
            if c.kind == "multiple_choice":
                res = self._score_mc(c, chosen, model, max_length)
            else:
                res = self._score_gen(c, chosen, model, max_length)
            logits.check(f"{type(model).__name__} on {name}")
            items[name] = res
            agg_fns = c.task.aggregation()
            aggregate[name] = {
                key: float(agg_fns[key.split(",")[0]]([r.metrics[key] for r in res]))
                for key in res[0].metrics
            }
        return items, aggregate

    def _score_mc(self, c: _TaskCache, chosen: list[_Item], model, max_length: int) -> list:
        import numpy as np

        pad = self.tokenizer.pad_token_id or 0
        batch = [(it.ctx_ids, it.cont_ids) for it in chosen]
        all_lls = choice_loglikelihoods(model, batch, max_length, self.sizer, pad)
        out = []
        for it, lls in zip(chosen, all_lls, strict=True):
            # Task.process_results gives acc / acc_norm exactly as lm-eval computes them.
            metrics = c.task.process_results(it.doc, lls)
            pred = int(np.argmax([ll for ll, _ in lls]))
            out.append(
                ItemResult(
                    c.name, it.doc_id, pred, lls, {f"{m},none": v for m, v in metrics.items()}
                )
            )
        return out

    def _score_gen(self, c: _TaskCache, chosen: list[_Item], model, max_length) -> list:
        max_ctx = max_length - c.max_gen_toks  # HFLM.generate_until left truncation
        if max_ctx <= 0:
            raise ValueError(f"{c.name}: max_gen_toks {c.max_gen_toks} >= max_length {max_length}")
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        rules = decoding_rules(model, c.gen_kwargs, c.max_gen_toks, f"task {c.name} on model {name}")  # fmt: skip
        stop_ids = set(rules.eos_ids) if rules.eos_ids else eos_ids(model, self.tokenizer)
        # Longest first, like HFLM's Collator; batches of one are unpadded, as HFLM's at 1.
        todo = sorted(range(len(chosen)), key=lambda i: -len(chosen[i].ctx_ids))
        texts: dict[int, str] = {}

        def chunk(start: int, stop: int) -> None:
            rows = todo[start:stop]
            ctxs = [chosen[i].ctx_ids[-max_ctx:] for i in rows]
            outs = greedy_generate(
                model, self.tokenizer, ctxs, c.until, rules.max_new_tokens, stop_ids, c.triggers,
                rules.processors,
            )  # fmt: skip
            texts.update(zip(rows, outs, strict=True))

        self.sizer.run(len(todo), chunk, model_device(model), "generate_until")
        insts = []
        for i, it in enumerate(chosen):
            inst = copy.copy(it.request)
            inst.resps, inst.filtered_resps = [texts[i]], {}
            insts.append(inst)
        apply_filters(c.task, insts)  # the task's own filter pipelines
        out = []
        for it, inst in zip(chosen, insts, strict=True):
            metrics = {}
            for fname, resp in inst.filtered_resps.items():
                for m, v in c.task.process_results(it.doc, [resp]).items():
                    metrics[f"{m},{fname}"] = v
            out.append(
                ItemResult(c.name, it.doc_id, dict(inst.filtered_resps), inst.resps[0], metrics)
            )
        return out
