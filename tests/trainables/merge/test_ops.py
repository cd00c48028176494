"""The one op dispatch (trainables.merge.ops.OPS): both executors read it, neither knows others.

Run: .venv/bin/python -m pytest -q tests/trainables/merge/test_ops.py
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from layerswap.spaces.recipe import parse_recipe
from layerswap.trainables.merge import ops
from layerswap.trainables.merge.assembly import recipe_refs
from layerswap.trainables.merge.compose import compose
from layerswap.trainables.merge.engine import assembly_for, open_checkpoints, write_assembly
from layerswap.trainables.merge.terms import DeltaMerge, Linear


@dataclass(frozen=True)
class Negate:
    """An op the executors have never heard of: minus one checkpoint's tensor."""

    ref: str

    @property
    def take(self) -> None:
        return None

    @property
    def refs(self) -> tuple[str, ...]:
        return (self.ref,)


def _negate(op, tensors, out=None):
    if out is None:
        return -tensors[0]
    return torch.neg(tensors[0], out=out)


def _opened(family):
    recipe = parse_recipe(
        {"method": "soup", "models": [family.ref("task"), family.ref("language")]}
    )
    ckpts = open_checkpoints(recipe_refs(recipe))
    assembly, _ = assembly_for(recipe, ckpts)
    return ckpts, assembly


def test_op_kind_names_an_unknown_op_and_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown merge op Negate.*known ops: Linear, DeltaMerge"):
        ops.op_kind(Negate("a"))
    assert ops.op_kind(Linear((("a", 1.0),))).rowwise
    assert not ops.op_kind(DeltaMerge("z", ("a",), (1.0,), 1.0, None)).rowwise


def test_compose_refuses_an_unknown_op():
    sources = {"a": {"w": torch.ones(2, 2)}}
    with pytest.raises(ValueError, match="unknown merge op Negate"):
        compose({"w": Negate("a")}, sources)


def test_disk_engine_refuses_an_unknown_op(family, tmp_path):
    ckpts, assembly = _opened(family)
    name = next(iter(assembly))
    assembly[name] = Negate(family.ref("task"))
    out = tmp_path / "out"
    out.mkdir()
    try:
        with pytest.raises(ValueError, match="unknown merge op Negate"):
            write_assembly(assembly, ckpts, out, max_shard_bytes=2**30)
    finally:
        for ck in ckpts.values():
            ck.close()
    assert not list(out.iterdir())  # refused before the first shard file


@pytest.mark.parametrize("rowwise", [True, False])
def test_an_op_added_to_the_table_reaches_both_executors(family, tmp_path, monkeypatch, rowwise):
    """One entry in OPS and nothing else: the composer and the disk engine both compute it."""
    from safetensors.torch import load_file

    monkeypatch.setitem(ops.OPS, Negate, ops.OpKind(_negate, rowwise=rowwise))
    task = family.state("task")
    name = next(n for n, t in task.items() if t.dim() == 2)
    got = compose({name: Negate("t")}, {"t": task})[name]
    assert torch.equal(got, -task[name])

    ckpts, assembly = _opened(family)
    assembly = {name: Negate(family.ref("task"))}
    out = tmp_path / "out"
    out.mkdir()
    try:
        write_assembly(assembly, ckpts, out, max_shard_bytes=2**30)
    finally:
        for ck in ckpts.values():
            ck.close()
    written = {}
    for f in out.glob("*.safetensors"):
        written.update(load_file(f))
    assert torch.equal(written[name], -task[name])
