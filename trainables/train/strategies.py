"""How a model is spread over the workers: a table of strategies, `ddp` and `fsdp` (FSDP2).

`pick(exp, world)` gives the strategy the loop uses; each one wraps the prepared model, skips
gradient sync on non-final micro-batches, clips the active group's gradients, and writes and
restores resumable checkpoints. `ddp` (also one process): every rank holds everything; rank 0
writes the checkpoint (trainables/train/state.py). `fsdp`: `fully_shard` per decoder layer and
at the root, so weights, gradients and AdamW state are sharded; every rank writes its shard of
the resumable state with torch.distributed.checkpoint (DCP) and rank 0 the consolidated HF
weights, both into one checkpoint folder (trainables/train/sharded.py).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist
from torch import nn

from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.trainables.train.precision import apply_precision

if TYPE_CHECKING:
    from layerswap.trainables.train.modes import Prepared
    from layerswap.trainables.train.precision import Policy


class Strategy(Protocol):
    name: str

    def wrap(self, prep: Prepared, exp: TrainExperiment, policy: Policy, device: torch.device, world: int) -> nn.Module: ...  # fmt: skip

    def no_sync(self, net: nn.Module, last: bool): ...

    def grad_norm(self, params: list[nn.Parameter], max_norm: float) -> float: ...


def _regroup(prep: Prepared, names: dict[str, list[str]]) -> None:
    """Point `prep.groups` at the model's current parameter objects (by name): fully_shard
    replaces every parameter with a sharded one, and optimizers must see those."""
    current = dict(prep.model.named_parameters())
    prep.groups = {g: [(n, current[n]) for n in group] for g, group in names.items()}


class Replicated:
    """DistributedDataParallel over the workers (or the bare model in one process)."""

    name = "ddp"
    sharded = False

    def wrap(self, prep, exp, policy, device, world):
        if world == 1:
            return prep.model
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(prep.model, device_ids=[device.index] if device.type == "cuda" else None)

    def no_sync(self, net, last):
        return nullcontext() if last or not hasattr(net, "no_sync") else net.no_sync()

    def grad_norm(self, params, max_norm):
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


class FullyShard:
    """FSDP2: each decoder layer is one all-gather unit, the rest (embeddings, final norm,
    lm_head) the root's; the precision policy's compute dtype is FSDP's param_dtype, and
    gradients are reduced in fp32 whenever the masters are fp32."""

    name = "fsdp"
    sharded = True

    def wrap(self, prep, exp, policy, device, world):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        if device.type == "cuda":
            torch.cuda.set_device(device)  # the mesh and NCCL use the current device
        mp = MixedPrecisionPolicy(
            param_dtype=policy.compute, reduce_dtype=policy.master, cast_forward_inputs=True
        )
        kw = {"mp_policy": mp, "mesh": init_device_mesh(device.type, (world,))}
        if exp.scaling.cpu_offload:
            # Pinned host memory speeds up copies to the GPU; without a GPU it cannot be had.
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
        model = prep.model
        # The groups' references to the unsharded parameters go first: while they lived, every
        # layer's full fp32 copy outlived its sharding, and a GPU briefly held the whole fp32
        # model (~30 GiB at 8B) however finely the layers were sharded.
        names = {g: [n for n, _ in named] for g, named in prep.groups.items()}
        prep.groups = {g: [] for g in names}
        # Unit by unit: placed, cast to the policy, sharded (which frees the full copy), so a
        # GPU holds one unsharded fp32 layer at a time, never the whole fp32 model.
        for layer in _decoder_layers(model):
            layer.to(device)
            apply_precision(layer, policy)
            fully_shard(layer, **kw)
        _place_unsharded(model, device)
        apply_precision(model, policy)  # the root's own weights; the layers' are cast already
        fully_shard(model, **kw)
        _regroup(prep, names)
        return model

    def no_sync(self, net, last):
        # Reduce-scatter after every micro-batch: skipping it would keep each parameter's
        # unsharded fp32 gradient until the last one (4 bytes x every weight per GPU, 30 GiB
        # at 8B), giving up the sharding of gradients to save communication.
        return nullcontext()

    def grad_norm(self, params, max_norm):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _place_unsharded(model: nn.Module, device: torch.device) -> None:
    """Move the parameters and buffers not yet sharded (embeddings, final norm, lm_head, rotary
    tables) to `device`; sharded ones stay where FSDP put them (the CPU under offload)."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for module in model.modules():
            for p in module.parameters(recurse=False):
                if not isinstance(p, DTensor) and p.device != device:
                    p.data = p.data.to(device)
            for name, b in module.named_buffers(recurse=False):
                if b.device != device:
                    module._buffers[name] = b.to(device)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF causal LM (Llama/Qwen/Mistral: model.model.layers)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(
            f"scaling.strategy fsdp: {type(model).__name__} has no model.layers to shard per "
            "decoder layer (supported: Llama-family HF causal LMs)"
        )
    return list(layers)


STRATEGIES: dict[str, Strategy] = {"ddp": Replicated(), "fsdp": FullyShard()}


def pick(exp: TrainExperiment, world: int) -> Strategy:
    """The experiment's strategy; fsdp needs an initialised process group (else ddp, one
    process, with a note: `--no-ray` runs one worker)."""
    name = exp.scaling.strategy
    if name == "fsdp" and not (dist.is_available() and dist.is_initialized()):
        print("scaling.strategy fsdp needs torch.distributed (Ray Train); training unsharded")
        name = "ddp"
    return STRATEGIES[name]


def shared_folder(path: Path, rank: int, world: int) -> bool:
    """Whether every rank sees the same folder at `path` (one file system), decided by a token
    rank 0 writes there: under Ray each worker trains in its own temporary folder."""
    import uuid

    token = [uuid.uuid4().hex if rank == 0 else None]
    if world == 1:
        return True
    dist.broadcast_object_list(token, src=0)
    marker = path / f".shared-{token[0]}"
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        marker.touch()
    dist.barrier()
    seen: list[bool | None] = [None] * world
    dist.all_gather_object(seen, marker.exists())  # objects: works on gloo and nccl alike
    if rank == 0:
        marker.unlink()
    return all(seen)
