"""Checkpoints of FSDP2 runs: every rank's shard of the resumable state, and the consolidated HF
weights, in one checkpoint folder. Called by every rank (collective) from the training loop.

Layout (as trainables/train/state.py's, with the trainer state in DCP's format):
  model.safetensors + config.json + tokenizer   rank 0: gathered, in the policy's save dtype
  layerswap_train.json, trainer_state/state.json rank 0
  trainer_state/dcp/.metadata, __<rank>_0.distcp every rank: weights (masters) + AdamW state
Ranks that train in one folder (torchrun, torch.multiprocessing) write it together; ranks with
folders of their own (Ray Train workers) each write theirs, and the checkpoint is the union of
their files (Ray's upload merges them: trainables/train/ray_train.py).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from layerswap.trainables.atomic import follow_umask
from layerswap.trainables.train.state import (
    DCP_DIR,
    STATE_DIR,
    fix_config_dtype,
    write_run_files,
)
from layerswap.trainables.train.strategies import shared_folder

if TYPE_CHECKING:
    from layerswap.trainables.train.precision import Policy


def _resumable(model: torch.nn.Module, optimizers: dict[str, torch.optim.Optimizer]) -> tuple[dict, list[str]]:  # fmt: skip
    """This rank's shards of the weights and of each group's AdamW state, as DCP saves them,
    and the groups whose optimizer has not stepped yet.

    torch's get_optimizer_state_dict gives an optimizer without state one step at LR 0 (step
    1, zero moments) to have something to save; that step would shift the group's bias
    correction for the rest of the run, so such an optimizer is emptied again here.
    """
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state = {"model": get_model_state_dict(model)}
    empty = sorted(g for g, opt in optimizers.items() if not opt.state)
    for group, opt in optimizers.items():
        state[f"optim__{group}"] = get_optimizer_state_dict(model, opt)
    for group in empty:
        optimizers[group].state.clear()
    return state, empty


def _full_weights(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0's CPU, in `dtype` (every rank must call this)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=opts)
    if getattr(model.config, "tie_word_embeddings", False):
        full.pop("lm_head.weight", None)  # one tensor under two names: HF saves the embedding
    return {k: v.to(dtype).contiguous() if v.is_floating_point() else v for k, v in full.items()}


def _write_hf(folder: Path, model, tokenizer, weights: dict, dtype: torch.dtype) -> None:
    """What `save_pretrained` writes for a full model, from gathered weights (rank 0)."""
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    model.config.save_pretrained(folder)
    fix_config_dtype(folder, dtype)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def save_sharded(out: Path, *, model, tokenizer, optimizers: dict[str, torch.optim.Optimizer], manifest: dict, state: dict, policy: Policy) -> Path | None:  # fmt: skip
    """Write one FSDP checkpoint folder; every rank calls this at the same step.

    Args:
        out: the checkpoint folder (replaced if there: a re-run step writes the same).
        model: the fully_shard-ed model; tokenizer: saved beside the weights (rank 0).
        optimizers: group name -> AdamW over the sharded parameters.
        manifest: layerswap_train.json; state: trainer_state/state.json (rank 0).
        policy: the precision policy (HF weights are written in `policy.save`).
    Returns:
        The folder holding this rank's files: `out` on rank 0, and on other ranks when they
        write folders of their own; None for a rank whose files rank 0's folder already holds.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    weights = _full_weights(model, policy.save)  # collective: before any rank writes
    shared = shared_folder(out.parent, rank, world)
    writer = rank == 0 or not shared
    tmp = out.parent / f".{out.name}.tmp-shards"  # one name on every rank: DCP's id
    if writer:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / STATE_DIR).mkdir(parents=True)
    dist.barrier()
    from torch.distributed.checkpoint import save as dcp_save

    resumable, empty = _resumable(model, optimizers)
    dcp_save(resumable, checkpoint_id=str(tmp / STATE_DIR / DCP_DIR))
    if rank == 0:
        _write_hf(tmp, model, tokenizer, weights, policy.save)
        state = {**state, "unstepped_groups": empty}  # their saved state is a placeholder
        write_run_files(tmp, manifest, state)
    dist.barrier()  # every shard is on disk before the folder becomes visible
    if writer:
        follow_umask(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    dist.barrier()
    return out if writer else None


def load_sharded(ckpt: Path, model, optimizers: dict[str, torch.optim.Optimizer]) -> None:
    """Restore the sharded weights (fp32 masters) and AdamW state of an FSDP checkpoint in place.

    Every rank calls this with the same checkpoint folder, which must hold every rank's shard
    (a merged folder: Ray's storage, or the folder the ranks wrote together).
    """
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    where = Path(ckpt) / STATE_DIR / DCP_DIR
    if not (where / ".metadata").is_file():
        raise ValueError(f"{ckpt}: no sharded trainer state ({where}/.metadata); not an FSDP checkpoint")  # fmt: skip
    state, _ = _resumable(model, optimizers)
    dcp_load(state, checkpoint_id=str(where))
    set_model_state_dict(model, state["model"])
    unstepped = json.loads((Path(ckpt) / STATE_DIR / "state.json").read_text()).get("unstepped_groups", [])  # fmt: skip
    for group, opt in optimizers.items():
        set_optimizer_state_dict(model, opt, state[f"optim__{group}"])
        if group in unstepped:
            opt.state.clear()  # as it was when saved: never stepped
