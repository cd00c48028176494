"""Shared builders for merge-search tests: a tiny world, perturbed experts, an experiment, and a
Ray whose processes record the files they open (`audited_ray`).

Experts are the world's base with seeded noise (the trained experts come from another milestone).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from layerswap.spaces.search_experiment import SearchExperiment


class RayWouldStart(Exception):
    """Raised where a search would start Ray (the `started` fixture): every check passed."""


def make_experts(world: Path, out: Path, *, nan_expert: bool = False) -> dict[str, Path]:
    """`task`, `language` (and maybe `nan_lang`, with a NaN tensor) checkpoints next to the base."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from layerswap.world.tiny import perturbed

    base = world / "base"
    state = load_file(base / "model.safetensors")
    roles = {"task": (0.02, 1), "language": (0.03, 2), "language2": (0.03, 3)}
    if nan_expert:
        roles["nan_lang"] = (0.03, 4)
    paths = {"base": base}
    for role, (scale, seed) in roles.items():
        dst = out / role
        if not dst.exists():
            dst.mkdir(parents=True)
            for f in base.iterdir():
                if f.suffix != ".safetensors":
                    shutil.copyfile(f, dst / f.name)
            st = perturbed(state, scale, seed)
            if role == "nan_lang":
                st["model.layers.0.mlp.up_proj.weight"][0, 0] = float("nan")
            save_file({k: v.contiguous() for k, v in st.items()}, dst / "model.safetensors")
        paths[role] = dst
    del torch
    for folder in paths.values():  # trained long before a search: their digests are kept
        for f in folder.iterdir():  # (model_ids.RACY_NS), as the hashing counts expect
            s = f.stat()
            os.utime(f, ns=(s.st_atime_ns, min(s.st_mtime_ns, time.time_ns() - 3600 * 10**9)))
    return paths


def experiment(world: Path, paths: dict[str, Path], **over) -> SearchExperiment:
    data = {
        "name": "t",
        "language": "xa",
        "base": str(paths["base"]),
        "task_experts": [str(paths["task"])],
        "language_experts": [str(paths["language"])],
        "world": str(world),
        "proxy_eval": {"limit": 8, "max_gen_toks": 8},
        "space": {
            "bottom": {"low": 0, "high": 2},
            "top": {"low": 0, "high": 1},
            "bottom_transition": {"low": 0, "high": 1},
            "top_transition": {"low": 0, "high": 0},
        },
        "search": {
            "num_samples": 6,
            "max_concurrent": 2,
            "fidelity": {"policy": "screen", "screen": 0.5},
        },
        "promote": {"top_k": 1, "limit": 4, "max_gen_toks": 8},
    }
    for k, v in over.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
    return SearchExperiment.model_validate(data)


@contextmanager
def audited_ray(tmp: Path, roots: list[Path]) -> Iterator[Path]:
    """A 2-CPU local Ray whose every Python process records the files it opens under `roots`
    (and under the fresh `datasets` cache).

    The record is taken from outside the code under test (tests/search/audit_hook): the raylet
    and every worker inherit the environment set here before `ray.init`, and this process
    records too while the block runs. `datasets` gets a fresh cache, so every split loaded in
    the block is parsed from its JSONL file by the first process that loads it, never served
    from an Arrow cache an earlier run left (cache hits are memory-mapped natively, unseen).

    Yields:
        the folder of the per-process logs (read them with audit_hook.sitecustomize.read_log).
    """
    import os
    import shutil
    import tempfile

    import ray
    from audit_hook import sitecustomize as audit

    log_dir, cache = tmp / "audit", tmp / "hf_datasets_cache"
    log_dir.mkdir()
    roots = [*roots, cache]  # a split loaded through the cache opens its Arrow file there
    env = audit.environment(log_dir, roots) | {"HF_DATASETS_CACHE": str(cache)}
    saved = {k: os.environ.get(k) for k in env}
    ray_tmp = tempfile.mkdtemp(prefix="lsa", dir="/tmp")  # Ray's socket paths are length-limited
    os.environ.update(env)
    try:
        ray.init(num_cpus=2, _temp_dir=ray_tmp, include_dashboard=False, log_to_driver=False)
        audit.start(log_dir, roots)
        yield log_dir
    finally:
        audit.stop()
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(ray_tmp, ignore_errors=True)


def expert_registry(paths: dict[str, Path], out: Path, language: str = "xa") -> Path:
    """An expert registry (experts/registry.py's schema) over `make_experts`' task and language
    experts, scored on English MGSM dev and target Belebele dev; returns the parquet file."""
    from layerswap.experts.registry import append_rows, expert_id

    def row(role: str, kind: str, lang: str, mgsm: float, belebele: float) -> dict:
        return {
            "expert_id": expert_id("preflight", role, 1),
            "kind": kind,
            "language": lang,
            "mode": "full",
            "path": str(Path(paths[role]).resolve()),
            "base": str(paths["base"]),
            "trial_id": role,
            "step": 1,
            "samples": 4,
            "seed": 0,
            "hparams": "{}",
            "ind__world_mgsm_direct_en_dev": mgsm,
            "n_items__world_mgsm_direct_en_dev": 8,
            f"ind__world_belebele_{language}_dev": belebele,
            f"n_items__world_belebele_{language}_dev": 8,
        }

    path = out / "experts" / "registry.parquet"
    append_rows(path, [row("task", "math", "en", 0.5, 0.3), row("language", "language", language, 0.1, 0.6)])  # fmt: skip
    return path


def one_trial_run(root: Path, paths: dict[str, Path]) -> tuple[Path, str]:
    """RUN with a search/trials.parquet of one ok trial, as the search would have left it."""
    from layerswap.search.results import TrialStore
    from layerswap.spaces.recipe import LayerSwapRecipe, dump_recipe
    from layerswap.trainables.model_ids import content_recipe_id

    recipe = LayerSwapRecipe(
        method="layer_swap",
        task_expert=str(paths["task"]),
        language_expert=str(paths["language"]),
        base=str(paths["base"]),
        bottom=1,
        top=0,
    )
    rid = content_recipe_id(recipe)  # the id the search gives a trial
    store = TrialStore(root / "run" / "search" / "trials.parquet")
    store.append(
        {"trial_id": "0000", "recipe_id": rid, "recipe_yaml": dump_recipe(recipe, rid),
         "method": "layer_swap", "status": "ok", "fidelity": 8, "objective": 0.5}
    )  # fmt: skip
    return root / "run", rid
