"""Does a world show layer swapping's phenomenon? Two short SFTs, merges in memory, xa MGSM.

Run `.venv/bin/python benchmarks/world_probe.py --world runs/world` (an existing world), or
`... --config VARIANT.yaml --seed 0 --out runs/world-v` (builds that variant of the full world
first, `layerswap world build --config`). ~12 min on one of 2 CPU cores for v4 (--select; 10
min with --experts; --attribution ~10 min more); add `--device cuda` on a GPU. Options:
--math-lr/--math-steps/--lang-lr/--lang-steps (the experts, trained by world.sft, the world's
own plain-torch SFT, not the Ray trainer; --lang-layers trains only those layers of the
language expert; --lang-data trains it on another JSONL), --split dev|test, --non-layer (whose
embeddings, final norm and lm_head the swaps take), --json OUT (every item's correctness, for
re-analysis), --per-layer (where the math expert's gain lives: one layer at a
time reverted to the base or taken from the language expert; ~2 min more), --attribution (the
base plus one expert's ΔW in one block only, per block: each gain to first order), --select
(the best swap by the search's proxies, and how well the proxy, each indicator and, for
reference, the target's own dev split rank the merges).

Prints, for the base, both experts, the paper's default swap scaled to depth, every layer swap
(b in 1..5, u in 0..2; and b in 2..4, u in 0..2 with transition zones of 1 or 2 layers), the
uniform soup, task arithmetic and TIES: xa MGSM accuracy and the
difference to the better expert with a paired bootstrap 95 % CI (resampling items); English
MGSM and xa Belebele for the base, the experts and the paper default, and what their wrong
answers are (slip: the right equation computed wrong; misread: another equation; no equation)
and what their misreads got wrong against the true equation (other operands, other operations,
both, or the same ones arranged otherwise),
and for every model how often it reads an xa problem into the right equation and how often it
computes that equation right, which tells a reading gain from an arithmetic one. A measurement for
designing the world (issue 15), not a test. Smoke run (tests/benchmarks/test_world_probe.py,
~30 s): `--world TINY_WORLD --math-steps 2 --lang-steps 2 --resamples 50 --select --attribution
--per-layer --json out/probe.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from world_probe_blocks import attribution, per_layer  # noqa: E402
from world_probe_select import indicator_spearman, proxy_pick  # noqa: E402

from layerswap.spaces.search_experiment import world_readings  # noqa: E402  (pydantic only: no torch)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=Path, help="an existing world folder")
    p.add_argument("--config", type=Path, help="a world variant YAML to build (with --out)")
    p.add_argument("--out", type=Path, help="where to build the variant")
    p.add_argument("--seed", type=int, default=0, help="world seed when building (default 0)")
    p.add_argument("--math-lr", type=float, default=1e-4)
    p.add_argument("--math-steps", type=int, default=300)
    p.add_argument("--lang-lr", type=float, default=1e-4)
    p.add_argument("--lang-steps", type=int, default=300)
    p.add_argument(
        "--lang-layers",
        type=int,
        nargs="+",
        help="train only these layers of the language expert (e.g. 0 1; embeddings, final norm "
        "and lm_head stay the base's): a partial SFT kept to where reading lives",
    )
    p.add_argument(
        "--lang-data",
        type=Path,
        help="train the language expert on this JSONL (Aya schema: inputs, targets) instead of the "
        "world's data/sft/lang_xa.jsonl, e.g. a subset of its task kinds",
    )
    p.add_argument("--sft-seed", type=int, default=0)
    p.add_argument(
        "--experts",
        type=Path,
        nargs=2,
        metavar=("MATH", "LANGUAGE"),
        help="take the two experts from these checkpoint folders (e.g. the demo's, RUN/train/"
        "<name>/samples_N) instead of training them here; --math-*/--lang-*/--sft-seed then "
        "do nothing",
    )
    p.add_argument(
        "--non-layer",
        choices=["average", "language", "task"],
        default="average",
        help="whose embeddings, final norm and lm_head the layer swaps take (default average)",
    )
    p.add_argument("--split", choices=["dev", "test"], default="dev")
    p.add_argument("--device", default="cpu")
    p.add_argument("--resamples", type=int, default=2000)
    p.add_argument("--json", type=Path, help="write per-item results here")
    p.add_argument(
        "--select",
        action="store_true",
        help="also: score every merge on the search's default world proxies (spaces."
        "search_experiment.world_proxies, combined by search.trial.combine; scored here by "
        "layerswap.world.sft, not lm-eval) and on each reading of PROXY_TASKS alone, "
        "report the best swap of the probe's grid by that proxy (the search's own space may be "
        "narrower) and the Spearman correlation of proxy and xa MGSM over all merges; with "
        "--split test also xa MGSM dev's, the target's own dev split, as a reference for what "
        "a dev measure can rank (~2 min)",
    )
    p.add_argument(
        "--attribution",
        action="store_true",
        help="also: xa and English MGSM and xa Belebele dev Brier of the base plus one expert's ΔW "
        "in one block only, per block and expert (where each expert's gain lives, to first "
        "order; a few minutes more)",
    )
    p.add_argument(
        "--per-layer",
        action="store_true",
        help="also: each expert's relative ΔW per layer, and MGSM of the math expert with one "
        "layer (or the non-layer weights) from the base, or from the language expert",
    )
    args = p.parse_args(argv)
    if (args.world is None) == (args.config is None):
        p.error("give exactly one of --world DIR and --config YAML (with --out DIR)")
    if args.config is not None and args.out is None:
        p.error("--config needs --out DIR")
    if args.lang_data is not None and not args.lang_data.is_file():
        p.error(f"--lang-data {args.lang_data}: no such file")
    for d in args.experts or ():
        if not (d / "config.json").is_file():
            p.error(f"--experts {d}: not a checkpoint folder (no config.json)")
    return args


def world_dir(args) -> Path:
    if args.world is not None:
        return args.world
    from layerswap.spaces.world import load_variant
    from layerswap.world import build_world

    config = load_variant(args.config, "full", args.seed)
    return build_world(args.out, seed=args.seed, size="full", config=config)


def train_experts(world: Path, args) -> tuple[dict, object, object]:
    """{"base", "math", "language": state dict} by world.sft; plus a model and tokenizer."""
    from layerswap.trainables.merge.arch import layer_index
    from layerswap.world.sft import load_base, pairs, read_rows, sft

    states = {}
    if args.experts is not None:
        from layerswap.trainables.merge.live import load_expert

        model, tok = load_base(world)
        states["base"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for name, d in zip(("math", "language"), args.experts, strict=True):
            states[name] = load_expert(str(d), lambda: states["base"])  # LoRA folded into base
            print(f"{name} expert from {d}")
        model.to(args.device)
        return states, model, tok
    lang_data = args.lang_data or world / "data/sft/lang_xa.jsonl"
    runs = {"base": None, "math": (world / "data/sft/math_en.jsonl", args.math_lr, args.math_steps)}
    runs["language"] = (lang_data, args.lang_lr, args.lang_steps)
    for name, run in runs.items():
        model, tok = load_base(world)
        model.to(args.device)
        if run is not None:
            data, lr, steps = run
            if name == "language" and args.lang_layers is not None:
                # frozen parameters get no gradient, so AdamW leaves them exactly as they were
                for key, param in model.named_parameters():
                    param.requires_grad_(layer_index(key) in args.lang_layers)
            losses = sft(model, tok, pairs(read_rows(data.parent, data.name)), steps, lr, seed=args.sft_seed)  # fmt: skip
            print(f"{name} expert on {data.name}: lr {lr:g}, {steps} steps, final loss {np.mean(losses[-20:]):.3f}")  # fmt: skip
        states[name] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return states, model, tok


def recipes(depth: int, non_layer: str = "average") -> dict[str, dict]:
    """Name -> recipe mapping: the paper default, a grid of swaps, and the non-layer methods."""
    from layerswap.spaces.zones import paper_default

    pair = {"task_expert": "math", "language_expert": "language", "non_layer": non_layer}
    pd = paper_default(depth)
    out = {
        f"paper default (b{pd.bottom} u{pd.top})": {
            "method": "layer_swap",
            **pair,
            "bottom": pd.bottom,
            "top": pd.top,
        },
        "uniform soup": {"method": "soup", "models": ["math", "language"]},
        "task arithmetic": {
            "method": "task_arithmetic",
            "base": "base",
            "models": ["math", "language"],
        },
        "ties": {"method": "ties", "base": "base", "models": ["math", "language"]},
    }
    for b in range(1, 6):
        for u in range(3):
            if b + u < depth and (b, u) != (pd.bottom, pd.top):  # the default is listed once
                out[f"swap b{b} u{u}"] = {"method": "layer_swap", **pair, "bottom": b, "top": u}
    # the demo's search space also blends: transition zones of 1 and 2 layers averaging both
    # experts (uniform weights), around its swaps (b 2..4, u 0..2 at depth 24)
    for b in range(2, 5):
        for u in range(3):
            for t in (1, 2):
                if b + u + 2 * t < depth:
                    out[f"swap b{b} u{u} t{t}"] = {
                        "method": "layer_swap",
                        **pair,
                        "bottom": b,
                        "top": u,
                        "bottom_transition": t,
                        "top_transition": t,
                    }
    return out


def reads_computes(outcomes: list[str]) -> tuple[float, float]:
    """Reading and arithmetic apart, so a merge's gain can be told as one or the other.

    Args:
        outcomes: world.sft.answer_outcome per item.
    Returns:
        (share of answers with the right equation, share of those computed right; NaN if none).
        Uninformative in a `direct_answers` world, whose answers have no equation.
    """
    eq = sum(o in ("right", "slip") for o in outcomes)
    return eq / max(1, len(outcomes)), outcomes.count("right") / eq if eq else float("nan")


# what score_model scores, as the search would: every world reading (spaces.search_experiment.
# world_readings, which holds their scales; the default proxies are among them), in its order:
# xa Belebele accuracy, its Brier score, English MGSM dev
PROXY_TASKS = tuple(world_readings("xa"))


def score_model(model, tok, data: dict, full: bool, select: bool, split: str) -> tuple[np.ndarray, dict, dict]:  # fmt: skip
    """Score one model: xa MGSM per item on the probe's split, its side columns and its proxies.

    Args:
        model, tok: the model (its state loaded) and tokenizer.
        data: rows by name: "xa" and "en" (MGSM, probe's split), "en_dev", "xa_dev", "bele" (xa dev);
            "equations": the split's true equations, in the rows' order.
        full: also English MGSM, xa Belebele and the wrong-answer classes (experts, paper default).
        select: also every reading of PROXY_TASKS (the search's default proxies among them),
            each scored once (reusing what `full` scored).
        split: the probe's split ("dev": its English MGSM is the proxy's).
    Returns:
        (per-item correctness, {column: value}, {proxy task: score}).
    """
    from layerswap.world.sft import (
        MISREADS,
        OUTCOMES,
        belebele_accuracy_of,
        belebele_brier,
        belebele_gold_prob,
        belebele_option_logps,
        classify,
        mgsm_answers,
        mgsm_outcomes,
        misread_kind,
    )

    answers = {lang: mgsm_answers(model, tok, data[lang], max_new_tokens=20) for lang in (("xa", "en") if full else ("xa",))}  # fmt: skip
    found = {lang: classify(texts, data[lang]) for lang, texts in answers.items()}
    outcomes, en = found["xa"], found.get("en")
    extra = dict(zip(("xa reads", "computes"), reads_computes(outcomes), strict=True))
    if full or select:
        logps = belebele_option_logps(model, tok, data["bele"])
        bele = belebele_accuracy_of(logps, data["bele"])
        brier = belebele_brier(logps, data["bele"])
        # the gold option's mean probability: Brier's plainer relative, for comparison
        extra["xa Belebele p(gold)"] = belebele_gold_prob(logps, data["bele"])
    else:
        bele = brier = None
    if full:
        extra["en MGSM"] = en.count("right") / max(1, len(en))
        extra["xa Belebele"] = bele
        # what the wrong answers are: a gap made of misreads is reading, of slips arithmetic
        for lang in ("xa", "en"):
            extra[f"{lang} wrong"] = "/".join(str(found[lang].count(o)) for o in OUTCOMES[1:])
            # and what the misreads got wrong: the numbers (copying) or the operations (words)
            kinds = [misread_kind(t, eq) for t, eq in zip(answers[lang], data["equations"], strict=True)]  # fmt: skip
            extra[f"{lang} misreads"] = "/".join(str(kinds.count(k)) for k in MISREADS)
    proxy = {}
    if select:
        en_dev = en if full and split == "dev" else mgsm_outcomes(model, tok, data["en_dev"], max_new_tokens=20)  # fmt: skip
        proxy = dict(zip(PROXY_TASKS, (bele, brier, en_dev.count("right") / max(1, len(en_dev))), strict=True))  # fmt: skip
        if split == "test":
            # A reference, not a proxy: the target's own dev split (100 items), what any dev
            # measure of the target itself would rank the merges by, noise included.
            xa_dev = mgsm_outcomes(model, tok, data["xa_dev"], max_new_tokens=20)
            extra["xa MGSM dev"] = xa_dev.count("right") / max(1, len(xa_dev))
    return np.array([o == "right" for o in outcomes]), extra, proxy


def true_equations(world: Path, split: str, en_rows: list[dict]) -> list[str]:
    """The true equation of each MGSM item of `split`, which MGSM's dev and test rows do not carry
    (every language's rows are the same problems in the same order).

    Args:
        world: a built world.
        split: "dev" or "test".
        en_rows: its English rows of that split, to check the problems against.
    Returns:
        One equation per row ("5 - 2 = 3").
    Raises:
        ValueError: the rows are not the problems this code draws for the world's config (a world
            built by other generator code), which would make every misread kind wrong.
    """
    from layerswap.world.build import world_config_of
    from layerswap.world.data import mgsm_problems

    problems = mgsm_problems(world_config_of(world))[split]
    if [p.text(None) for p in problems] != [r["question"] for r in en_rows]:
        raise ValueError(f"{world}: data/mgsm/en/{split}.jsonl is not the MGSM this code draws for its config; rebuild the world")  # fmt: skip
    return [p.equation for p in problems]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from layerswap.analysis.paired import paired_diff
    from layerswap.search.trial import combine
    from layerswap.spaces.recipe import parse_recipe
    from layerswap.spaces.search_experiment import world_proxies
    from layerswap.trainables.merge.compose import compose_recipe
    from layerswap.world.sft import MISREADS, OUTCOMES, mgsm_correct, read_rows

    t0 = time.time()
    world = world_dir(args)
    data = {lang: read_rows(world, f"data/mgsm/{lang}/{args.split}.jsonl") for lang in ("xa", "en")}
    data["en_dev"] = read_rows(world, "data/mgsm/en/dev.jsonl")
    data["xa_dev"] = read_rows(world, "data/mgsm/xa/dev.jsonl")
    data["bele"] = read_rows(world, "data/belebele/xa/dev.jsonl")
    data["equations"] = true_equations(world, args.split, data["en"])  # before minutes of SFT
    states, model, tok = train_experts(world, args)
    depth = model.config.num_hidden_layers
    xa, en = data["xa"], data["en"]
    proxies = world_proxies("xa")  # the search's defaults, scored here by world.sft
    if not {p.task for p in proxies} <= set(PROXY_TASKS):
        raise ValueError(f"the search's world proxies are {[p.task for p in proxies]}; score_model scores {PROXY_TASKS}")  # fmt: skip
    models = dict(states)
    for name, rec in recipes(depth, args.non_layer).items():
        models[name] = compose_recipe(parse_recipe(rec), states, depth)
    rows, items, proxy, raw_proxy = [], {}, {}, {}
    for name, state in models.items():
        model.load_state_dict(state)
        full = name in ("base", "math", "language") or name.startswith("paper default")
        merge = name not in ("base", "math", "language")
        # The base and experts' proxies too: where each indicator's range lies (raw_proxy)
        items[name], extra, scores = score_model(model, tok, data, full, args.select, args.split)  # fmt: skip
        if scores:
            raw_proxy[name] = scores
            if merge:
                proxy[name] = combine(proxies, scores)[0]
        rows.append((name, extra))
    better = max(("math", "language"), key=lambda n: items[n].mean())
    print(f"\nxa MGSM {args.split} ({len(xa)} items); diff to the better expert ({better}), 95 % CI")  # fmt: skip
    table = []
    for name, extra in rows:
        d, lo, hi = paired_diff(items[name], items[better], args.resamples, seed=0)
        side = "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in extra.items())  # fmt: skip
        strict = {k: None if isinstance(v, float) and np.isnan(v) else v for k, v in extra.items()}  # fmt: skip
        table.append({"name": name, "xa_mgsm": float(items[name].mean()), "diff": d, "ci": [lo, hi], **strict})  # fmt: skip
        print(f"  {name:<24} {items[name].mean():.3f}  {d:+.3f} [{lo:+.3f}, {hi:+.3f}]  {side}")
    print(f"(xa/en wrong: {'/'.join(OUTCOMES[1:])} counts, world.sft.answer_outcome; misreads: {'/'.join(MISREADS)}, world.sft.misread_kind)")  # fmt: skip

    def score(state) -> tuple[float, float]:
        model.load_state_dict(state)
        return tuple(float(np.mean(mgsm_correct(model, tok, r, max_new_tokens=20))) for r in (xa, en))  # fmt: skip

    picked = proxy_pick(proxy, items, better, args.resamples) if args.select else None
    if picked:
        # Each reading on its proxy scale (chance 0, best 1), so a good indicator's rho is positive.
        scale = world_readings("xa")
        readings = {t: {n: scale[t].normalise(raw_proxy[n][t]) for n in proxy} for t in PROXY_TASKS}  # fmt: skip
        side = {c: {n: e[c] for n, e in rows if n in proxy and c in e} for c in ("xa Belebele p(gold)", "xa MGSM dev")}  # fmt: skip
        picked["per_indicator"] = indicator_spearman({**readings, **{c: v for c, v in side.items() if v}}, items, args.resamples)  # fmt: skip

    def read(state) -> float:
        from layerswap.world.sft import belebele_brier, belebele_option_logps

        model.load_state_dict(state)
        return belebele_brier(belebele_option_logps(model, tok, data["bele"]), data["bele"])

    blocks = attribution(states, depth, score, read) if args.attribution else None
    if args.per_layer:
        per_layer(states, depth, score)
    print(f"({time.time() - t0:.0f}s)")
    if args.json:
        raw = {"args": {k: str(v) for k, v in vars(args).items()}, "table": table}
        raw["items"] = {n: v.astype(int).tolist() for n, v in items.items()}
        raw["select"] = picked
        raw["attribution"] = blocks
        raw["proxy_scores"] = raw_proxy  # per merge (and base, experts): each proxy task's score
        args.json.parent.mkdir(parents=True, exist_ok=True)  # after minutes of work: not lost
        args.json.write_text(json.dumps(raw, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
