"""Which files of a Hub model repository layerswap downloads: one list for `layerswap prefetch`
(trainables/prefetch.py fetch_model) and the merge's own download of a Hub checkpoint
(trainables/merge/engine.py), so a model prefetched for an offline study has every file a run
reads. Tests: .venv/bin/python -m pytest -q tests/trainables/test_model_files.py
"""

from __future__ import annotations

# What a model snapshot needs to load: weights as safetensors, configs, tokenizer files, and the
# chat template that transformers 5.x saves beside tokenizer_config.json (chat_template.jinja,
# and named ones under additional_chat_templates/): without it an SFT run offline has no
# template. Custom modelling code (*.py) for families that ship it.
MODEL_FILES = [
    "*.json",
    "*.safetensors",
    "tokenizer*",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.py",
    "*.jinja",
    "additional_chat_templates/*",
]
# Never pickled weights (*.bin, *.pt, ...), nor the original/ consolidated checkpoints Meta ships
# beside the HF weights (another 16 GB of the same model).
MODEL_SKIP = ["original/*", "*.bin", "*.pt", "*.pth", "*.pkl", "*.ckpt"]
