"""`layerswap train` refuses a base whose tokenizer has no chat template before it creates
anything (cli/train_inputs.py): training formats every row with the template, and such a base
failed after the run folder was marked, with transformers' own message (on Ray, in a worker).

Run: .venv/bin/python -m pytest -q tests/cli/test_train_template.py   (~5 s)
"""

from __future__ import annotations

import json
import re
import shutil

import huggingface_hub.constants as hub_constants
import pytest
import yaml
from transformers import AutoTokenizer

from layerswap.cli import main
from layerswap.cli.train_inputs import check_inputs
from tests.trainables.train.train_helpers import make_exp

SAID = "its tokenizer has no default chat template (no chat_template.jinja, no additional_chat_templates/default.jinja, no `chat_template` in tokenizer_config.json)"  # fmt: skip


def _strip_template(folder) -> None:
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    cfg = folder / "tokenizer_config.json"
    cfg.write_text(json.dumps({k: v for k, v in json.loads(cfg.read_text()).items() if k != "chat_template"}))  # fmt: skip


def test_a_base_without_a_chat_template_is_refused_before_the_run_folder(tiny_world, tmp_path, capsys):  # fmt: skip
    base = tmp_path / "base"
    shutil.copytree(tiny_world / "base", base)
    _strip_template(base)
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(make_exp(tiny_world, base=str(base)).model_dump(mode="json")))
    run = tmp_path / "run"
    assert main(["train", str(f), "--out", str(run), "--no-ray"]) == 2
    assert f"base: {base}: {SAID}" in capsys.readouterr().err
    assert not run.exists()


def test_a_cached_hub_base_without_a_chat_template_is_refused(tiny_world, tmp_path, monkeypatch):
    # the Hub cache's layout: a snapshot with the base's configs, chat_template.jinja known absent
    repo = tmp_path / "hub/models--acme--plain"
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs/main").write_text("0" * 40)
    (repo / ".no_exist" / ("0" * 40)).mkdir(parents=True)
    (repo / ".no_exist" / ("0" * 40) / "chat_template.jinja").write_text("")
    for name in ("config.json", "tokenizer_config.json"):
        shutil.copy(tiny_world / "base" / name, snap / name)
    _strip_template(snap)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ValueError, match=re.escape(f"base: acme/plain: {SAID}")):
        check_inputs(make_exp(tiny_world, base="acme/plain"))
    (snap / "chat_template.jinja").write_text("{{ messages }}")  # the template cached: passes
    check_inputs(make_exp(tiny_world, base="acme/plain"))


TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
# A base's templates: tokenizer_config.json's `chat_template`, the files under
# additional_chat_templates/ (name -> text), and whether transformers then has a default one.
LAYOUTS = {
    "a default under additional_chat_templates/": (None, {"default": TEMPLATE}, True),
    # template files replace tokenizer_config.json's: a named one alone leaves no default
    "tokenizer_config's, beside a named template file": (TEMPLATE, {"tool_use": TEMPLATE}, False),
    "a list naming no default": ([{"name": "tool_use", "template": TEMPLATE}], {}, False),
    "a list naming a default": ([{"name": "default", "template": TEMPLATE}], {}, True),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_preflight_accepts_the_default_template_transformers_would_use(tiny_world, tmp_path, layout):  # fmt: skip
    base = tmp_path / "base"
    shutil.copytree(tiny_world / "base", base)
    _strip_template(base)
    in_config, files, usable = LAYOUTS[layout]
    if in_config is not None:
        cfg = json.loads((base / "tokenizer_config.json").read_text())
        (base / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": in_config}))
    if files:
        (base / "additional_chat_templates").mkdir()
    for name, text in files.items():
        (base / "additional_chat_templates" / f"{name}.jinja").write_text(text)
    tok = AutoTokenizer.from_pretrained(base)  # what training loads: has it a default?
    try:
        tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
        transformers_has = True
    except ValueError:
        transformers_has = False
    assert transformers_has is usable
    if usable:
        check_inputs(make_exp(tiny_world, base=str(base)))
    else:
        with pytest.raises(ValueError, match=re.escape(f"base: {base}: {SAID}")):
            check_inputs(make_exp(tiny_world, base=str(base)))
