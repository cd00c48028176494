"""SFT data for the trainer: encode through the chat template, split, order, batch (the rows are
read by trainables/train/pairs.py).

Loss is on response tokens only (prompt tokens are labelled -100). The order of examples is a
pure function of (seed, stream, epoch, batch size), and which examples a step sees a pure
function of the step, so a resumed run sees exactly the batches an uninterrupted one would; a
batch holds distinct rows, also across an epoch boundary (`Stream`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.trainables.train.pairs import load_pairs, path_problem, read_pairs

__all__ = ["load_pairs", "path_problem", "read_pairs"]  # the readers' home: pairs.py

Encoded = tuple[list[int], list[int]]  # input ids, labels


def check_datasets(exp: TrainExperiment) -> None:
    """Read every local dataset of `exp` as training will, before any work: readable, in a
    known schema, and enough rows (`check_sizes`). A registered `source` is read when training
    starts (its rows and their count are known only then).

    Raises:
        ValueError: naming the file and line, or the dataset and its row count.
    """
    if any(spec.source is not None for spec in exp.datasets):
        for spec in exp.datasets:
            if spec.source is None:
                load_pairs(spec)
        return
    check_sizes(exp, [len(load_pairs(spec)) for spec in exp.datasets])


def check_sizes(exp: TrainExperiment, counts: list[int], after: str = "") -> int:
    """The one rule on how many rows a run needs: every dataset gives the validation share at
    least one row (when `hyper.val_share` > 0) and keeps at least one to train on, and every
    training stream holds a whole batch (`hyper.batch_size` distinct rows a step).

    Args:
        counts: the rows of each dataset of `exp`, in order.
        after: what the counts are after (e.g. "after dropping rows longer than seq_len").
    Returns:
        the validation rows taken from each dataset.
    Raises:
        ValueError naming every dataset that is too small, its row count and what it needs.
    """
    h = exp.hyper
    n_val = max(round(h.val_share * min(counts)), 1) if h.val_share > 0 else 0
    mix = exp.mode.type == "mix"  # trains on the union of its datasets; other modes on each
    least = 1 if mix else h.batch_size  # training rows each dataset must keep
    where = f" {after}" if after else ""
    problems = [
        f"datasets[{i}] ({spec.label}): {n} rows{where}: too few for the validation share "
        f"(hyper.val_share {h.val_share}: {n_val} rows) and a batch of training rows "
        f"(hyper.batch_size {h.batch_size}); give at least {n_val + least} rows"
        for i, (spec, n) in enumerate(zip(exp.datasets, counts, strict=True))
        if n - n_val < least
    ]
    if mix and not problems and sum(counts) - n_val * len(counts) < h.batch_size:
        problems.append(
            f"datasets: {sum(counts) - n_val * len(counts)} training rows{where} in all: fewer "
            f"than hyper.batch_size {h.batch_size} (after the validation share, hyper.val_share "
            f"{h.val_share}: {n_val} rows from each dataset)"
        )
    if problems:
        raise ValueError("\n  ".join(problems))
    return n_val


def encode(tok, prompt: str, response: str, seq_len: int) -> Encoded | None:
    """Token ids of the chat-formatted pair and labels with the prompt masked (-100), cut to
    `seq_len` tokens (the end of the answer turn, its end-of-turn token with it, is lost).

    Returns None when truncation to `seq_len` leaves no response token.
    """
    ids, n_head = _chat_ids(tok, prompt, response)
    return _fit(ids, n_head, seq_len)


def _chat_ids(tok, prompt: str, response: str) -> tuple[list[int], int]:
    """The whole chat-formatted pair's token ids and how many of them are the prompt turn."""
    head = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)  # fmt: skip
    full = tok.apply_chat_template(
        [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}],
        tokenize=False,
    )
    if not full.startswith(head):  # templates that rewrite the prompt turn would mis-mask
        raise ValueError("chat template: the prompt turn is not a prefix of the full chat")
    n_head = len(tok(head, add_special_tokens=False)["input_ids"])
    return tok(full, add_special_tokens=False)["input_ids"], n_head


def _fit(ids: list[int], n_head: int, seq_len: int) -> Encoded | None:
    """`ids` cut to `seq_len` with the prompt's labels masked; None when no response token is
    left (encode's rule, one place)."""
    ids = ids[:seq_len]
    if len(ids) <= n_head:
        return None
    return ids, [-100] * n_head + ids[n_head:]


def special_ids(tok) -> frozenset[int]:
    """The tokenizer's special token ids (eos, end-of-turn markers such as <|im_end|> and
    <|eot_id|>, ...): its named specials and every added token marked special."""
    named = set(tok.all_special_ids)
    added = {i for i, t in getattr(tok, "added_tokens_decoder", {}).items() if t.special}
    return frozenset(named | added)


def _answer_end(ids: list[int], n_head: int, specials: frozenset[int]) -> int:
    """Tokens needed to keep the answer and its end-of-turn token: up to the answer turn's last
    special token (Qwen2.5 puts a plain "\n" after <|im_end|>, which teaches no stop), or the
    whole chat when the answer turn has none."""
    for i in range(len(ids) - 1, n_head - 1, -1):
        if ids[i] in specials:
            return i + 1
    return len(ids)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed that is a pure function of `parts` (seed, purpose, step, ...)."""
    h = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


@dataclass
class Stream:
    """The training examples of one stream, visited in seeded per-epoch permutations.

    A batch of `batch_size` rows that crosses an epoch boundary holds distinct rows: the new
    epoch's order moves the rows the old epoch's tail already put in that batch just past it
    (each epoch still visits every row once; orders without such a clash are the plain seeded
    permutations). So an epoch's order depends on the one before, computed forward from epoch
    0 and cached: still a pure function of (seed, stream, epoch, batch_size).
    """

    examples: list[Encoded]
    seed: int
    index: int
    batch_size: int = 1
    _perms: dict[int, list[int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.examples)

    def _raw(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(derive_seed(self.seed, self.index, epoch))
        return torch.randperm(len(self.examples), generator=g).tolist()

    def _next(self, epoch: int, prev: list[int]) -> list[int]:
        """Epoch `epoch`'s order given the previous epoch's (`prev`)."""
        n, bs = len(self.examples), self.batch_size
        raw = self._raw(epoch)
        tail = (epoch * n) % bs  # rows of the previous epoch in the batch crossing into this one
        if tail == 0 or n < bs:  # no crossing batch (or too few rows to fill one distinctly)
            return raw
        taken = set(prev[n - tail :])
        head = [r for r in raw if r not in taken][: bs - tail]
        first = set(head)
        return head + [r for r in raw if r not in first]

    def perm(self, epoch: int) -> list[int]:
        """The order of the stream's rows in `epoch` (cached: the newest two epochs)."""
        if epoch not in self._perms:
            known = [e for e in self._perms if e < epoch]
            e = max(known) if known else 0
            order = self._perms[e] if known else self._raw(0)
            prev = self._perms.get(epoch - 1)
            while e < epoch:
                e, prev = e + 1, order
                order = self._next(e, order)
            self._perms = {epoch: order} if prev is None else {epoch - 1: prev, epoch: order}
        return self._perms[epoch]

    def at(self, sample: int) -> Encoded:
        """The `sample`-th example this stream ever yields (epoch = sample // len)."""
        epoch, pos = divmod(sample, len(self.examples))
        return self.examples[self.perm(epoch)[pos]]


@dataclass
class TrainData:
    streams: list[Stream]  # simultaneous: one per dataset; mix: one (the union); else one
    val: list[list[Encoded]]  # validation examples per dataset
    info: list[dict]  # per dataset: spec, n_train, n_val, n_empty, n_dropped, n_truncated


def build_data(exp: TrainExperiment, tok) -> TrainData:
    """Load, encode and split the experiment's datasets (deterministic in `hyper.seed`).

    Validation takes the same number of examples from every dataset (a `val_share` of the
    smallest), drawn by a seeded shuffle; the rest trains. Rows with a null, NaN or blank
    prompt or response are dropped (`n_empty`); rows longer than `hyper.seq_len` are cut to it
    (`n_truncated`: counted when the answer or its end-of-turn token is cut), or dropped when
    the prompt turn fills it (`n_dropped`): `seq_len_notes` says so.
    """
    h = exp.hyper
    specials = special_ids(tok)
    encoded: list[list[Encoded]] = []
    info = []
    for spec in exp.datasets:
        pairs, n_empty = read_pairs(spec)
        whole = [_chat_ids(tok, p, r) for p, r in pairs]
        enc = [_fit(ids, n_head, h.seq_len) for ids, n_head in whole]
        kept = [e for e in enc if e is not None]
        # truncated: the answer or its end-of-turn token cut (not only tokens after it)
        cut = sum(e is not None and _answer_end(ids, n_head, specials) > h.seq_len for e, (ids, n_head) in zip(enc, whole, strict=True))  # fmt: skip
        encoded.append(kept)
        info.append({"spec": spec.model_dump(mode="json"), "n_empty": n_empty, "n_dropped": len(enc) - len(kept), "n_truncated": cut})  # fmt: skip
    after = f"that fit hyper.seq_len {h.seq_len}"
    n_val = check_sizes(exp, [len(e) for e in encoded], after)
    train, val = [], []
    for i, enc in enumerate(encoded):
        g = torch.Generator().manual_seed(derive_seed(h.seed, "val", i))
        order = torch.randperm(len(enc), generator=g).tolist()
        val.append([enc[j] for j in order[:n_val]])
        train.append([enc[j] for j in sorted(order[n_val:])])
        info[i] |= {"n_train": len(train[-1]), "n_val": n_val}
    if exp.mode.type == "mix":
        streams = [Stream(train[0] + train[1], h.seed, 0, h.batch_size)]
    else:
        streams = [Stream(t, h.seed, i, h.batch_size) for i, t in enumerate(train)]
    return TrainData(streams, val, info)


def stream_step(step: int, n_streams: int, k: int) -> tuple[int, int]:
    """(stream, that stream's own step count) for global `step`: streams take turns every k steps."""
    if n_streams == 1:
        return 0, step
    cycle, rem = divmod(step, n_streams * k)
    stream = rem // k
    return stream, cycle * k + rem % k


def total_steps(exp: TrainExperiment, data: TrainData) -> int:
    """Optimizer steps of the run: `hyper.max_steps`, or `hyper.epochs` passes over all the
    training rows (simultaneous: over both streams together, so each stream, taking every
    other batch, sees (n0 + n1) / 2 rows an epoch whatever its size: `stream_passes`)."""
    h = exp.hyper
    if h.max_steps is not None:
        return h.max_steps
    n = sum(len(s) for s in data.streams)
    return max(1, -(-int(h.epochs * n) // h.batch_size))  # type: ignore[operator]


def stream_passes(exp: TrainExperiment, data: TrainData, steps: int) -> list[float]:
    """Per dataset, the passes over its training rows that `steps` global steps make.

    Simultaneous: each stream's own steps (they take turns every `k`) times the batch, over
    its rows; mix: the union's passes, the same for each dataset; else the one stream's.
    """
    bs = exp.hyper.batch_size
    if exp.mode.type == "mix":
        return [steps * bs / len(data.streams[0])] * len(data.info)
    n, k = len(data.streams), getattr(exp.mode, "k", 1)
    cycles, rem = divmod(steps, n * k)
    own = [cycles * k + min(max(rem - i * k, 0), k) for i in range(n)]
    return [o * bs / len(s) for o, s in zip(own, data.streams, strict=True)]


def passes_note(exp: TrainExperiment, data: TrainData, total: int) -> str | None:
    """One line naming each stream's size and its passes when simultaneous streams differ in
    size (`hyper.epochs` then gives them different passes: the streams alternate batch by
    batch), else None."""
    sizes = [len(s) for s in data.streams]
    if len(sizes) < 2 or len(set(sizes)) == 1:
        return None
    passes = stream_passes(exp, data, total)
    parts = ", ".join(
        f"datasets[{i}] ({exp.datasets[i].label}) {n} rows: {passes[i]:.2f} passes"
        for i, n in enumerate(sizes)
    )
    return (
        f"layerswap: simultaneous streams of unequal size alternate batch by batch over {total} "
        f"steps: {parts} (equalise them with the datasets' `limit` for equal passes)"
    )


def seq_len_notes(exp: TrainExperiment, data: TrainData) -> list[str]:
    """The dropped-rows lines, per dataset: one for rows with an empty side (a null, NaN or
    blank prompt or response), one for rows longer than `hyper.seq_len`: how many were dropped
    (the prompt turn fills seq_len: no answer token left) and how many truncated (the answer or
    its end-of-turn token cut); none for a dataset whose rows are all whole and fit."""
    lines = []
    for i, (spec, d) in enumerate(zip(exp.datasets, data.info, strict=True)):
        empty = d.get("n_empty", 0)
        rows = empty + d["n_dropped"] + d["n_train"] + d["n_val"]
        where = f"layerswap: data: datasets[{i}] ({spec.label})"
        if empty:
            lines.append(f"{where}: {empty} of {rows} rows dropped (a null, NaN or empty prompt or response)")  # fmt: skip
        if d["n_dropped"] or d["n_truncated"]:
            lines.append(
                f"{where}: {d['n_dropped']} of {rows} rows "
                f"dropped (the prompt fills hyper.seq_len {exp.hyper.seq_len}), "
                f"{d['n_truncated']} truncated (the answer turn cut, its end-of-turn token lost)"
            )
    return lines


def collate(examples: list[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask / labels (-100 on padding)."""
    width = max(len(x) for x, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (x, y) in enumerate(examples):
        ids[row, : len(x)] = torch.tensor(x)
        labels[row, : len(y)] = torch.tensor(y)
        mask[row, : len(x)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def local_batch(stream: Stream, own_step: int, batch_size: int, rank: int, world: int) -> list[Encoded]:  # fmt: skip
    """This rank's share (a contiguous slice) of the global batch number `own_step`."""
    per = batch_size // world
    start = own_step * batch_size + rank * per
    return [stream.at(start + i) for i in range(per)]
