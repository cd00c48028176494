"""Experts with different tokenizers are refused by the disk merge (trainables/merge/tokenizer_match.py);
one tokenizer saved in other bytes, or a folder with no tokenizer, still merges."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from merge_expect import merge, swap_fields

from layerswap.cli import main


def _language_copy(family, tmp_path: Path, edit) -> Path:
    lang = Path(shutil.copytree(family.paths["language"], tmp_path / "lang"))
    edit(lang)
    return lang


def _edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def _permute_vocab(lang: Path) -> None:
    """Same size, other ids: the red team's case (embedding rows mean other tokens)."""

    def fn(tj):
        vocab = tj["model"]["vocab"]
        tj["model"]["vocab"] = dict(zip(vocab, reversed(list(vocab.values())), strict=True))

    _edit_json(lang / "tokenizer.json", fn)


def _other_added_token(lang: Path) -> None:
    for folder in (lang, lang.parent / "task"):
        name = "<x>" if folder == lang else "<y>"
        _edit_json(
            folder / "tokenizer_config.json",
            lambda c, name=name: c.update(added_tokens_decoder={"95": {"content": name}}),
        )


def _resaved(lang: Path) -> None:
    """One tokenizer in other bytes: indented, keys reordered, merges as "a b" strings."""
    tj = json.loads((lang / "tokenizer.json").read_text())
    tj["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]]  # fmt: skip
    (lang / "tokenizer.json").write_text(json.dumps(dict(reversed(list(tj.items()))), indent=2))


def _no_tokenizer(lang: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (lang / name).unlink()


def test_different_vocabulary_is_refused_by_the_cli(family, tmp_path, capsys):
    lang = _language_copy(family, tmp_path, _permute_vocab)
    recipe = tmp_path / "recipe.yaml"
    fields = swap_fields(family, language_expert=str(lang), base=None, bottom=3, top=2)
    recipe.write_text(yaml.safe_dump(fields))
    assert main(["merge", str(recipe), "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "tokenizer.json" in err and str(lang) in err and str(family.paths["task"]) in err, err
    assert not (tmp_path / "out").exists()


def test_other_added_token_is_refused(family, tmp_path):
    task = Path(shutil.copytree(family.paths["task"], tmp_path / "task"))
    lang = _language_copy(family, tmp_path, _other_added_token)
    fields = swap_fields(family, task_expert=str(task), language_expert=str(lang), bottom=3, top=2)
    with pytest.raises(ValueError, match=r"tokenizer_config\.json"):
        merge(fields, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit", [_resaved, _no_tokenizer])
def test_same_or_unknown_tokenizer_merges(family, tmp_path, edit):
    lang = _language_copy(family, tmp_path, edit)
    merge(swap_fields(family, language_expert=str(lang), bottom=3, top=2), tmp_path / "out")
    assert (tmp_path / "out" / "tokenizer.json").is_file()  # the task expert's, copied


def test_merges_written_either_way_are_one_tokenizer(tmp_path):
    """tokenizers < 0.20 writes a merge as "a b", later versions as ["a", "b"]: one tokenizer."""
    from layerswap.trainables.merge.tokenizer_match import tokenizer_fingerprint

    prints = []
    for i, merges in enumerate((["a b", "ab c"], [["a", "b"], ["ab", "c"]], [["a", "b"]])):
        (tmp_path / str(i)).mkdir()
        model = {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3}, "merges": merges}
        (tmp_path / str(i) / "tokenizer.json").write_text(json.dumps({"model": model}))
        prints.append(tokenizer_fingerprint(tmp_path / str(i)))
    assert prints[0] == prints[1] != prints[2]
