"""Which SFT data would move a world's xa MGSM reading, and in which blocks? Seconds, no SFT.

Run `.venv/bin/python benchmarks/world_align.py --world runs/world [DATA.jsonl ...]`
(smoke run, tests/benchmarks/test_world_align.py: `--world TINY_WORLD --examples 4 --by-kind F`).

At the world's base, the gradient of the loss of *reading* xa word problems (fresh problems made
by the world's generator, rendered in xa; the response is the left side of the right equation,
"a + b", so the loss is about reading numbers and operations, not computing) is compared, block
by block (each decoder layer; "emb/head" for embeddings, final norm and lm_head), with the
gradient of the SFT loss of each data source: the world's math_en and lang_xa, lang_xa split by
task kind (`--by-kind`), and any JSONL given (Orca or Aya schema). A positive cosine in a block
means a small SGD step on that data lowers the xa reading loss through that block, to first
order; the language data of layer swapping should do that in the outer blocks. Reference rows:
reading the same problems in English, and xa reading on other problems (the ceiling). A screen
for designing the world (issue 15), not a prediction of what SFT with Adam over hundreds of
steps does, and not a test.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

Grad = dict[str, torch.Tensor]  # block name -> flat gradient of its parameters


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=Path, required=True, help="a built world folder")
    p.add_argument("data", type=Path, nargs="*", help="more SFT JSONL files to compare")
    p.add_argument("--by-kind", action="store_true", help="also lang_xa split by task kind")
    p.add_argument("--examples", type=int, default=256, help="rows per gradient (default 256)")
    p.add_argument("--seed", type=int, default=0, help="which rows and problems (default 0)")
    args = p.parse_args(argv)
    if args.examples < 1:
        p.error(f"--examples {args.examples}: give at least 1")
    if not (args.world / "world.json").is_file():
        p.error(
            f"--world {args.world}: no world.json there (build one with `layerswap world build`)"
        )
    for path in args.data:
        if not path.is_file():
            p.error(f"{path}: no such file")
    if len({str(path) for path in args.data}) < len(args.data):
        p.error("a data file is named twice")
    return args


def block_gradients(model, tok, examples: Sequence[tuple[str, str]], batch_size: int = 32) -> Grad:
    """The gradient of the mean token loss over all `examples`' responses, flattened per block.

    The loss is world.sft's (response tokens only), averaged over every response token of every
    example at once, so the result does not depend on `batch_size` (sft() averages per batch).

    Args:
        model: a causal LM (its gradients are overwritten).
        tok: its tokenizer, with the world's chat template and a pad token.
        examples: (prompt, response) pairs.
    Returns:
        {block: gradient}, blocks "L00".. for decoder layers and "emb/head" for the rest.
    """
    from layerswap.trainables.merge.arch import layer_index
    from layerswap.world.sft import collate, encode_pair

    model.zero_grad(set_to_none=True)
    enc = [encode_pair(tok, p, r) for p, r in examples]
    n_tokens = sum(sum(label != -100 for label in y[1:]) for _, y in enc)  # predicted tokens
    device = next(model.parameters()).device
    for start in range(0, len(enc), batch_size):
        ids, labels, mask = collate(tok, enc[start : start + batch_size], device)
        logits = model(input_ids=ids, attention_mask=mask).logits  # [b, t, V]
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), reduction="sum"
        )  # ignore_index -100: prompt and padding
        (loss / n_tokens).backward()
    blocks: dict[str, list[torch.Tensor]] = {}
    for key, param in model.named_parameters():
        i = layer_index(key)
        name = f"L{i:02d}" if i is not None else "emb/head"
        grad = param.grad if param.grad is not None else torch.zeros_like(param)  # an unused weight
        blocks.setdefault(name, []).append(grad.flatten())
    return {name: torch.cat(parts).cpu() for name, parts in sorted(blocks.items())}


def cosines(a: Grad, b: Grad) -> dict[str, float]:
    """Per-block cosine similarity of two block gradients."""
    return {k: float(torch.nn.functional.cosine_similarity(a[k], b[k], dim=0)) for k in a}


def reading_examples(cfg, lang: str, n: int, seed: int) -> list[tuple[str, str]]:
    """`n` fresh word problems of a world's generator (its WorldConfig `cfg`) in `lang` ("xa" or
    "en"), each with the left side of its equation as the response."""
    from layerswap.world.data import world_languages
    from layerswap.world.items import make_problem

    language = world_languages(cfg)[lang]
    rng = random.Random(f"world-align-{seed}")
    problems = [make_problem(rng, cfg.max_operand, cfg.verb_only_operations) for _ in range(n)]
    return [(p.text(language), p.equation.split(" = ")[0]) for p in problems]


def sources(world: Path, cfg, extra: Sequence[Path], by_kind: bool, n: int, seed: int) -> dict[str, list]:  # fmt: skip
    """{name: (prompt, response) pairs}: the world's (WorldConfig `cfg`) math_en, lang_xa (and its
    kinds), and `extra` files; `n` rows each, drawn at random by `seed` and the source's name (so
    not by which other sources are drawn).

    Raises:
        ValueError: an `extra` file has no rows.
    """
    from layerswap.world.data import AYA_KINDS
    from layerswap.world.sft import pairs, read_rows

    lang = read_rows(world, "data/sft/lang_xa.jsonl")
    out = {"math_en": read_rows(world, "data/sft/math_en.jsonl"), "lang_xa": lang}
    if by_kind:
        kinds = list(AYA_KINDS)
        if cfg.count_questions:  # those worlds put count questions where plural rows would be
            kinds[AYA_KINDS.index("plural")] = "count question"
        for kind in dict.fromkeys(kinds):  # the two multiple-choice kinds are one task
            out[f"lang_xa: {kind}"] = [r for i, r in enumerate(lang) if kinds[i % len(kinds)] == kind]  # fmt: skip
    for path in extra:
        rows = read_rows(path.parent, path.name)
        if not rows:
            raise ValueError(f"{path}: no rows")
        out[str(path)] = rows
    picked = {}
    for name, rows in out.items():
        rng = random.Random(f"world-align-rows-{seed}-{name}")
        if rows:
            picked[name] = pairs(rng.sample(rows, min(n, len(rows))))
    return picked


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from layerswap.world.build import world_config_of
    from layerswap.world.sft import load_base

    cfg = world_config_of(args.world)
    model, tok = load_base(args.world)
    model.eval()  # no dropout: the gradients are deterministic
    n = args.examples
    target = block_gradients(model, tok, reading_examples(cfg, "xa", n, args.seed))
    rows = {
        "[en reading]": reading_examples(cfg, "en", n, args.seed),
        "[xa reading, other problems]": reading_examples(cfg, "xa", n, args.seed + 1),
        **sources(args.world, cfg, args.data, args.by_kind, n, args.seed),
    }
    blocks = list(target)
    width = max(len(name) for name in rows)
    print(f"cosine with the xa reading gradient at the base ({n} examples each), per block")
    print(f"{'':<{width}}  " + " ".join(f"{b[-5:]:>5}" for b in blocks))
    for name, examples in rows.items():
        c = cosines(target, block_gradients(model, tok, examples))
        print(f"{name:<{width}}  " + " ".join(f"{c[b]:+.2f}" for b in blocks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
