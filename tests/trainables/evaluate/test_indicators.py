"""Expert indicators equal lm-eval's own numbers on the tiny world (full checkpoints and LoRA).

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_indicators.py   (lm-eval runs: slow)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from layerswap.trainables.evaluate.harness import evaluate, resolve_device, write_world_tasks
from layerswap.trainables.evaluate.indicators import (
    IndicatorScorer,
    load_model,
    load_tokenizer,
    score_checkpoint,
)
from layerswap.trainables.evaluate.scoring import task_score

TASKS = ["world_mgsm_direct_en_dev", "world_belebele_xa_dev"]
GEN_TOKS = 24
LIMIT = 12


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world(tiny_world) -> Path:
    """The session's tiny world, seed 0 (tests/conftest.py)."""
    return tiny_world


@pytest.fixture(scope="module")
def tasks_dir(world, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("indicator_tasks")
    write_world_tasks(world, out)
    return str(out)


@pytest.fixture(scope="module")
def checkpoints(world, tmp_path_factory) -> dict[str, Path]:
    """base, a perturbed full checkpoint, and a LoRA adapter with non-zero B (so it matters)."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("indicator_ckpts")
    tok = load_tokenizer(world / "base")
    model = load_model(world / "base")
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(root / "full")
    tok.save_pretrained(root / "full")
    torch.manual_seed(4)
    cfg = LoraConfig(
        r=4,
        lora_alpha=8,
        use_rslora=True,
        target_modules=["q_proj", "v_proj", "up_proj", "down_proj"],
        init_lora_weights=False,  # random A and B: the adapter changes the outputs
    )
    peft_model = get_peft_model(load_model(world / "base"), cfg)
    peft_model.save_pretrained(root / "lora")
    return {"base": world / "base", "full": root / "full", "lora": root / "lora"}


def lm_eval_scores(model, tasks_dir: str, *, peft: str | None = None) -> dict:
    """lm-eval's own numbers: trainables.evaluate.harness (folder), or HFLM(peft=...) for an adapter."""
    if peft is None:
        raw = evaluate(
            str(model), TASKS, include_path=tasks_dir, limit=LIMIT, num_fewshot=0, max_gen_toks=GEN_TOKS
        )  # fmt: skip
    else:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager

        raw = lm_eval.simple_evaluate(
            model=HFLM(pretrained=str(model), peft=peft, batch_size=1, device=resolve_device()),
            tasks=TASKS,
            num_fewshot=0,
            limit=LIMIT,
            gen_kwargs={"max_gen_toks": GEN_TOKS},
            task_manager=TaskManager(include_path=tasks_dir, include_defaults=False),
            cache_requests=False,
            bootstrap_iters=0,
        )
    return {t: task_score(raw, t) for t in TASKS}


@pytest.fixture(scope="module")
def scorer(world, tasks_dir):
    return IndicatorScorer(
        TASKS, load_tokenizer(world / "base"), include_path=tasks_dir, limit=LIMIT, max_gen_toks=GEN_TOKS
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", ["base", "full"])
def test_full_checkpoints_match_lm_eval(name, checkpoints, scorer, tasks_dir):
    got = scorer.score_checkpoint(checkpoints[name])
    assert got.n_items == {t: LIMIT for t in TASKS}
    assert got.scores == pytest.approx(lm_eval_scores(checkpoints[name], tasks_dir), abs=1e-12)
    cols = got.columns()
    assert set(cols) == {f"ind__{t}" for t in TASKS} | {f"n_items__{t}" for t in TASKS}
    assert cols["n_items__world_belebele_xa_dev"] == LIMIT


@pytest.mark.slow
def test_lora_adapter_matches_lm_eval_peft(checkpoints, scorer, tasks_dir):
    from layerswap.trainables.merge.lora import is_lora_adapter

    assert is_lora_adapter(checkpoints["lora"])
    got = scorer.score_checkpoint(checkpoints["lora"])  # base read from adapter_config.json
    want = lm_eval_scores(checkpoints["base"], tasks_dir, peft=str(checkpoints["lora"]))
    assert got.scores == pytest.approx(want, abs=1e-12)
    # The adapter really changes the model (else this test would prove nothing).
    base = load_model(checkpoints["base"])
    lora = load_model(checkpoints["lora"])
    ids = torch.tensor([[1, 5, 9, 11]], device=base.device)
    assert not torch.allclose(base(ids).logits, lora(ids).logits)


@pytest.mark.slow
def test_lm_eval_backend_and_one_shot_helper(checkpoints, scorer, tasks_dir):
    want = scorer.score_checkpoint(checkpoints["full"])
    got = score_checkpoint(
        checkpoints["full"], TASKS, include_path=tasks_dir, backend="lm_eval", limit=LIMIT, max_gen_toks=GEN_TOKS
    )  # fmt: skip
    assert got.scores == want.scores and got.n_items == want.n_items


def test_bad_arguments(world, tasks_dir):
    tok = load_tokenizer(world / "base")
    with pytest.raises(ValueError, match="no indicator tasks"):
        IndicatorScorer([], tok, include_path=tasks_dir)
    with pytest.raises(ValueError, match="backend"):
        IndicatorScorer(TASKS, tok, include_path=tasks_dir, backend="vllm")
    # Indicators rank experts larger-first: a Brier-scored task is refused by both backends.
    for backend in ("proxy", "lm_eval"):
        with pytest.raises(ValueError, match="indicator world_belebele_brier_xa_dev: lm-eval's brier_score is lower-is-better"):  # fmt: skip
            IndicatorScorer([TASKS[0], "world_belebele_brier_xa_dev"], tok, include_path=tasks_dir, backend=backend)  # fmt: skip


def test_device_and_batch_size_are_checked_once(world, tasks_dir, monkeypatch):
    tok = load_tokenizer(world / "base")
    kw = dict(include_path=tasks_dir, backend="lm_eval")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    sc = IndicatorScorer(TASKS, tok, **kw)
    assert (sc.device, sc.batch_size) == ("cpu", 1)
    assert IndicatorScorer(TASKS, tok, batch_size="auto", **kw).batch_size == "auto"
    with pytest.raises(ValueError, match="batch size 'big'"):
        IndicatorScorer(TASKS, tok, batch_size="big", **kw)
    with pytest.raises(ValueError, match=r"device 'cuda': torch .* sees no usable CUDA GPU"):
        IndicatorScorer(TASKS, tok, device="cuda", **kw)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert IndicatorScorer(TASKS, tok, **kw).device == "cuda"  # chosen, never run here


def test_score_moves_the_model_to_the_scorer_device(world, scorer, monkeypatch):
    """The proxy backend runs a model where its parameters are: score() puts it there first."""
    model = load_model(world / "base", device="cpu")
    moved: list = []
    real_to = model.to
    monkeypatch.setattr(model, "to", lambda *a, **k: moved.append(a) or real_to(*a, **k))
    got = scorer.score(model)
    assert moved == [(scorer.device,)]
    assert got.n_items == {t: LIMIT for t in TASKS}


@pytest.mark.slow
def test_a_tag_indicator_scores_alike_with_both_backends(world, tasks_dir):
    """world_belebele_dev tags the en/xa/xb dev tasks: lm-eval records no trace of a tag in its
    results, so the lm_eval backend pools the members as the proxy does (it raised only after
    the whole run)."""
    tok, model = load_tokenizer(world / "base"), load_model(world / "base", device="cpu")
    kw = dict(include_path=tasks_dir, limit=4, device="cpu")
    got = {
        b: IndicatorScorer(["world_belebele_dev"], tok, backend=b, **kw).score(model)
        for b in ("proxy", "lm_eval")
    }
    assert got["proxy"].n_items == got["lm_eval"].n_items == {"world_belebele_dev": 12}
    assert got["proxy"].scores == pytest.approx(got["lm_eval"].scores, abs=1e-12)
    leaves = [f"world_belebele_{lang}_dev" for lang in ("en", "xa", "xb")]
    each = IndicatorScorer(leaves, tok, **kw).score(model).scores
    assert got["proxy"].scores["world_belebele_dev"] == pytest.approx(sum(each.values()) / 3)
