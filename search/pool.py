"""The experts a search draws from, their depth and ids, and the task YAMLs it evaluates with.

`resolve_pool(exp)` reads the expert registry's top-k (or the experiment's explicit lists);
promotion and the search driver share these so both see the same pool.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from spaces.recipe import ExpertSoup
from spaces.search_experiment import SearchExperiment
from spaces.search_space import ExpertPool, ExpertRef


def resolve_pool(exp: SearchExperiment) -> ExpertPool:
    """The experts: explicit paths, or the top_k of each kind from the expert registry."""
    if exp.experts is None:
        return ExpertPool.from_paths(exp.task_experts, exp.language_experts, exp.base)
    import pyarrow.parquet as pq

    from trainables.merge.lora import is_lora_adapter

    src = exp.experts
    rows = pq.read_table(src.registry).to_pylist()
    if not rows:
        raise ValueError(f"experts.registry {src.registry}: no experts")
    inds = [k for k in rows[0] if k.startswith("ind__")]
    lang = src.language or exp.language

    def pick(kind: str, indicator: str | None, default: str, language: str | None):
        ind = indicator or (default if default in inds else (inds[0] if inds else None))
        cand = [
            r for r in rows if r["kind"] == kind and (language is None or r["language"] == language)
        ]
        if not cand:
            raise ValueError(f"experts.registry {src.registry}: no {kind} experts ({language=})")
        cand.sort(key=lambda r: -(r.get(ind) if ind and r.get(ind) is not None else -math.inf))
        return [
            ExpertRef(
                path=r["path"],
                expert_id=r["expert_id"],
                # partial/simultaneous/mix runs may write adapters too: ask the folder itself
                kind="lora" if r["mode"] == "lora" or is_lora_adapter(r["path"]) else "full",
            )
            for r in cand[: src.top_k]
        ]

    task = pick("math", src.task_indicator, "ind__world_mgsm_direct_en_dev", None)
    language = pick("language", src.language_indicator, f"ind__world_belebele_{lang}_dev", lang)
    return ExpertPool(task=task, language=language, base=exp.base or rows[0].get("base"))


def model_depth(pool: ExpertPool) -> int:
    like = next((r.path for r in pool.task if r.kind == "full"), pool.base)
    if like is None:
        raise ValueError("cannot tell the depth: LoRA experts need `base`")
    cfg = json.loads((Path(like) / "config.json").read_text())
    return int(cfg["num_hidden_layers"])


def expert_id(pool: ExpertPool, ref) -> str:
    if isinstance(ref, ExpertSoup):
        return "soup(" + "+".join(expert_id(pool, r) for r in ref.soup) + ")"
    for r in (*pool.task, *pool.language):
        if r.path == ref:
            return r.expert_id or Path(r.path).name
    return Path(str(ref)).name


def include_paths(exp: SearchExperiment, run_dir: Path) -> list[str]:
    paths = list(exp.include_path)
    if exp.world is not None:
        from trainables.evaluate.tasks import write_world_tasks

        tasks = run_dir / "tasks"
        write_world_tasks(Path(exp.world), tasks)
        paths.insert(0, str(tasks))
    if not paths:
        raise ValueError("no task YAMLs: give `world` or `include_path`")
    return paths
