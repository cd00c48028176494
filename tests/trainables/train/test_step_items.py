"""trainables/train/train_step._step_items: the step's global label-token count reaches the model
exactly under FSDP2's mixed precision (which casts floating forward inputs to bf16).

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_step_items.py
"""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from layerswap.trainables.train.train_step import _step_items


class _Seen(torch.nn.Module):
    """Records the `num_items_in_batch` its forward is given, after FSDP's input casting."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))
        self.seen: list[torch.Tensor] = []

    def forward(self, x, num_items_in_batch=None):
        self.seen.append(num_items_in_batch)
        return (x * self.w).sum()


@pytest.fixture
def one_process_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_global_count_is_not_rounded_by_fsdp_bf16(one_process_group):
    """A red-team's case: 4000 + 5171 label tokens on two ranks. A float count (4585.5 a rank)
    reached the model as bf16 4576.0; the integer count passes FSDP2's cast unchanged."""
    model = _Seen()
    fully_shard(
        model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, cast_forward_inputs=True)
    )
    run = SimpleNamespace(world=2, device=torch.device("cpu"))  # as a rank of two would see it
    items, factor = _step_items(run, 9171, passes=1)  # one process: the all-reduce sums 9171 alone
    model(torch.ones(4), num_items_in_batch=items)
    [seen] = model.seen
    assert not seen.is_floating_point() and int(seen) == 9171 and factor == 2
    # what the old float count became (the check fails loudly if FSDP stops casting floats)
    model(torch.ones(4), num_items_in_batch=torch.tensor(9171 / 2))
    assert float(model.seen[-1]) == 4576.0
