"""trainables/train/ray_capacity.py: a Ray Train run's workers against the cluster's nodes.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_ray_capacity.py
"""

from __future__ import annotations

import pytest

from layerswap.spaces.train_settings import Scaling
from layerswap.trainables.train.ray_capacity import placement_problem


def _node(cpu: float, gpu: float = 0, kind: str | None = None, alive: bool = True) -> dict:
    res = {"CPU": cpu} | ({"GPU": gpu} if gpu else {}) | ({f"accelerator_type:{kind}": 1.0} if kind else {})  # fmt: skip
    return {"Alive": alive, "Resources": res}


def test_workers_that_fit_say_nothing():
    s = Scaling(num_workers=8, use_gpu=True, accelerator_type="H100")  # 8 CPUs a GPU worker
    assert placement_problem(s, [_node(192, 8, "H100")]) is None
    assert placement_problem(Scaling(num_workers=2), [_node(1), _node(1)]) is None  # spread


@pytest.mark.parametrize(
    "scaling, nodes, says",
    [
        # The shipped configs' H100 label on a machine of H200s: waited forever, silent.
        (
            {"num_workers": 2, "use_gpu": True, "accelerator_type": "H100"},
            [_node(32, 4, "H200")],
            "room for 0; its nodes: 32 CPU, 4 GPU H200",
        ),
        # 8 CPUs a GPU worker by default: a 4-CPU node holds none.
        ({"num_workers": 1, "use_gpu": True}, [_node(4, 1)], "of {CPU: 8, GPU: 1} do not fit"),
        ({"num_workers": 3}, [_node(2), _node(1, alive=False)], "room for 2"),
    ],
)
def test_workers_that_do_not_fit_are_named(scaling, nodes, says):
    problem = placement_problem(Scaling(**scaling), nodes)
    assert problem is not None and says in problem, problem
