"""Tiny Llama checkpoints the project generates itself: a base and two perturbed "experts".

Stand-in for real experts until the embedded world exists; used by `layerswap demo` and tests.
"""

from __future__ import annotations

from pathlib import Path

import torch

TEXT = [
    "the math expert solves word problems step by step",
    "the language expert speaks the target language well",
    "layer swapping takes the top and bottom layers from the language expert",
    "and the middle layers from the math expert",
    "1 2 3 4 5 6 7 8 9 10 plus minus times equals",
]


def tiny_tokenizer(vocab_size: int = 96):
    """A byte-level BPE tokenizer trained on a few sentences (offline, deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXT, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def tiny_config(num_layers: int = 8, vocab_size: int = 320, tie: bool = False, **overrides):
    from transformers import LlamaConfig

    kw = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
    )
    kw.update(overrides)
    return LlamaConfig(**kw)


def perturbed(state: dict[str, torch.Tensor], scale: float, seed: int) -> dict[str, torch.Tensor]:
    """A copy of `state` with seeded Gaussian noise added: a stand-in for fine-tuning."""
    g = torch.Generator().manual_seed(seed)
    return {
        k: (v.float() + scale * torch.randn(v.shape, generator=g)).to(v.dtype)
        for k, v in state.items()
    }


def make_tiny_family(
    out: Path,
    *,
    num_layers: int = 8,
    dtype: torch.dtype = torch.float32,
    tie: bool = False,
    seed: int = 0,
    max_shard_size: str | None = None,
    with_tokenizer: bool = True,
) -> dict[str, Path]:
    """Write `base`, `task` and `language` tiny Llama checkpoints (safetensors) under `out`.

    Args:
        out: parent folder.
        num_layers, dtype, tie: shape of the family.
        seed: makes the weights reproducible.
        max_shard_size: e.g. "20KB" to force sharded checkpoints.
    Returns:
        {"base": path, "task": path, "language": path}.
    """
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    tok = tiny_tokenizer() if with_tokenizer else None
    config = tiny_config(num_layers, vocab_size=len(tok) if tok else 320, tie=tie)
    model = LlamaForCausalLM(config).to(dtype)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    paths = {}
    for i, name in enumerate(("base", "task", "language")):
        state = base if name == "base" else perturbed(base, 0.02 * i, seed * 10 + i)
        model.load_state_dict(state)
        path = Path(out) / name
        kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
        model.save_pretrained(path, **kwargs)
        if tok is not None:
            tok.save_pretrained(path)
        paths[name] = path
    return paths
