"""trainables/devices.py on this CPU-only machine: an explicit GPU is an error naming the setting
and why, "auto" says what it chose, and a large model runs on a CPU only with the opt-in.

Run: .venv/bin/python -m pytest -q tests/trainables/test_devices.py
"""

from __future__ import annotations

import pytest
import torch

from layerswap.trainables import devices as D

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


def test_an_explicit_cuda_device_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"device 'cuda': torch .* sees no usable CUDA GPU"):
        D.resolve_device("cuda")
    with pytest.raises(ValueError, match="expected auto, cpu, cuda, cuda:N or mps"):
        D.resolve_device("gpu")


def test_auto_says_what_it_chose_and_why():
    device, why = D.explain_device("auto")
    assert device == "cpu" and why.startswith("auto: torch ") and "no usable CUDA GPU" in why
    assert "install" not in why  # the CPU wheel is what a CPU user was told to install
    assert D.explain_device("cpu") == ("cpu", "as configured")


def test_a_gpu_asked_for_needs_cuda_or_the_opt_in(monkeypatch):
    monkeypatch.delenv(D.ALLOW_CPU, raising=False)
    with pytest.raises(D.DeviceUnusable, match=r"scaling\.use_gpu asks for a GPU, but torch") as e:
        D.require_cuda("scaling.use_gpu")
    assert "LAYERSWAP_ALLOW_CPU=1" in str(e.value)
    monkeypatch.setenv(D.ALLOW_CPU, "1")
    D.require_cuda("scaling.use_gpu")  # allowed: no error


def test_a_large_model_on_the_cpu_needs_the_opt_in(monkeypatch):
    monkeypatch.delenv(D.ALLOW_CPU, raising=False)
    with pytest.raises(D.DeviceUnusable, match=r"promotion: a 8\.0 B-parameter model would run on the CPU"):  # fmt: skip
        D.check_cpu_size(8_030_261_248, "cpu", "promotion")
    D.check_cpu_size(D.LARGE_ON_CPU - 1, "cpu", "promotion")  # small: fine
    D.check_cpu_size(8_030_261_248, "cuda", "promotion")  # on a GPU: fine
    monkeypatch.setenv(D.ALLOW_CPU, "1")
    D.check_cpu_size(8_030_261_248, "cpu", "promotion")


def test_config_params_counts_the_real_8b_shape_without_memory():
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)  # fmt: skip
    assert D.config_params(cfg) == 8_030_261_248  # Llama-3.1-8B's published count


def test_evaluate_refuses_a_large_in_memory_model_on_the_cpu(monkeypatch):
    """Before lm-eval indexes a task: the check runs on the model's size, not after hours."""
    from layerswap.trainables.evaluate.harness import _check_size

    monkeypatch.delenv(D.ALLOW_CPU, raising=False)

    class Big(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.empty(40_000, 40_000, device="meta"))

    with pytest.raises(D.DeviceUnusable, match=r"evaluation of Big: a 1\.6 B-parameter model"):
        _check_size(Big(), "cpu")
    _check_size(Big(), "cuda")
