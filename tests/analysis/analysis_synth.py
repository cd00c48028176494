"""Synthetic run directories in the run layout, with known structure, for analysis tests.

`make_run(root)` writes tiny checkpoints (base, a math expert that changed only layers 2..4 and a
language expert that changed only layers 0, 1 and 5, each in known rows), an expert registry,
search trials, an Optuna SQLite study and promotion results for two target languages.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import save_file

from layerswap.analysis.load import load_run

LAYERS = 6
MATH_LAYERS = (2, 3, 4)
LANG_LAYERS = (0, 1, 5)
CHANGED_ROWS = (1, 3)  # the rows each changed parameter has changed
TYPES = ("q", "k", "v", "o", "gate", "up", "down")


def tiny_base(root: Path) -> Path:
    """A 6-layer tiny Llama base (no tokenizer) at root/base."""
    from layerswap.world.tiny import make_tiny_family

    paths = make_tiny_family(root / "family", num_layers=LAYERS, with_tokenizer=False)
    return paths["base"]


def write_changed(base: Path, out: Path, layers, rows=CHANGED_ROWS, types=TYPES, scale=0.5) -> Path:
    """A copy of `base` where exactly `rows` of the given 2-D layer parameters changed."""
    from safetensors.torch import load_file

    state = load_file(base / "model.safetensors")
    g = torch.Generator().manual_seed(len(str(out)))
    for name, t in state.items():
        parts = name.split(".")
        if t.dim() != 2 or "layers" not in parts:
            continue
        layer = int(parts[parts.index("layers") + 1])
        ptype = parts[-2].removesuffix("_proj")
        if layer in layers and ptype in types:
            t = t.clone()
            for r in rows:
                t[r] += scale + torch.rand(t.shape[1], generator=g)
            state[name] = t
    out.mkdir(parents=True)
    (out / "config.json").write_text((base / "config.json").read_text())
    save_file({k: v.contiguous() for k, v in state.items()}, out / "model.safetensors")
    return out


def lm_eval_raw(task: str, scores: list[float] | dict[int, float]) -> dict:
    """An lm-eval result of an MGSM-style `task` whose flexible-extract samples score `scores`
    (the other filter scores the opposite, so reading the wrong filter shows), docs in reverse
    order; a list is docs 0..n-1, a dict {doc_id: score}."""
    by_id = scores if isinstance(scores, dict) else dict(enumerate(scores))
    config = {
        "output_type": "generate_until",
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "filter_list": [{"name": "remove_whitespace"}, {"name": "flexible-extract"}],
    }
    samples = []
    for i in sorted(by_id, reverse=True):
        for filt, v in (("remove_whitespace", 1.0 - by_id[i]), ("flexible-extract", by_id[i])):
            samples.append({"doc_id": i, "filter": filt, "target": "1", "filtered_resps": ["1"], "exact_match": v})  # fmt: skip
    return {"configs": {task: config}, "samples": {task: samples}, "results": {task: {}}}


def make_run(root: Path, *, with_study: bool = True, seed: int = 0) -> Path:
    """A full synthetic run directory under root/run. Returns its path."""
    rng = np.random.default_rng(seed)
    run = root / "run"
    models = run / "models"
    base = tiny_base(models)
    math_dir = write_changed(base, models / "math", MATH_LAYERS)
    lang_dir = write_changed(base, models / "lang_xa", LANG_LAYERS)

    # Registry: math experts m0..m2, language experts per language, other treatments.
    rows = []
    for i in range(3):
        rows.append(dict(expert_id=f"m{i}", kind="math", language="en", mode="full",
                         path=str(math_dir.relative_to(run)) if i == 0 else "models/missing",
                         en=0.30 + 0.05 * i, xa=0.10 + 0.01 * i, xb=0.08 + 0.01 * i, bele=0.25))  # fmt: skip
    for lang in ("xa", "xb"):
        for i in range(3):
            rows.append(dict(expert_id=f"l{lang}{i}", kind="language", language=lang, mode="full",
                             path=str(lang_dir.relative_to(run)) if i == 0 else "models/missing",
                             en=0.20, xa=0.12 + 0.01 * i, xb=0.11 + 0.01 * i, bele=0.40 + 0.1 * i))  # fmt: skip
    for lang in ("xa", "xb"):
        for mode, kind, v in (("lora", "math", 0.11), ("lora", "language", 0.12), ("mix", "math", 0.15),
                              ("simultaneous", "math", 0.17), ("partial", "math", 0.13)):  # fmt: skip
            rows.append(dict(expert_id=f"{mode}_{kind}_{lang}", kind=kind, language=lang if kind != "math" or mode in ("mix", "simultaneous") else "en",
                             mode=mode, path="models/missing", en=0.3, xa=v, xb=v - 0.01, bele=0.3))  # fmt: skip
    reg = pd.DataFrame(rows)
    reg = reg.rename(columns={"en": "ind__world_mgsm_direct_en_dev", "xa": "ind__world_mgsm_direct_xa_dev",
                              "xb": "ind__world_mgsm_direct_xb_dev", "bele": "ind__world_belebele_xa_dev"})  # fmt: skip
    reg["base"] = str(base.relative_to(run))
    reg["trial_id"], reg["step"], reg["samples"], reg["seed"] = "t", 100, 1000, 0
    reg["hparams"] = json.dumps({"lr": 1e-4})
    reg["n_items__world_belebele_xa_dev"] = 50
    (run / "experts").mkdir(parents=True)
    reg.to_parquet(run / "experts" / "registry.parquet")

    # Trials: the objective and the target both follow the language expert's Belebele.
    lang_ids = ["lxa0", "lxa1", "lxa2"]
    bele = {f"lxa{i}": 0.40 + 0.1 * i for i in range(3)}
    trows = []
    for i in range(30):
        b, u = int(rng.integers(0, 4)), int(rng.integers(0, 3))
        lid = lang_ids[i % 3]
        score = bele[lid] - 0.02 * abs(b - 2) - 0.02 * abs(u - 1) + 0.01 * rng.standard_normal()
        trows.append(dict(trial_id=f"tr{i:02d}", recipe_id=f"{i:012x}", recipe_yaml="", method="layer_swap",
                          params=json.dumps({"bottom": b, "top": u}), bottom=b, top=u,
                          bottom_transition=int(rng.integers(0, 2)), top_transition=int(rng.integers(0, 2)),
                          weights="uniform", non_layer="average", granularity="layer",
                          task_expert_id=f"m{i % 2}", language_expert_id=lid,
                          status="ok" if i not in (5, 17) else "failed", error=None, fidelity=50 if i % 4 else 25,
                          proxy__world_mgsm_direct_en_dev=0.3 + 0.01 * rng.standard_normal(),
                          proxy__world_belebele_xa_dev=score, objective=score if i not in (5, 17) else None,
                          t_compose_s=0.1, t_eval_s=1.0, t_total_s=1.1, finished_at=f"2026-11-22T00:{i:02d}:00"))  # fmt: skip
    trials = pd.DataFrame(trows)
    (run / "search").mkdir()
    trials.to_parquet(run / "search" / "trials.parquet")
    if with_study:
        make_study(run / "search" / "study.db", trials)

    write_promotion(run, trials, rng)
    return run


def write_promotion(run: Path, trials: pd.DataFrame, rng: np.random.Generator) -> None:
    """RUN/promotion/results.parquet: baselines and the top-8 candidates on both languages' MGSM
    test, with lm-eval's raw per-item JSON for the xa baselines (the paired section's input)."""
    ok = trials[trials["status"] == "ok"].sort_values("objective", ascending=False).head(8)
    prom = []
    for lang, shift in (("xa", 0.0), ("xb", -0.02)):
        task = f"world_mgsm_direct_{lang}"
        for model, v in (("base", 0.08), ("math_expert", 0.10), ("language_expert", 0.11), ("soup_uniform", 0.14),
                         ("soup_magnitude", 0.145), ("ties", 0.13), ("paper_default", 0.16)):  # fmt: skip
            raw = ""
            if lang == "xa":  # the per-item results lm-eval logs, for the paired section
                k = round(v * 250)
                items = rng.permutation([1.0] * k + [0.0] * (250 - k)).tolist()
                raw = run / "promotion" / "lm_eval" / model / f"{task}.json"
                raw.parent.mkdir(parents=True, exist_ok=True)
                raw.write_text(json.dumps(lm_eval_raw(task, items)))
                v, raw = k / 250, str(raw)
            prom.append(dict(model=model, kind="baseline", recipe_id=None, task=task, split="test",
                             metric="exact_match", value=v + shift, n_items=250, raw_json=raw))  # fmt: skip
        for _, r in ok.iterrows():
            target = 0.5 * r["objective"] + shift + 0.002 * rng.standard_normal()
            prom.append(dict(model=f"candidate_{r['recipe_id']}", kind="candidate", recipe_id=r["recipe_id"],
                             task=task, split="test", metric="exact_match", value=target, n_items=250, raw_json=""))  # fmt: skip
    prom.append(dict(model="revert_math_A", kind="baseline", recipe_id=None, task="world_mgsm_direct_en",
                     split="test", metric="exact_match", value=0.33, n_items=250, raw_json=""))  # fmt: skip
    (run / "promotion").mkdir(exist_ok=True)
    pd.DataFrame(prom).to_parquet(run / "promotion" / "results.parquet")


def make_study(path: Path, trials: pd.DataFrame) -> None:
    """An Optuna SQLite study holding the trials' (b, u, t_b, t_u) and objectives."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=f"sqlite:///{path}", study_name="merge_search", direction="maximize"
    )
    dist = {
        k: optuna.distributions.IntDistribution(0, 4)
        for k in ("bottom", "top", "bottom_transition", "top_transition")
    }
    for _, r in trials.iterrows():
        if r["status"] != "ok":
            continue
        params = {k: int(r[k]) for k in dist}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dist, value=float(r["objective"])))  # fmt: skip


def promotion_run(tmp_path: Path, task: str, models: dict[str, list[float] | dict[int, float]], raw: bool = True):  # fmt: skip
    """A run folder holding only promotion's results on `task` (one baseline row per model, its
    per-item `scores` in a raw lm-eval JSON unless `raw` is False; see `lm_eval_raw`), loaded as
    analysis reads it."""
    run = tmp_path / "run"
    (run / "promotion").mkdir(parents=True)
    rows = []
    for model, scores in models.items():
        path = run / "promotion" / f"{model}.json"
        if raw:
            path.write_text(json.dumps(lm_eval_raw(task, scores)))
        rows.append({"model": model, "kind": "baseline", "recipe_id": "", "task": task, "split": "test", "metric": "exact_match,flexible-extract", "value": float(np.mean(list(scores.values()) if isinstance(scores, dict) else scores)), "n_items": len(scores), "raw_json": str(path)})  # fmt: skip
    pd.DataFrame(rows).to_parquet(run / "promotion" / "results.parquet")
    return load_run(run)
