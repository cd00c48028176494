"""LoRA layer swapping: merged adapters (and folded models) must equal base + the zone table's deltas.

The expectation is computed here from the two adapters' factors and a zone table written out in
this file, independently of spaces.zones and trainables.merge.lora; PEFT loads and merges the output.
"""

from __future__ import annotations

import os

# No network: huggingface_hub reads this when first imported, so set it before transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from layerswap.spaces.recipe import RecipeError, parse_recipe
from layerswap.trainables.merge.lora import _shown_different, is_lora_adapter, merge_lora_to_disk
from layerswap.world.tiny import make_tiny_family

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

L = 6
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MODULE = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$")
SLOT = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.")


def make_lora(base: Path, out: Path, seed: int, r=4, alpha=8, rslora=True, targets=ALL) -> Path:
    """A PEFT LoRA adapter of `base` with seeded random A and B (so every delta is non-zero)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, use_rslora=rslora, target_modules=targets)
    pm = peft.get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    # lm_head targets: PEFT would also save the (untrained) base lm_head unless told not to.
    pm.save_pretrained(out, save_embedding_layers=False)
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    fam = make_tiny_family(root / "fam", num_layers=L, with_tokenizer=False)
    base = fam["base"]
    return {
        "root": root,
        "base": base,
        "task": make_lora(base, root / "task", seed=1),
        "lang": make_lora(base, root / "lang", seed=2),
        # Different rank, alpha and rslora; partial targets; both adapt lm_head (non-layer).
        "task2": make_lora(base, root / "task2", 3, r=2, alpha=16, targets=[*ALL, "lm_head"]),
        "lang2": make_lora(
            base,
            root / "lang2",
            4,
            r=8,
            alpha=4,
            rslora=False,
            targets=["q_proj", "v_proj", "lm_head"],
        ),
    }


def zone_table(b: int, tb: int, tu: int, u: int) -> list[str]:
    """docs/method.md's zone table, written out: language | transition | task | transition | language."""
    return (
        ["language"] * b + ["transition"] * tb + ["task"] * (L - b - tb - tu - u)
        + ["transition"] * tu + ["language"] * u
    )  # fmt: skip


def deltas(adapter: Path) -> dict[str, torch.Tensor]:
    """{base weight name: scaling * B @ A} from an adapter's files (no pattern configs here)."""
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    s = cfg["lora_alpha"] / (math.sqrt(cfg["r"]) if cfg["use_rslora"] else cfg["r"])
    t = load_file(adapter / "adapter_model.safetensors")
    out = {}
    for key in t:
        m = MODULE.match(key)
        if m and m[2] == "A":
            a, b = t[key], t[key.replace("lora_A", "lora_B")]
            out[f"{m[1]}.weight"] = s * (b.double() @ a.double())
    return out


def expected(world, task, lang, owner: dict[str, list[str]], w=(0.5, 0.5), non_layer="transition"):
    base = load_file(world["base"] / "model.safetensors")
    dt, dl = deltas(world[task]), deltas(world[lang])
    side = {"task": (1.0, 0.0), "language": (0.0, 1.0), "transition": w}
    out = {}
    for name, wb in base.items():
        m = SLOT.search(name)
        src = non_layer if m is None else owner[m[2]][int(m[1])]
        wt, wl = side[src]
        zero = torch.zeros_like(wb, dtype=torch.float64)
        out[name] = (wb.double() + wt * dt.get(name, zero) + wl * dl.get(name, zero)).float()
    return out


def peft_merged(world, adapter: Path) -> dict[str, torch.Tensor]:
    model = transformers.AutoModelForCausalLM.from_pretrained(world["base"])
    pm = peft.PeftModel.from_pretrained(model, adapter)
    return {k: v.detach().clone() for k, v in pm.merge_and_unload().state_dict().items()}


def assert_states_close(got, want, atol=1e-6):
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=atol, rtol=0, msg=k)


def recipe(world, task="task", lang="lang", **kw):
    data = {
        "method": "layer_swap",
        "task_expert": str(world[task]),
        "language_expert": str(world[lang]),
    }
    data.setdefault("bottom", 1)
    data.setdefault("top", 1)
    data.update(kw)
    return parse_recipe(data)


def test_is_lora_adapter(world):
    assert is_lora_adapter(world["task"])
    assert not is_lora_adapter(world["base"])
    assert not is_lora_adapter(world["root"] / "missing")


def test_transitions_and_components_exact(world, tmp_path):
    r = recipe(
        world,
        bottom_transition=1,
        top_transition=1,
        transition_weights={"task": 3.0, "language": 1.0},
        mlp="task",
    )
    out = merge_lora_to_disk(r, tmp_path / "m")
    owner = {"self_attn": zone_table(1, 1, 1, 1), "mlp": ["task"] * L}
    assert_states_close(
        peft_merged(world, out), expected(world, "task", "lang", owner, (0.75, 0.25))
    )
    assert {p.name for p in out.iterdir()} >= {
        "adapter_config.json",
        "adapter_model.safetensors",
        "layerswap_recipe.yaml",
        "README.md",
    }

    # Owned modules are the sources' tensors, bit for bit; transitions are rank-concatenated.
    got = load_file(out / "adapter_model.safetensors")
    task = load_file(world["task"] / "adapter_model.safetensors")
    lang = load_file(world["lang"] / "adapter_model.safetensors")
    q = "base_model.model.model.layers.{}.self_attn.q_proj.lora_{}.weight"
    up = "base_model.model.model.layers.{}.mlp.up_proj.lora_{}.weight"
    for ab in "AB":
        assert torch.equal(got[q.format(0, ab)], lang[q.format(0, ab)])
        assert torch.equal(got[q.format(2, ab)], task[q.format(2, ab)])
        assert torch.equal(got[up.format(0, ab)], task[up.format(0, ab)])
    assert got[q.format(1, "A")].shape == (8, 32) and got[q.format(1, "B")].shape[1] == 8
    cfg = json.loads((out / "adapter_config.json").read_text())
    attn = ("q_proj", "k_proj", "v_proj", "o_proj")
    concatenated = {f"model.layers.{i}.self_attn.{p}" for i in (1, 4) for p in attn}
    assert cfg["rank_pattern"] == {re.escape(n): 8 for n in concatenated}
    assert set(cfg["alpha_pattern"]) == {re.escape(n) for n in concatenated}


def test_fold_equals_merged_adapter(world, tmp_path):
    kw = dict(bottom_transition=1, top_transition=1, base=str(world["base"]))
    adapter = merge_lora_to_disk(recipe(world, **kw), tmp_path / "a")
    folded = merge_lora_to_disk(recipe(world, **kw), tmp_path / "f", fold=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(folded)
    assert (folded / "config.json").exists() and (folded / "layerswap_recipe.yaml").exists()
    assert_states_close(dict(model.state_dict()), peft_merged(world, adapter))


def test_different_rank_alpha_and_targets_exact(world, tmp_path):
    r = recipe(world, "task2", "lang2", bottom=2, bottom_transition=1, top_transition=1)
    out = merge_lora_to_disk(r, tmp_path / "m")
    owner = {c: zone_table(2, 1, 1, 1) for c in ("self_attn", "mlp")}
    assert_states_close(peft_merged(world, out), expected(world, "task2", "lang2", owner))
    # Language-owned MLP modules: the language adapter has none, so no module is created there.
    targets = json.loads((out / "adapter_config.json").read_text())["target_modules"]
    assert "model.layers.0.mlp.up_proj" not in targets
    assert "model.layers.0.self_attn.k_proj" not in targets
    assert {"model.layers.0.self_attn.q_proj", "lm_head", "model.layers.2.mlp.up_proj"} <= set(
        targets
    )


def test_magnitude_weights(world, tmp_path):
    r = recipe(
        world,
        bottom_transition=1,
        top_transition=1,
        transition_weights="magnitude",
        base=str(world["base"]),
    )
    out = merge_lora_to_disk(r, tmp_path / "m")
    base = load_file(world["base"] / "model.safetensors")
    inv = []
    for side in ("task", "lang"):
        d = deltas(world[side])
        rows = [
            d[n].abs().mean(dim=-1).reshape(-1)
            if n in d
            else torch.zeros(t.shape[0] if t.dim() == 2 else 1)
            for n, t in base.items()
            if t.dim() in (1, 2)
        ]
        inv.append(1.0 / float(torch.cat([x.double() for x in rows]).mean()))
    w = (inv[0] / sum(inv), inv[1] / sum(inv))
    owner = {c: zone_table(1, 1, 1, 1) for c in ("self_attn", "mlp")}
    assert_states_close(peft_merged(world, out), expected(world, "task", "lang", owner, w))


def _copy(world, tmp_path, name="task") -> Path:
    return Path(shutil.copytree(world[name], tmp_path / f"bad_{name}"))


def _edit_config(path: Path, **fields) -> None:
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**cfg, **fields}))


def _edit_tensors(path: Path, fn) -> None:
    t = load_file(path / "adapter_model.safetensors")
    fn(t)
    save_file(t, path / "adapter_model.safetensors", metadata={"format": "pt"})


NAN_KEY = "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight"


def _nan(t):
    t[NAN_KEY][0, 0] = float("nan")


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("not_lora", "not a PEFT LoRA adapter"),
        ("other_base", "base_model_name_or_path"),
        ("nan", re.escape(NAN_KEY) + ".*NaN"),
        ("dora", "use_dora"),
        ("modules_to_save", "lm_head.modules_to_save.weight"),
        ("soup", "soup"),
    ],
)
def test_errors_name_the_culprit_and_write_nothing(world, tmp_path, case, match):
    bad = _copy(world, tmp_path)
    task, lang = str(bad), str(world["lang"])
    if case == "not_lora":
        lang = str(world["base"])
    elif case == "other_base":
        _edit_config(bad, base_model_name_or_path="someone/else")
    elif case == "nan":
        _edit_tensors(bad, _nan)
    elif case == "dora":
        _edit_config(bad, use_dora=True)
    elif case == "modules_to_save":
        _edit_tensors(
            bad,
            lambda t: t.update(
                {"base_model.model.lm_head.modules_to_save.weight": torch.zeros(2, 2)}
            ),
        )
    data = {
        "method": "layer_swap",
        "task_expert": task,
        "language_expert": lang,
        "bottom": 1,
        "top": 1,
    }
    if case == "soup":
        data["task_expert"] = {"soup": [task, str(world["task2"])]}
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=match) as err:
        merge_lora_to_disk(parse_recipe(data), out)
    if case == "soup":
        assert isinstance(err.value, RecipeError)
    elif case == "not_lora":
        assert str(world["base"]) in str(err.value)
    elif case != "other_base":
        assert str(bad) in str(err.value)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_merged_adapter_is_an_expert_again(world, tmp_path):
    # The first merge's rank_pattern/alpha_pattern must be read back as PEFT reads them.
    first = merge_lora_to_disk(
        recipe(world, bottom_transition=1, top_transition=1), tmp_path / "m1"
    )
    world2 = {**world, "m1": first}
    second = merge_lora_to_disk(recipe(world2, task="m1", top=0), tmp_path / "m2", progress=False)
    got, m1, lang = (
        peft_merged(world, second),
        peft_merged(world, first),
        peft_merged(world, world["lang"]),
    )
    for name, t in got.items():
        m = SLOT.search(name)
        want = lang[name] if m is not None and int(m[1]) == 0 else m1[name]
        torch.testing.assert_close(t, want, atol=1e-6, rtol=0, msg=name)


def test_cli_detects_lora_experts_and_folds(world, tmp_path):
    """`layerswap merge` on adapter experts writes an adapter, or full weights with --fold."""
    import yaml

    from layerswap.cli import main

    path = tmp_path / "recipe.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "method": "layer_swap",
                "task_expert": str(world["task"]),
                "language_expert": str(world["lang"]),
                "base": str(world["base"]),
                "bottom": 1,
                "top": 1,
                "bottom_transition": 1,
            }
        )
    )
    assert main(["merge", str(path), "--out", str(tmp_path / "adapter"), "-q"]) == 0
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    assert main(["merge", str(path), "--out", str(tmp_path / "full"), "--fold", "-q"]) == 0
    folded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "full").state_dict()
    assert_states_close(folded, peft_merged(world, tmp_path / "adapter"), atol=1e-5)


def test_a_base_other_than_the_adapters_own_is_warned_of(world, tmp_path, capsys):
    """A base shown to be another model than the adapters name (same shapes: the fold's weights
    come out silently other) is said on stderr, naming both, by the CLI, the disk merge and the
    live model; it is not refused (a mirror, a renamed repo or a QLoRA adapter's full-precision
    base differ the same way and are right). A copy of the base, a Hub id against a local copy
    of that name, a path this machine lacks, or a name differing in case only, are not warned of."""
    import yaml

    from layerswap.cli import main
    from layerswap.trainables.merge.live import ExpertCache

    other = world["root"] / "fam" / "task"  # the same tiny Llama shapes, other weights
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**recipe(world).model_dump(mode="json"), "base": str(other)}))
    capsys.readouterr()
    assert main(["merge", str(path), "--out", str(tmp_path / "out"), "--fold", "-q"]) == 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("layerswap: warning: base") and str(other) in err, err
    assert str(world["base"]) in err and len(err.splitlines()) == 1, err
    merge_lora_to_disk(recipe(world, base=str(other)), tmp_path / "unfolded")
    assert "is not the model the adapters name" in capsys.readouterr().err
    ExpertCache(str(other)).adapter(str(world["task"]))
    assert "is not the model the adapters name" in capsys.readouterr().err
    copy = Path(shutil.copytree(world["base"], tmp_path / "base-copy"))
    want = load_file(merge_lora_to_disk(recipe(world, base=str(world["base"])), tmp_path / "a", fold=True) / "model.safetensors")  # fmt: skip
    got = load_file(merge_lora_to_disk(recipe(world, base=str(copy)), tmp_path / "b", fold=True) / "model.safetensors")  # fmt: skip
    assert all(torch.equal(got[k], want[k]) for k in want)
    named = {}
    for side in ("task", "lang"):
        named[side] = _copy(world, tmp_path, side)
    for trained_on, base in [
        ("someorg/base-copy", str(copy)),  # a Hub id and a local copy of that name
        ("/cluster/scratch/runs/world/base", str(world["base"])),  # the training node's path
    ]:
        for side in ("task", "lang"):
            _edit_config(named[side], base_model_name_or_path=trained_on)
        capsys.readouterr()
        merge_lora_to_disk(recipe(named, base=base), tmp_path / f"n{len(trained_on)}")
        assert "warning" not in capsys.readouterr().err, (trained_on, base)
    assert not _shown_different("SomeOrg/Llama-Base", "someorg/llama-base")  # one repo, case aside
    assert _shown_different("someorg/llama-base", "otherorg/llama-base")
