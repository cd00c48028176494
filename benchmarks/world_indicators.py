"""Expert-level merging indicators on the embedded world: which expert score predicts merge quality?

Run `.venv/bin/python benchmarks/world_indicators.py --world W --registry SWEEP/experts/registry.parquet
--math MATH --lang LANG [--json OUT]` after an expert sweep (`layerswap train SWEEP.yaml`, every
checkpoint scored on its indicators into the registry). Each expert of the registry is merged by
the paper's default swap (scaled to depth) with a fixed partner of the other kind (--math, --lang:
e.g. the demo's experts), the merge scored on xa MGSM (--split, default test) with world.sft's
greedy answers; then, per kind, the Spearman correlation (bootstrap 95 % CI over experts) of
every indicator column the registry holds (ind__*) with the merge's score. The follow-up paper
found target-language Belebele (language experts) and English MGSM (math experts) predict merge
quality better than the expert's own target-language MGSM. ~10 s per expert on one CPU core.
A measurement for issue 15, not a test. Exit 2 naming a registry that is missing, not one, or
has no expert to merge. Smoke run: tests/benchmarks/test_world_indicators.py (tiny world).
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

TARGET = "xa"  # the language whose MGSM the merges are scored on


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=Path, required=True, help="the world the experts come from")
    p.add_argument("--registry", type=Path, nargs="+", required=True, help="registry.parquet files")
    p.add_argument("--math", type=Path, required=True, help="the math expert language experts are merged with")  # fmt: skip
    p.add_argument("--lang", type=Path, required=True, help="the language expert math experts are merged with")  # fmt: skip
    p.add_argument("--split", default="test", choices=["dev", "test"], help="xa MGSM split scored")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, help="write every expert's row and the correlations here")
    args = p.parse_args(argv)
    for flag in ("world", "math", "lang"):
        if not getattr(args, flag).is_dir():
            p.error(f"--{flag} {getattr(args, flag)}: not a folder")
    return args


def registry_experts(paths: list[Path]) -> list[dict]:
    """The experts of the registries (search.registry's schema, validated): math experts and
    the language experts of TARGET, one row per checkpoint.

    Raises:
        ValueError: a file is missing or not a registry (naming it), or it holds no such expert.
    """
    from layerswap.experts.registry import read_registry

    rows = []
    for p in paths:
        mine = [r for r in read_registry(p).to_pylist() if r["kind"] == "math" or r["language"] == TARGET]  # fmt: skip
        if not mine:
            raise ValueError(f"{p}: no math or {TARGET} language expert in this registry")
        rows += mine
    return rows


def correlations(rows: list[dict], resamples: int) -> list[dict]:
    """Per kind and indicator: Spearman of the indicator with the merge's score, 95 % CI."""
    from layerswap.analysis.stats import correlate
    from layerswap.spaces.sweep import EXPERT_KINDS

    out = []
    for kind in EXPERT_KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        for col in sorted({c for r in mine for c in r if c.startswith("ind__")}):
            x = [r.get(col, float("nan")) for r in mine]
            y = [r["merge_score"] for r in mine]
            rho = next(c for c in correlate(x, y, n_resamples=resamples) if c.method == "spearman")
            out.append({"kind": kind, "indicator": col.removeprefix("ind__"), "n": rho.n, "spearman": [rho.estimate, rho.low, rho.high]})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from layerswap.spaces.recipe import parse_recipe
    from layerswap.spaces.zones import paper_default
    from layerswap.trainables.merge.compose import compose_recipe
    from layerswap.trainables.merge.live import load_expert
    from layerswap.world.sft import load_base, mgsm_correct, read_rows

    t0 = time.time()
    try:
        experts = registry_experts(args.registry)
    except ValueError as e:  # a file named, not a traceback
        print(f"world_indicators: {e}", file=sys.stderr)
        return 2
    xa = read_rows(args.world, f"data/mgsm/xa/{args.split}.jsonl")
    model, tok = load_base(args.world)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.to(args.device)
    depth = model.config.num_hidden_layers
    pd_ = paper_default(depth)
    pair = {"method": "layer_swap", "task_expert": "math", "language_expert": "language"}
    recipe = parse_recipe({**pair, "bottom": pd_.bottom, "top": pd_.top})
    partners = {"math": load_expert(str(args.math), lambda: base), "language": load_expert(str(args.lang), lambda: base)}  # fmt: skip
    print(f"{len(experts)} experts; paper default b{pd_.bottom} u{pd_.top}; xa MGSM {args.split} ({len(xa)} items)")  # fmt: skip
    rows = []
    for e in experts:
        # a recipe's sides are named as registry kinds: "math" and "language"
        states = {"base": base, **partners, e["kind"]: load_expert(e["path"], lambda: base)}
        model.load_state_dict(compose_recipe(recipe, states, depth))
        score = float(np.mean(mgsm_correct(model, tok, xa, max_new_tokens=20)))
        inds = {k: float(v) for k, v in e.items() if k.startswith("ind__") and v == v}
        rows.append({"expert_id": e["expert_id"], "kind": e["kind"], "path": str(e["path"]), "merge_score": score, **inds})  # fmt: skip
        shown = "  ".join(f"{k.removeprefix('ind__')} {v:.3f}" for k, v in inds.items())
        lr = json.loads(e["hparams"] or "{}").get("lr", float("nan"))
        print(f"  {e['kind']:<8} {e['trial_id']} (lr {lr:.2g}) step {e['step']}: merge {score:.3f}  {shown}", flush=True)  # fmt: skip
    print("\nSpearman(indicator, merge xa MGSM) over the experts of each kind, 95 % CI")
    corr = correlations(rows, args.resamples)
    for c in corr:
        rho, lo, hi = c["spearman"]
        print(
            f"  {c['kind']:<8} {c['indicator']:<28} n={c['n']:<3} {rho:+.2f} [{lo:+.2f}, {hi:+.2f}]"
        )
    print(f"({time.time() - t0:.0f}s)")
    if args.json:
        clean = [
            {**c, "spearman": [None if np.isnan(v) else v for v in c["spearman"]]} for c in corr
        ]
        args.json.parent.mkdir(parents=True, exist_ok=True)  # after minutes of work: not lost
        args.json.write_text(json.dumps({"experts": rows, "correlations": clean}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
