"""`layerswap prefetch` and the merge's own Hub download keep the same files of a model repo, the
chat template transformers 5.x saves (chat_template.jinja) among them: huggingface_hub's own
filter (what snapshot_download applies) is run on a folder the installed transformers saved.
Run: .venv/bin/python -m pytest -q tests/trainables/test_model_files.py
"""

from __future__ import annotations

import huggingface_hub
import pytest
from huggingface_hub.utils import filter_repo_objects
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from layerswap.trainables.merge.engine import resolve_ref
from layerswap.trainables.prefetch import fetch_model


@pytest.fixture
def saved_repo(tmp_path) -> list[str]:
    """The files of a model repo whose tokenizer the installed transformers saved with a chat
    template (and a named one), plus weights in the formats a repo may ship."""
    vocab = {"a": 0, "[UNK]": 1}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")))  # fmt: skip
    tok.chat_template = {"default": "{{ messages }}", "tool_use": "{{ tools }}"}
    tok.save_pretrained(tmp_path)
    files = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()]
    assert "chat_template.jinja" in files  # transformers' own layout, which this test is about
    return sorted([*files, "config.json", "model.safetensors", "pytorch_model.bin", "original/consolidated.00.pth"])  # fmt: skip


def _kept(monkeypatch, download) -> set[str]:
    """The files `download(ref)` would fetch, by the patterns it hands snapshot_download."""
    seen: dict = {}

    def snapshot_download(repo_id, allow_patterns=None, ignore_patterns=None, **kw):
        seen.update(allow=allow_patterns, ignore=ignore_patterns)
        return "/nonexistent"

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    download("org/model")
    return seen


def test_prefetch_and_the_merge_download_keep_the_chat_template(saved_repo, monkeypatch):
    for download in (fetch_model, resolve_ref):
        pats = _kept(monkeypatch, download)
        kept = set(filter_repo_objects(saved_repo, allow_patterns=pats["allow"], ignore_patterns=pats["ignore"]))  # fmt: skip
        want = set(saved_repo) - {"pytorch_model.bin", "original/consolidated.00.pth"}
        assert kept == want, download.__name__
        assert any(f.startswith("additional_chat_templates/") for f in kept)
