"""Bad input to the merge engine: a clear error naming the file/tensor/field, nothing written."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
from merge_expect import (
    merge,
    swap_fields,
)

from layerswap.spaces.recipe import RecipeError

# --- errors: clear messages, nothing written -------------------------------------------------


def _variant(family, tmp_path, role="language", drop=(), add=None, change=None, config=None):
    from safetensors.torch import save_file

    state = dict(family.state(role))
    for name in drop:
        del state[name]
    state.update(add or {})
    for name, fn in (change or {}).items():
        state[name] = fn(state[name].clone())
    dst = tmp_path / f"bad-{role}"
    shutil.copytree(family.paths[role], dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    save_file({k: v.contiguous() for k, v in state.items()}, dst / "model.safetensors")
    return dst


def _swap_with_language(family, lang: Path, **kw) -> dict:
    return swap_fields(family, language_expert=str(lang), bottom=3, top=2, **kw)


def _expect_refusal(fields, out, nothing_written, exc, *needles):
    """The merge raises `exc` (a ValueError) whose message holds every needle; nothing written.

    Needles that are not paths are looked for in the message with the test's temporary
    folder blanked out (its name is the test's name and would match words like `header`).
    """
    with pytest.raises(exc) as e:
        merge(fields, out)
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    tmp = str(out.parent)
    bare = msg.replace(tmp, "<tmp>")
    for needle in needles:
        assert needle in (msg if needle.startswith(tmp) else bare), (needle, msg)
    nothing_written(out)
    return e.value


def test_different_architecture(family, tmp_path, nothing_written):
    name_re = re.compile(r"\.mlp\.(gate|up)_proj\.weight$")
    change = {}
    for n in family.names:
        if name_re.search(n):
            change[n] = lambda t: t[:48]
        elif n.endswith("mlp.down_proj.weight"):
            change[n] = lambda t: t[:, :48]
    lang = _variant(family, tmp_path, change=change, config={"intermediate_size": 48})
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        "intermediate_size",
        "48",
        str(lang),
    )


def test_different_shape(family, tmp_path, nothing_written):
    lang = _variant(family, tmp_path, change={"model.norm.weight": lambda t: t[:31]})
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        "model.norm.weight",
        "[31]",
        "[32]",
    )


def test_different_dtype(family, bf16_family, tmp_path, nothing_written):
    fields = swap_fields(family, language_expert=bf16_family.ref("language"), bottom=3, top=2)
    _expect_refusal(fields, tmp_path / "out", nothing_written, ValueError, "BF16", "F32")


def test_missing_tensor(family, tmp_path, nothing_written):
    lang = _variant(family, tmp_path, drop=["model.layers.5.mlp.up_proj.weight"])
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        "missing 1 tensor",
        "model.layers.5.mlp.up_proj.weight",
        str(lang),
    )


def test_extra_tensor(family, tmp_path, nothing_written):
    lang = _variant(family, tmp_path, add={"model.layers.5.mlp.extra.bias": torch.zeros(4)})
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        "extra",
        "model.layers.5.mlp.extra.bias",
    )


def _poison(value):
    def fn(t):
        t.view(-1)[7] = value
        return t

    return fn


@pytest.mark.parametrize(
    ("tensor", "value", "kw"),
    [
        # a tensor taken whole from the language expert
        ("model.layers.0.self_attn.q_proj.weight", float("nan"), {}),
        # the last tensor written: the refusal comes after other tensors were written
        ("model.layers.11.post_attention_layernorm.weight", float("inf"), {}),
        # an averaged tensor
        ("model.embed_tokens.weight", float("-inf"), {}),
        # found while measuring magnitudes, before anything is planned
        ("model.layers.6.mlp.down_proj.weight", float("nan"), {"transition_weights": "magnitude"}),
    ],
)
def test_nan_or_inf_in_an_input(family, tmp_path, nothing_written, tensor, value, kw):
    lang = _variant(family, tmp_path, change={tensor: _poison(value)})
    _expect_refusal(
        _swap_with_language(family, lang, **kw),
        tmp_path / "out",
        nothing_written,
        ValueError,
        tensor,
        "NaN or Inf",
        str(lang),
    )


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        # task arithmetic: a finite scale whose product with a delta overflows float32
        ({"method": "task_arithmetic", "scale": 1e300}, "scale 1e+300, weights 1, 1"),
        # TIES: finite weights that overflow the weighted mean's numerator
        ({"method": "ties", "weights": [1e300, 1.0], "density": 0.5}, "weights 1e+300, 1"),
    ],
)
def test_a_merge_that_overflows_is_refused(family, tmp_path, nothing_written, fields, needle):
    refs = {"base": family.ref("base"), "models": [family.ref("task"), family.ref("language")]}
    _expect_refusal(
        {**refs, **fields},
        tmp_path / "out",
        nothing_written,
        ValueError,
        "the merge overflows to a non-finite value",
        needle,
    )


def _copy(family, tmp_path, role="language") -> Path:
    dst = tmp_path / f"copy-{role}"
    shutil.copytree(family.paths[role], dst)
    return dst


def test_truncated_safetensors(family, tmp_path, nothing_written):
    lang = _copy(family, tmp_path)
    f = lang / "model.safetensors"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size - 100)
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        str(f),
        "model.norm.weight",
        "the file is truncated",
    )


@pytest.mark.parametrize("how", ["garbage json", "huge length", "not an object"])
def test_corrupt_header(family, tmp_path, nothing_written, how):
    lang = _copy(family, tmp_path)
    f = lang / "model.safetensors"
    raw = bytearray(f.read_bytes())
    if how == "garbage json":
        raw[8:20] = b"\xff\xfe{{{{garbage"[:12]
    elif how == "huge length":
        raw[0:8] = (2**40).to_bytes(8, "little")
    else:
        n = int.from_bytes(raw[:8], "little")
        raw[8 : 8 + n] = b"[" + b" " * (n - 2) + b"]"
    f.write_bytes(bytes(raw))
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        str(f),
        "safetensors header",
    )


class _Booby:
    """Unpickling this creates a folder: proof that a pickle was (or was not) loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_pickle_only_checkpoint_is_refused_unloaded(family, tmp_path, nothing_written, monkeypatch):
    lang = tmp_path / "pickled"
    lang.mkdir()
    shutil.copyfile(family.paths["language"] / "config.json", lang / "config.json")
    marker = tmp_path / "UNPICKLED"
    (lang / "pytorch_model.bin").write_bytes(pickle.dumps(_Booby(marker)))

    def boom(*a, **k):
        raise AssertionError("a pickle was loaded")

    monkeypatch.setattr(torch, "load", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    _expect_refusal(
        _swap_with_language(family, lang),
        tmp_path / "out",
        nothing_written,
        ValueError,
        str(lang),
        "pytorch_model.bin",
        "pickle",
    )
    assert not marker.exists()


def test_single_file_beside_a_shard_index_is_refused(family, sharded_family, tmp_path, capsys):
    """A folder with model.safetensors and a (stale) shard index: transformers loads the single
    file, so merging the shards would merge another model. Exit 2, one line naming both files."""
    import yaml

    from layerswap.cli import main

    lang = Path(shutil.copytree(sharded_family.paths["language"], tmp_path / "mixed"))
    shutil.copy(family.paths["task"] / "model.safetensors", lang / "model.safetensors")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(_swap_with_language(family, lang, base=None)))
    assert main(["merge", str(recipe), "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert str(lang) in err and "model.safetensors and model.safetensors.index.json" in err, err
    assert not (tmp_path / "out").exists()
    from layerswap.trainables.merge.live import load_expert

    with pytest.raises(ValueError, match="both model"):  # the search's live model: same rule
        load_expert(str(lang), None)


def test_missing_checkpoint_folder(family, tmp_path, nothing_written):
    _expect_refusal(
        _swap_with_language(family, tmp_path / "nowhere"),
        tmp_path / "out",
        nothing_written,
        ValueError,
        str(tmp_path / "nowhere"),
        "not found",
    )


def test_hub_id_offline(family, tmp_path, nothing_written, monkeypatch):
    # A local path with a typo reads as a Hub id: one line naming the folder looked for, and
    # huggingface_hub's own first line (its advice runs to several more).
    monkeypatch.chdir(tmp_path)
    fields = swap_fields(family, language_expert="no-such-org/no-such-model", bottom=3, top=2)
    err = _expect_refusal(
        fields,
        tmp_path / "out",
        nothing_written,
        ValueError,
        "no-such-org/no-such-model: no checkpoint folder at <tmp>/no-such-org/no-such-model, "
        "and not downloadable as a Hub repository (",
    )
    assert "\n" not in str(err), str(err)


def test_an_adapter_beside_a_full_checkpoint(family, tmp_path, nothing_written):
    from safetensors.torch import save_file

    lora = tmp_path / "lora"
    lora.mkdir()
    (lora / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    save_file({name: torch.zeros(2, 32)}, lora / "adapter_model.safetensors")
    _expect_refusal(
        _swap_with_language(family, lora),
        tmp_path / "out",
        nothing_written,
        ValueError,
        f"{family.paths['task']} is a full checkpoint but ",
        f"{lora} is a PEFT adapter; all checkpoints of a merge must be one kind",
    )


def test_boundaries_deeper_than_the_model(family, tmp_path, nothing_written):
    fields = swap_fields(family, bottom=6, top=4, bottom_transition=2, top_transition=1)
    err = _expect_refusal(
        fields,
        tmp_path / "out",
        nothing_written,
        RecipeError,
        "bottom (6)",
        "bottom_transition (2)",
        "top_transition (1)",
        "top (4)",
        "13",
        "12 layers",
    )
    assert isinstance(err, ValueError)


def test_revert_layer_outside_the_model(family, tmp_path, nothing_written):
    fields = swap_fields(family, bottom=3, top=2, revert=[{"layers": [12]}])
    _expect_refusal(fields, tmp_path / "out", nothing_written, RecipeError, "[12]", "12 layers")


def test_unsupported_model_type(family, tmp_path, nothing_written):
    task = _variant(family, tmp_path, role="task", config={"model_type": "gpt2"})
    fields = swap_fields(family, task_expert=str(task), bottom=3, top=2)
    _expect_refusal(fields, tmp_path / "out", nothing_written, ValueError, "gpt2", "config.json")
