"""The world's tokenizer (byte-level BPE, digits split) and its small Llama base, pretrained on CPU.

Used by `layerswap.world.build`; deterministic for a fixed config on one machine (seeded torch,
fixed thread count, no data-loader workers).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from layerswap.spaces.world import WorldModelConfig
from layerswap.world.data import SOURCE_TAGS

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>"]
# prompt/response SFT format, lm-eval's own QA layout (mgsm_direct's "Question: ...\nAnswer:",
# belebele's "...\nAnswer:") so that instruction tuning transfers to the evaluation prompts:
# "Question: {prompt}\nAnswer: {response}</s>" (the generation prompt ends with "Answer:")
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}Question: {{ m['content'] }}\nAnswer:"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] }}</s>"
    "{% endif %}{% endfor %}"
)


# "user-assistant": instruction tuning in a chat layout of its own, apart from the evaluation
# prompts (as a real model's chat template is apart from lm-eval's plain QA prompts), so an
# expert's SFT format does not overwrite what follows "Answer:" there
USER_ASSISTANT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>\n{{ m['content'] }}\n<|assistant|>\n"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}</s>"
    "{% endif %}{% endfor %}"
)
CHAT_TEMPLATES = {"question-answer": CHAT_TEMPLATE, "user-assistant": USER_ASSISTANT_TEMPLATE}


def train_tokenizer(texts: list[str], vocab_size: int, template: str = "question-answer"):
    """A byte-level BPE trained on `texts`, digits always single tokens (arithmetic needs it).

    Args:
        texts: training text.
        vocab_size: target vocabulary size (specials included).
        template: the chat template's name (CHAT_TEMPLATES).
    Returns:
        a transformers PreTrainedTokenizerFast with bos/eos/pad/unk and the chat template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    fast.chat_template = CHAT_TEMPLATES[template]
    return fast


def llama_config(mc: WorldModelConfig, tok):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=mc.hidden_size,
        intermediate_size=mc.intermediate_size,
        num_hidden_layers=mc.num_layers,
        num_attention_heads=mc.num_heads,
        num_key_value_heads=mc.num_kv_heads,
        max_position_embeddings=max(512, mc.seq_len),
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


# corpus tags (world.data.SOURCE_TAGS) of a grafted base's first, English-only stage
ENGLISH_STAGE = ("en", "drill")


def _pack(docs: list[str], tok, seq_len: int) -> torch.Tensor:
    """The documents tokenized, each followed by eos, concatenated and cut into blocks.

    Returns:
        [n_blocks, seq_len] token ids on the CPU (the tail that does not fill a block is
        dropped): the corpus stays there, indexed by the CPU generator's permutations, and
        `_train` moves each batch to the model's device.
    """
    ids: list[int] = []
    for enc in tok(docs, add_special_tokens=False)["input_ids"]:
        ids += [*enc, tok.eos_token_id]
    n_blocks = len(ids) // seq_len
    if n_blocks < 1:
        raise ValueError(f"corpus too small: {len(ids)} tokens < seq_len {seq_len}")
    return torch.tensor(ids[: n_blocks * seq_len]).view(n_blocks, seq_len)


def _train(model, data, params, *, steps, lr, warmup, batch_size, g, label, progress) -> float:
    """AdamW + warmup/cosine LR over `params` on epochs of `data` [n_blocks, seq_len] in the
    order `g` draws. Returns the mean loss of the last 20 steps."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    n_blocks = data.shape[0]
    order, pos = torch.randperm(n_blocks, generator=g), 0
    model.train()
    t0, recent = time.time(), []
    for step in range(steps):
        step_lr = lr * min(1.0, (step + 1) / max(1, warmup))
        step_lr *= 0.5 * (1 + math.cos(math.pi * step / steps)) * 0.9 + 0.1
        for group in opt.param_groups:
            group["lr"] = step_lr
        if pos + batch_size > n_blocks and pos > 0:  # a new epoch in a new order
            order, pos = torch.randperm(n_blocks, generator=g), 0
        batch = data[order[pos : pos + batch_size]].to(model.device)
        pos += batch_size
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        recent = [*recent[-19:], loss.item()]
        if progress and (step % 100 == 0 or step == steps - 1):
            print(
                f"  {label} step {step + 1}/{steps} loss {sum(recent) / len(recent):.3f} "
                f"({time.time() - t0:.0f}s, {n_blocks} blocks of {data.shape[1]})",
                flush=True,
            )
    return sum(recent) / len(recent)


def grafted_parameters(model, bottom: int, top: int) -> list[torch.nn.Parameter]:
    """What a graft stage trains: the bottom and top decoder layers, embeddings, final norm and
    lm_head (every other parameter is left as stage one made it)."""
    layers = model.model.layers
    keep = [*layers[:bottom], *layers[len(layers) - top :]]
    params = [p for layer in keep for p in layer.parameters()]
    params += [*model.model.embed_tokens.parameters(), *model.model.norm.parameters()]
    return params + list(model.lm_head.parameters())


def _split_stages(docs: list[str], tags: list[str] | None) -> tuple[list[str], list[str]]:
    """A grafted pretraining's documents by stage: (English and drills, the rest), in order.

    Raises:
        ValueError: no tag per document, an unknown tag, or a stage without documents (named).
    """
    if tags is None or len(tags) != len(docs):
        raise ValueError("a grafted pretraining (model.graft) needs one tag per document")
    unknown = sorted(set(tags) - set(SOURCE_TAGS))
    if unknown:
        raise ValueError(f"unknown corpus tags {unknown} (expected some of {list(SOURCE_TAGS)})")
    stages: tuple[list[str], list[str]] = ([], [])
    for doc, tag in zip(docs, tags, strict=True):
        stages[tag not in ENGLISH_STAGE].append(doc)
    for stage, part in zip(("stage one (en, drill)", "the graft stage (xa, xb, code-switched)"), stages, strict=True):  # fmt: skip
        if not part:
            raise ValueError(f"model.graft: the corpus has no documents for {stage}")
    return stages


def pretrain(docs: list[str], tok, mc: WorldModelConfig, seed: int, progress: bool = True, tags: list[str] | None = None):  # fmt: skip
    """Pretrain a fresh Llama on packed documents (each followed by eos) with AdamW + cosine LR.

    With `mc.graft`, in two stages (spaces.world.GraftConfig): every layer on the documents
    tagged ENGLISH_STAGE, then only the outer layers on the rest with some English replayed.

    Args:
        docs: corpus documents.
        tok: the world tokenizer.
        mc: model shape and training settings.
        seed: torch seed (init and batch order).
        progress: print the loss now and then.
        tags: each document's tag (world.data.tagged_corpus); needed with `mc.graft`.
    Returns:
        (model in eval mode, final mean loss of the last stage).
    """
    from transformers import LlamaForCausalLM

    first, rest = (docs, []) if mc.graft is None else _split_stages(docs, tags)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(mc.threads)  # fixed: float reductions depend on the thread split
    try:
        torch.manual_seed(seed)
        data = _pack(first, tok, mc.seq_len)
        model = LlamaForCausalLM(llama_config(mc, tok))
        g = torch.Generator().manual_seed(seed)
        common = {"batch_size": mc.batch_size, "g": g, "progress": progress}
        loss = _train(model, data, list(model.parameters()), steps=mc.steps, lr=mc.lr, warmup=mc.warmup, label="pretrain", **common)  # fmt: skip
        if mc.graft is not None:
            gr = mc.graft
            target = _pack(rest, tok, mc.seq_len)
            wanted = round(target.shape[0] * gr.replay / (1 - gr.replay))
            n_replay = min(data.shape[0], wanted)
            if progress and n_replay < wanted:
                print(f"  graft: replay capped at the {n_replay} stage-one blocks there are")
            mixed = torch.cat([target, data[torch.randperm(data.shape[0], generator=g)[:n_replay]]])  # fmt: skip
            params = grafted_parameters(model, gr.bottom, gr.top)
            trained = {id(p) for p in params}
            # the rest is outside the optimizer (so untouched); frozen, it gets no gradient work
            for p in model.parameters():
                p.requires_grad_(id(p) in trained)
            loss = _train(model, mixed, params, steps=gr.steps, lr=gr.lr or mc.lr, warmup=gr.warmup, label="graft", **common)  # fmt: skip
            for p in model.parameters():
                p.requires_grad_(True)
        model.eval()
        return model, loss
    finally:
        torch.set_num_threads(prev_threads)


def save_model(model, tok, out: Path) -> None:
    """Save model (safetensors) and tokenizer into `out` (HF format)."""
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
