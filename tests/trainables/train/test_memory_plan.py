"""The memory plan (trainables/train/memory_plan.py): parameter counts match real models and the
modes' own freezing (read from the mode table), byte lines match hand arithmetic, and
strategy/precision move them as they should.

Run: .venv/bin/python -m pytest tests/trainables/train/test_memory_plan.py
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from layerswap.spaces.train_experiment import parse_train_experiment
from layerswap.trainables.train.memory_plan import GIB, format_plan, memory_plan
from layerswap.trainables.train.model_shape import KNOWN_CONFIGS, load_model_config, model_shape
from layerswap.trainables.train.modes import prepare

# h 64, i 128, 2 layers, 4 heads x 16, 2 kv heads, vocab 100, untied: 86,848 parameters:
# embed 6400 + lm_head 6400 + final norm 64 + 2 x (q 4096 + k 2048 + v 2048 + o 4096
# + gate/up/down 3 x 8192 + 2 norms x 64 = 36,992).
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
    tie_word_embeddings=False,
    dtype="bfloat16",
)
TINY_PARAMS, TINY_NON_LINEAR = 86_848, 6400 + 64 + 2 * 128  # embedding and norms

MODES = {
    "full": "full",
    "lora": {"type": "lora", "rank": 4, "alpha": 8},
    "lora_qv": {"type": "lora", "rank": 3, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    "partial": {"type": "partial", "partition": {"bottom": 1, "top": 0}, "train": "task"},
    "partial_lora": {
        "type": "partial",
        "partition": {"bottom": 1, "top": 0, "attention": "task"},
        "train": "language",
        "lora": {"rank": 2},
    },
    "simultaneous": {
        "type": "simultaneous",
        "partition": {"bottom": 1, "top": 0, "non_layer": "language"},
    },
    "simultaneous_lora": {
        "type": "simultaneous",
        "partition": {"bottom": 1, "top": 0},
        "lora": {"rank": 2},
    },
    "mix": "mix",
    "mix_lora": {"type": "mix", "lora": {"rank": 2}},
}


def _exp(mode="full", hyper=None, scaling=None, precision=None, **over):
    two = (mode if isinstance(mode, str) else mode["type"]) in ("simultaneous", "mix")
    cfg = {
        "name": "p",
        "base": "tiny",
        "kind": "math",
        "language": "en",
        "datasets": [{"path": "a.jsonl"}] + ([{"path": "b.jsonl"}] if two else []),
        "mode": mode,
        "hyper": {"lr": 1e-4, "max_steps": 1, "batch_size": 8, "seq_len": 8} | (hyper or {}),
        # GPU plans unless a test asks otherwise (the shipped real configs all train on GPUs)
        "scaling": {"use_gpu": True} | (scaling or {}),
    }
    if precision is not None:
        cfg["precision"] = precision
    return parse_train_experiment(cfg | over, source="test")


def _lines(plan) -> dict[str, int]:
    return {x.label: x.nbytes for x in plan.lines}


@pytest.mark.parametrize("tied", [False, True])
def test_param_count_is_the_models(tied):
    cfg = LlamaConfig(**(TINY | {"tie_word_embeddings": tied}))
    model = LlamaForCausalLM(cfg)
    plan = memory_plan(_exp(), cfg)
    assert plan.params_total == plan.params_base == sum(p.numel() for p in model.parameters())
    assert plan.params_total == TINY_PARAMS - (6400 if tied else 0)


@pytest.mark.parametrize("name", list(MODES))
def test_trainable_count_is_what_the_mode_trains(name):
    """The plan's counts equal those of the real mode (PEFT adapters included) on the model."""
    cfg = LlamaConfig(**TINY)
    exp = _exp(MODES[name])
    torch.manual_seed(0)
    prep = prepare(LlamaForCausalLM(cfg), exp, cfg.num_hidden_layers)
    params = list(prep.model.parameters())
    plan = memory_plan(exp, cfg)
    assert plan.params_total == sum(p.numel() for p in params)
    assert plan.params_trainable == sum(p.numel() for p in params if p.requires_grad)
    if name == "lora":  # what PEFT itself reports
        assert plan.params_trainable == prep.model.get_nb_trainable_parameters()[0]
        assert plan.params_trainable == 2 * 4 * (128 + 96 + 96 + 128 + 3 * 192)  # r*(in+out)


def test_full_bf16_mixed_bytes_by_hand():
    plan = memory_plan(_exp(hyper={"micro_batch_size": 2}), LlamaConfig(**TINY))
    lines = _lines(plan)
    p = TINY_PARAMS
    assert lines["weights: trainable float32"] == 4 * p
    assert lines["gradients float32"] == 4 * p
    assert lines["AdamW moments 2 x float32"] == 8 * p
    assert lines["autocast copy of trainable Linear weights"] == 2 * (p - TINY_NON_LINEAR)
    # per token per layer: 2*(attention 640 + MLP 64 + 4*128) + norms 16*64 = 3456 bytes;
    # 2 x 8 tokens; the residual stream is fp32 (the embedding's fp32 master)
    assert lines["activations (without gradient checkpointing)"] == 16 * 3 * 3456
    assert plan.activations_other == 16 * (2 * 4 * 64 + 2 * 3456)
    assert lines["logits + fp32 loss"] == 16 * (100 * 10 + 8 * 64 + 2 * 64)
    assert "DDP gradient buckets" not in lines and plan.fits is None
    state = 16 * p + 2 * GIB  # weights, grads, moments, CUDA overhead (one worker: no NCCL)
    backward = 2 * (p - TINY_NON_LINEAR) + 16 * 3 * 3456 + 16 * 1640
    assert plan.gpu_total == state + max(backward, 4 * p)


def test_fsdp_divides_the_sharded_state_by_workers():
    cfg = LlamaConfig(**TINY)
    ddp = _lines(memory_plan(_exp(), cfg))
    fsdp_plan = memory_plan(_exp(scaling={"num_workers": 4, "strategy": "fsdp"}), cfg)
    fsdp = _lines(fsdp_plan)
    assert fsdp["weights: trainable float32, sharded /4"] == ddp["weights: trainable float32"] // 4
    assert fsdp["AdamW moments 2 x float32, sharded /4"] == ddp["AdamW moments 2 x float32"] // 4
    assert fsdp["gradients float32, sharded /4"] == ddp["gradients float32"] // 4
    # the root unit (embed 6400 + lm_head 6400 + norm 64) and two layers, in bf16
    assert fsdp["FSDP gathered params (root + 2 layers)"] == 2 * (12_864 + 2 * 36_992)
    assert fsdp["FSDP unsharded grads (largest unit)"] == 6 * 36_992  # bf16 + fp32 reduce
    assert "autocast copy of trainable Linear weights" not in fsdp
    more = memory_plan(_exp(scaling={"num_workers": 8, "strategy": "fsdp"}), cfg)
    assert more.gpu_total < fsdp_plan.gpu_total


def test_bf16_pure_needs_less_than_mixed_and_fp32_more():
    cfg = LlamaConfig(**TINY)
    pure, mixed, fp32 = (memory_plan(_exp(precision=p), cfg) for p in ("bf16-pure", "bf16-mixed", "fp32"))  # fmt: skip
    assert pure.gpu_total < mixed.gpu_total < fp32.gpu_total
    assert _lines(pure)["AdamW moments 2 x bfloat16"] * 2 == _lines(mixed)["AdamW moments 2 x float32"]  # fmt: skip
    assert "precision bf16-mixed" in memory_plan(_exp(), cfg).setup  # auto on a bf16 config
    assert "precision fp32" in memory_plan(_exp(), LlamaConfig(**TINY | {"dtype": "float32"})).setup  # fmt: skip


def test_lora_keeps_the_frozen_base_in_its_dtype():
    lines = _lines(memory_plan(_exp(MODES["lora"]), LlamaConfig(**TINY)))
    assert lines["weights: frozen bfloat16"] == 2 * TINY_PARAMS


def test_cpu_offload_moves_sharded_state_to_cpu():
    cfg = LlamaConfig(**TINY)
    sc = {"num_workers": 4, "strategy": "fsdp"}
    on = memory_plan(_exp(scaling=sc | {"cpu_offload": True}), cfg)
    off = memory_plan(_exp(scaling=sc), cfg)
    assert on.gpu_total < off.gpu_total
    sharded = sum(x.nbytes for x in off.lines if "sharded" in x.label and x.phase == "state")
    # 4 workers' state; no foreach temporary: offloaded AdamW steps on the CPU tensor by tensor
    assert on.cpu_total == 4 * sharded
    assert "CPU RAM per node" in format_plan(on) and "CPU RAM" not in format_plan(off)


def test_fits_and_unknown_memory():
    cfg = LlamaConfig(**TINY)
    assert memory_plan(_exp(scaling={"accelerator_type": "h100"}), cfg).fits is True
    small = memory_plan(_exp(), cfg, gpu_memory=1.0)
    assert small.fits is False and "DOES NOT FIT on --gpu-memory (1.0 GiB)" in format_plan(small)
    odd = memory_plan(_exp(scaling={"accelerator_type": "TPU-v9"}), cfg)
    assert odd.fits is None and "unknown for accelerator_type 'TPU-v9'" in format_plan(odd)
    with pytest.raises(ValueError, match=r"--gpu-memory.*-3"):
        memory_plan(_exp(), cfg, gpu_memory=-3)


def test_a_family_train_refuses_is_planned_with_a_note():
    """A Gemma2 base is planned (the figures hold for its shape) and the plan says training and
    the merge refuse it; a Llama plan says nothing of the kind."""
    from transformers import Gemma2Config

    gemma = Gemma2Config(**{k: v for k, v in TINY.items() if k != "dtype"}, head_dim=16)
    note = "note: layerswap train and merge refuse this base: model_type 'gemma2' is not supported"
    assert note in format_plan(memory_plan(_exp(), gemma))
    assert "note:" not in format_plan(memory_plan(_exp(), LlamaConfig(**TINY)))


def test_a_cpu_run_plans_host_memory_per_worker():
    """A CPU run has no CUDA context and no GPU to fit: its plan says host memory per worker."""
    cfg = LlamaConfig(**TINY)
    gpu, cpu = memory_plan(_exp(), cfg), memory_plan(_exp(scaling={"use_gpu": False, "num_workers": 2}), cfg)  # fmt: skip
    assert "CUDA context + NCCL overhead" in _lines(gpu) and "CUDA context + NCCL overhead" not in _lines(cpu)  # fmt: skip
    assert _lines(cpu)["process: Python, torch, transformers, Ray"] > 0.3 * 2**30  # measured 0.39 GiB  # fmt: skip
    text = format_plan(cpu)
    assert "GPU" not in text.replace("use_gpu", ""), text
    assert "per worker (host RAM)" in text
    total = next(line for line in text.splitlines() if line.startswith("  total per worker"))
    assert len(total) == len(next(line for line in format_plan(gpu).splitlines() if line.startswith("  total per GPU")))  # fmt: skip
    assert f"about {cpu.gpu_total / 2**30:.1f} GiB of host memory per worker, " in text
    assert cpu.fits is None
    # cpu_offload on a CPU run (the gloo tests' set-up): its offloaded state is host memory too
    off = memory_plan(_exp(scaling={"use_gpu": False, "num_workers": 2, "strategy": "fsdp", "cpu_offload": True}), cfg)  # fmt: skip
    node = 2 * off.gpu_total / 2**30 + off.cpu_total / 2**30
    assert off.cpu_total > 0 and f"{node:.1f} GiB for its 2 worker(s) on one node with the offloaded state" in format_plan(off)  # fmt: skip
    with pytest.raises(ValueError, match=r"--gpu-memory 10: p trains on CPUs"):
        memory_plan(_exp(scaling={"use_gpu": False}), cfg, gpu_memory=10)


def test_config_sources(tmp_path):
    LlamaConfig(**TINY).save_pretrained(tmp_path)
    cfg, source = load_model_config(str(tmp_path))
    assert cfg.hidden_size == 64 and source == f"config.json in {tmp_path}"
    with pytest.raises(ValueError, match="not a model folder"):
        load_model_config(str(tmp_path / "missing"))
    cfg, source = load_model_config("meta-llama/Llama-3.1-8B-Instruct")
    if "built-in" in source:  # no HF cache here: the table's copy
        assert KNOWN_CONFIGS["meta-llama/Llama-3.1-8B-Instruct"]["num_key_value_heads"] == 8
    shape = model_shape(cfg)
    assert sum(shape.params.values()) == 8_030_261_248  # Llama 3.1 8B's published count


@pytest.mark.parametrize(
    ("base", "cls", "params", "card"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen2ForCausalLM", 7_615_616_512, "7.62B"),
        ("CohereForAI/aya-expanse-8b", "CohereForCausalLM", 8_028_033_024, "8.03B"),
        ("tiiuae/Falcon3-7B-Instruct", "LlamaForCausalLM", 7_455_550_464, "7.46B"),
    ],
)
def test_built_in_copies_of_the_other_models(base, cls, params, card):
    """The follow-up paper's other three models plan offline; their counts are the Hub cards'
    sizes (rounded there to 10M), tied embeddings (Aya) counted once."""
    cfg, source = load_model_config(base)
    if "built-in" not in source:  # a cached config.json was read instead: it must agree
        assert {k: getattr(cfg, k) for k in ("hidden_size", "num_hidden_layers")} == {
            k: KNOWN_CONFIGS[base][k] for k in ("hidden_size", "num_hidden_layers")
        }
    shape = model_shape(cfg)
    with torch.device("meta"):
        assert type(AutoModelForCausalLM.from_config(cfg)).__name__ == cls
    assert sum(shape.params.values()) == params and f"{params / 1e9:.2f}B" == card
    assert cfg.tie_word_embeddings == (base == "CohereForAI/aya-expanse-8b")


def test_the_plan_reads_what_a_mode_trains_from_the_mode_table(monkeypatch):
    """A mode added to trainables.train.modes.MODES reaches the memory plan with no other edit."""
    from layerswap.trainables.train import modes

    def norms_only(exp, shape):  # a mode that trains the norm weights alone
        norms = frozenset(n for n in shape.params if "norm" in n)
        return modes.Split(dict(shape.params), norms, frozenset(), {})

    monkeypatch.setitem(modes.MODES, "norms", modes.TrainingMode(modes._full, norms_only))
    exp = _exp()
    exp = exp.model_copy(update={"mode": SimpleNamespace(type="norms", lora=None)})
    plan = memory_plan(exp, LlamaConfig(**TINY))
    assert plan.params_trainable == 64 + 2 * 2 * 64  # the final norm and two per layer
    assert plan.params_total == TINY_PARAMS


def test_an_unknown_mode_is_an_error_naming_it():
    exp = _exp().model_copy(update={"mode": SimpleNamespace(type="bogus", lora=None)})
    with pytest.raises(ValueError, match=r"unknown training mode 'bogus'; known modes: full, lora"):
        memory_plan(exp, LlamaConfig(**TINY))
    with pytest.raises(ValueError, match=r"unknown training mode 'bogus'"):
        prepare(LlamaForCausalLM(LlamaConfig(**TINY)), exp, 2)
