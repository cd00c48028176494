"""The papers' model families end to end on tiny random-weight models: Llama 3.1 (llama3 rope
scaling), Qwen2.5 (q/k/v biases, tied here as in its small sizes), Aya Expanse (Cohere: parallel
attention + MLP block, one LayerNorm, logit_scale, tied), Falcon 3 (a Llama config with few wide
heads, 3:1 grouped KV) and Qwen3 (q/k norms).

Per family: (a) the cached proxy evaluator's per-item results equal lm-eval HFLM's; (b) a search
trial's live model equals the same recipe merged to disk, tensor for tensor; (c) a short training
run's checkpoint reloads with AutoModelForCausalLM as the family's class. Every model uses the
tiny world's tokenizer (its chat template is what training formats SFT rows with).

Run: .venv/bin/python -m pytest -q tests/trainables/test_families.py
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

from layerswap.search.trial import TrialRunner
from layerswap.spaces.recipe import parse_recipe
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool
from layerswap.trainables.evaluate.proxy import ProxyEvaluator
from layerswap.trainables.merge.api import merge
from layerswap.trainables.train import run_training
from tests.trainables.evaluate.proxy_fixtures import write_world
from tests.trainables.train.train_helpers import make_exp

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = 5  # a swap below: language 0, transition 1, task 2, transition 3, language 4
GEN = {"max_gen_toks": 12}
TASKS = ["mgsm_dev", "bele_dev"]
# Shared tiny shape; a family's own fields override it. initializer_range 0.2: weights large
# enough that greedy choices are not float near-ties (as tests/trainables/evaluate/proxy_fixtures).
SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.2,
)
# family -> (config class, causal LM class, the family's own config fields)
FAMILIES = {
    "llama31": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "qwen25": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True, rope_theta=1e6)),
    "aya_expanse": (
        "CohereConfig",
        "CohereForCausalLM",
        dict(logit_scale=0.125, tie_word_embeddings=True, use_qk_norm=False),
    ),
    "falcon3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=48,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=16,
            rms_norm_eps=1e-6,
            rope_theta=1000042.0,
            tie_word_embeddings=False,
        ),
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8, tie_word_embeddings=True)),
}
# Expert roles: seeded noise on every parameter of the base (stand-ins for fine-tunes).
ROLES = {"task": (0.05, 1), "language": (0.08, 2)}


@dataclass
class TinyFamily:
    """One family's checkpoints (base, task and language experts) and its classes."""

    name: str
    paths: dict[str, Path]
    model_class: str
    tied: bool

    def ref(self, role: str) -> str:
        return str(self.paths[role])


def _config(name: str, tok):
    cfg_cls, _, own = FAMILIES[name]
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    return getattr(transformers, cfg_cls)(vocab_size=len(tok), **(SMALL | ids | own))


def _save(model, tok, dst: Path) -> Path:
    model.save_pretrained(dst)
    tok.save_pretrained(dst)
    return dst


def build_family(name: str, root: Path, tok) -> TinyFamily:
    """Write `name`'s random base and two perturbed experts under `root`."""
    _, lm_cls, _ = FAMILIES[name]
    cfg = _config(name, tok)
    torch.manual_seed(0)
    base = getattr(transformers, lm_cls)(cfg).eval()
    paths = {"base": _save(base, tok, root / "base")}
    for role, (scale, seed) in ROLES.items():
        model = getattr(transformers, lm_cls).from_pretrained(paths["base"])
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # named_parameters lists a tied weight once: it stays tied
            for p in model.parameters():
                p.add_(scale * torch.randn(p.shape, generator=g))
        paths[role] = _save(model, tok, root / role)
    return TinyFamily(name, paths, lm_cls, bool(cfg.tie_word_embeddings))


@pytest.fixture(scope="module")
def tok(tiny_world):
    return transformers.AutoTokenizer.from_pretrained(tiny_world / "base")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """MGSM- and Belebele-shaped dev/test tasks, a few items each."""
    return write_world(tmp_path_factory.mktemp("family_tasks"), n_mgsm=4, n_bele=4)


@pytest.fixture(scope="module")
def evaluator(tok, tasks) -> ProxyEvaluator:
    """The cached evaluator at batch size 1 (HFLM's arithmetic row for row), one for all."""
    return ProxyEvaluator(TASKS, tok, include_path=str(tasks), gen_kwargs=GEN, batch_size=1)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def fam(request, tmp_path_factory, tok) -> TinyFamily:
    return build_family(request.param, tmp_path_factory.mktemp(request.param), tok)


def test_family_is_what_it_says(fam):
    """The fixture builds each family's distinguishing parts (else the checks below test less)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(fam.paths["base"])
    names = {n for n, _ in model.named_parameters()}
    cfg = model.config
    assert type(model).__name__ == fam.model_class and cfg.num_hidden_layers == LAYERS
    if fam.tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    heads = (cfg.num_attention_heads, cfg.num_key_value_heads, getattr(cfg, "head_dim", None))
    own = {
        "llama31": cfg.rope_parameters["rope_type"] == "llama3",
        "qwen25": "model.layers.0.self_attn.q_proj.bias" in names,
        # the parallel block: one LayerNorm a layer, no post-attention norm
        "aya_expanse": "model.layers.0.post_attention_layernorm.weight" not in names,
        "falcon3": heads == (3, 1, 16),
        "qwen3": "model.layers.0.self_attn.q_norm.weight" in names,
    }
    assert own[fam.name]
    assert getattr(cfg, "logit_scale", None) == (0.125 if fam.name == "aya_expanse" else None)


# --------------------------------------------------------------- (a) evaluator against lm-eval


def lm_eval_samples(model, tok, tasks: Path) -> dict:
    """lm-eval's own per-sample log: {task: {(doc_id, filter): sample}}."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model=HFLM(pretrained=model, tokenizer=tok, batch_size=1),
        tasks=TASKS,
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        log_samples=True,
        gen_kwargs=dict(GEN),
        bootstrap_iters=0,
        cache_requests=False,
    )
    return {t: {(s["doc_id"], s["filter"]): s for s in out["samples"][t]} for t in TASKS}


def test_evaluator_matches_lm_eval_item_by_item(fam, tok, tasks, evaluator):
    model = transformers.AutoModelForCausalLM.from_pretrained(fam.paths["task"]).eval()
    result, samples = evaluator.score(model), lm_eval_samples(model, tok, tasks)
    for r in result.items["bele_dev"]:
        s = samples["bele_dev"][(r.doc_id, "none")]
        ref = [resp[0] for resp in s["resps"]]  # [(loglikelihood, is_greedy)] per choice
        assert r.prediction == int(np.argmax([ll for ll, _ in ref])), r.doc_id
        np.testing.assert_allclose([ll for ll, _ in r.response], [ll for ll, _ in ref], atol=1e-4)
        assert r.metrics["acc,none"] == s["acc"]
    for r in result.items["mgsm_dev"]:
        for fname, filtered in r.prediction.items():
            s = samples["mgsm_dev"][(r.doc_id, fname)]
            assert r.response == s["resps"][0][0], (r.doc_id, r.response, s["resps"][0][0])
            assert filtered == s["filtered_resps"][0], (r.doc_id, fname)
    assert {len(v) for v in result.items.values()} == {4}
    # Not vacuous: every item generated text, and most items' generations differ.
    responses = [r.response for r in result.items["mgsm_dev"]]
    assert all(responses) and len(set(responses)) >= 3


# --------------------------------------------------------------- (b) live trial against disk


def _experiment(fam: TinyFamily) -> SearchExperiment:
    return SearchExperiment.model_validate(
        {
            "name": f"fam_{fam.name}",
            "language": "en",
            "base": fam.ref("base"),
            "task_experts": [fam.ref("task")],
            "language_experts": [fam.ref("language")],
            "proxies": [{"task": "bele_dev", "chance": 0.25}, {"task": "mgsm_dev"}],
            "target": "mgsm_test",
            "proxy_eval": {"limit": 4, "max_gen_toks": 8, "batch_size": 1},
        }
    )


@pytest.mark.parametrize("weights", ["uniform", pytest.param("magnitude", marks=pytest.mark.slow)])
def test_trial_model_equals_the_disk_merge(fam, tasks, tmp_path, weights):
    """One swap over all five layers: language, transition, task, transition, language; the
    transitions and the embeddings/lm_head averaged."""
    exp = _experiment(fam)
    pool = ExpertPool.from_paths([fam.ref("task")], [fam.ref("language")], fam.ref("base"))
    recipe = parse_recipe(
        {
            "method": "layer_swap",
            "task_expert": fam.ref("task"),
            "language_expert": fam.ref("language"),
            "base": fam.ref("base"),
            "bottom": 1,
            "top": 1,
            "bottom_transition": 1,
            "top_transition": 1,
            "non_layer": "average",
        }
        | ({"transition_weights": "magnitude"} if weights == "magnitude" else {})
    )
    runner = TrialRunner(exp, pool, [str(tasks)])
    res = runner.run(recipe)
    assert res.status == "ok", res.error
    out = merge(recipe, tmp_path / "merged")
    disk = {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()}
    live = dict(runner.model.named_parameters())  # a tied weight once, under embed_tokens
    assert set(disk) == set(live), set(disk) ^ set(live)
    for name, t in disk.items():
        assert torch.equal(live[name], t), name
    # Not vacuous: layers taken whole from each expert, transitions and non-layer averaged.
    experts = {role: load_file(fam.paths[role] / "model.safetensors") for role in ("task", "language")}  # fmt: skip
    same = {role: {n for n, t in disk.items() if torch.equal(t, st[n])} for role, st in experts.items()}  # fmt: skip
    layers = {role: {int(n.split(".")[2]) for n in names if ".layers." in n} for role, names in same.items()}  # fmt: skip
    assert layers == {"task": {2}, "language": {0, 4}}, layers
    assert "model.embed_tokens.weight" not in same["task"] | same["language"]
    # The merged folder loads as the family and gives the live model's logits.
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded).__name__ == fam.model_class
    ids = torch.tensor([[1, 5, 9, 17, 33]])
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, runner.model(ids).logits)


# --------------------------------------------------------------- (c) a short training run


def test_training_checkpoint_reloads_as_the_family(fam, tiny_world, tmp_path):
    exp = make_exp(tiny_world, "full", base=fam.ref("base"), hyper={"max_steps": 2, "batch_size": 4, "warmup_steps": 1})  # fmt: skip
    res = run_training(exp, workdir=tmp_path / "run")
    assert res.step == 2 and res.final_checkpoint is not None
    model = transformers.AutoModelForCausalLM.from_pretrained(res.final_checkpoint)
    assert type(model).__name__ == fam.model_class
    saved = {
        k: v
        for f in sorted(res.final_checkpoint.glob("*.safetensors"))
        for k, v in load_file(f).items()
    }
    params = dict(model.named_parameters())
    assert set(saved) == set(params), set(saved) ^ set(params)
    for name, t in saved.items():
        assert torch.equal(params[name].data, t), name
    base = transformers.AutoModelForCausalLM.from_pretrained(fam.paths["base"])
    moved = [n for n, p in base.named_parameters() if not torch.equal(p, params[n])]
    assert moved, "two full-SFT steps changed no weight"
    if fam.tied:  # still one tensor, trained once
        assert model.lm_head.weight is model.model.embed_tokens.weight
    for key in ("logit_scale", "rope_parameters", "head_dim", "tie_word_embeddings"):
        assert getattr(model.config, key, None) == getattr(base.config, key, None), key
