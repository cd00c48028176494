"""Shared builders for merge-search tests: a tiny world, perturbed experts, an experiment.

Experts are the world's base with seeded noise (the trained experts come from another milestone).
"""

from __future__ import annotations

from pathlib import Path

from spaces.search_experiment import SearchExperiment


def make_experts(world: Path, out: Path, *, nan_expert: bool = False) -> dict[str, Path]:
    """`task`, `language` (and maybe `nan_lang`, with a NaN tensor) checkpoints next to the base."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from world.tiny import perturbed

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
        "search": {"num_samples": 6, "max_concurrent": 2, "fidelity": {"screen": 0.5}},
        "promote": {"top_k": 1, "limit": 4, "max_gen_toks": 8},
    }
    for k, v in over.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
    return SearchExperiment.model_validate(data)
