"""Config of the embedded world (docs/world/index.md): dataset sizes, corpus mix, model shape,
training.

Pure data. `world_config("full" | "tiny", seed)` gives the two presets `layerswap world build` uses.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from layerswap.spaces.base import StrictModel, load_yaml, validate

WORLD_VERSION = "4"
WorldSize = Literal["full", "tiny"]
# Bounds on what a world may ask of the CPU it is built on: past these a build would run for
# days or exhaust memory (a split of 1e23 rows grew memory with no progress), not finish.
MAX_ROWS = 1_000_000  # rows of a split, documents of a corpus kind, items per language
MAX_STEPS = 1_000_000  # pretraining (and warmup) steps of a stage
MAX_LAYERS = 256
MAX_WORLD_PARAMS = 2_000_000_000  # a base pretrained on CPU: 8 GB of fp32 weights, more of AdamW
MAX_WIDTH = 65_536  # hidden and MLP widths, vocabulary, block length, heads, batch, threads


class GraftConfig(StrictModel):
    """A second pretraining stage that teaches the target languages to the outer layers only.

    The first stage (`WorldModelConfig.steps`) trains every layer on the English documents and
    the arithmetic drills alone; this one trains the bottom `bottom` and top `top` decoder layers
    (with the embeddings, final norm and lm_head) on the xa, xb and code-switched documents, a
    `replay` share of English ones mixed in, while the middle layers stay as English left them.
    The base then reads and writes xa through its outer layers into a middle that only ever
    learned English, which is how the papers explain layer swapping (multilingual models work in
    an English-like space in their middle layers).
    """

    steps: int = Field(ge=1, le=MAX_STEPS)
    """Optimizer steps of the second stage."""
    bottom: int = Field(3, ge=0, le=MAX_LAYERS)
    """Bottom decoder layers that learn the target languages."""
    top: int = Field(2, ge=0, le=MAX_LAYERS)
    """Top decoder layers that learn the target languages."""
    replay: float = Field(0.25, ge=0, lt=1)
    """Share of English (stage-one) blocks mixed into stage two (each stage-one block at most
    once)."""
    lr: float | None = Field(None, gt=0)
    """Peak learning rate of the stage (None: the model's `lr`)."""
    warmup: int = Field(30, ge=0, le=MAX_STEPS)
    """Warmup steps of the stage."""


SHA256 = r"^[0-9a-f]{64}$"
FILE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # a plain file or folder name (no path, no dotfile)
# what world/bases/NAME holds: the model `world build` would have pretrained, and the config of
# the world it was pretrained for
# The world's SFT files are named by their language: written by world/data.py, read back by a
# training experiment's language check (spaces/train_experiment.py). One place for both.
MATH_SFT = "data/sft/math_en.jsonl"  # English math problems
_SFT_NAME = re.compile(r"(?:^|/)data/sft/(?:math_(en)|lang_([a-z]+))\.jsonl$")


def lang_sft(code: str) -> str:
    """The world's SFT file of language `code`, relative to the world folder."""
    return f"data/sft/lang_{code}.jsonl"


def sft_language(path: str) -> str | None:
    """The language a path's world SFT file name states (`.../data/sft/lang_xa.jsonl`: xa), or
    None for any other path."""
    m = _SFT_NAME.search(path)
    return (m.group(1) or m.group(2)) if m else None


SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "world_config.json")


class PrebuiltBase(StrictModel):
    """A base pretrained ahead of time, on a larger budget than `world build` has, and shipped.

    `layerswap world export-base WORLD --name NAME` writes one from a built world into
    world/bases/NAME and prints the world's variant with this entry; `world build` then checks
    that the world it is building is the one the base was pretrained for (config, corpus and
    tokenizer) and copies the base instead of pretraining (world/prebuilt.py).
    """

    name: str = Field(pattern=FILE_NAME)
    """Its folder under world/bases/."""
    files: dict[str, str]
    """The shipped files (config.json, generation_config.json, model.safetensors,
    world_config.json) and the sha256 of each."""
    tokenizer_files: dict[str, str] = Field(min_length=1)
    """The tokenizer files `world build` trains and writes into base/, and the sha256 each must
    have."""
    corpus_sha256: str = Field(pattern=SHA256)
    """sha256 of that world's corpus/pretrain.txt."""
    final_pretrain_loss: float
    """The pretraining loss the base ended with (recorded in world.json)."""

    @model_validator(mode="after")
    def _files_are_names_and_hashes(self) -> PrebuiltBase:
        if sorted(self.files) != sorted(SHIPPED_FILES):
            raise ValueError(f"model.prebuilt.files: lists {sorted(self.files)}, expected exactly {list(SHIPPED_FILES)}")  # fmt: skip
        if "tokenizer.json" not in self.tokenizer_files:
            raise ValueError("model.prebuilt.tokenizer_files: lists no tokenizer.json")
        for field, table in (("files", self.files), ("tokenizer_files", self.tokenizer_files)):
            for name, digest in table.items():
                if not re.fullmatch(FILE_NAME, name) or not re.fullmatch(SHA256, digest):
                    raise ValueError(f"model.prebuilt.{field}: {name!r}: {digest!r} is not a file name and a sha256")  # fmt: skip
        return self


class WorldModelConfig(StrictModel):
    """Shape of the Llama base model and its CPU pretraining run."""

    num_layers: int = Field(12, ge=1, le=MAX_LAYERS)
    """Decoder layers."""
    hidden_size: int = Field(64, ge=8, le=MAX_WIDTH)
    """Hidden (residual stream) width."""
    intermediate_size: int = Field(192, ge=8, le=MAX_WIDTH)
    """MLP width."""
    num_heads: int = Field(4, ge=1, le=MAX_WIDTH)
    """Attention heads."""
    num_kv_heads: int = Field(2, ge=1, le=MAX_WIDTH)
    """Key/value heads (grouped-query attention)."""
    vocab_size: int = Field(1500, ge=300, le=MAX_WIDTH)
    """Tokenizer vocabulary size (the tokenizer is trained on the corpus)."""
    seq_len: int = Field(128, ge=16, le=MAX_WIDTH)
    """Pretraining block length in tokens."""
    batch_size: int = Field(16, ge=1, le=MAX_WIDTH)
    """Pretraining blocks per step."""
    steps: int = Field(500, ge=1, le=MAX_STEPS)
    """Pretraining steps (the first stage, when there is a `graft`)."""
    lr: float = Field(3e-3, gt=0)
    """Peak pretraining learning rate."""
    warmup: int = Field(30, ge=0, le=MAX_STEPS)
    """Pretraining warmup steps."""
    # 2 threads ran 5x slower on 2 shared cores (OMP spinning)
    threads: int = Field(1, ge=1, le=MAX_WIDTH)
    """torch threads while pretraining (fixed: float reductions depend on the thread split)."""
    graft: GraftConfig | None = None
    """A second pretraining stage for the outer layers (None: one stage)."""
    prebuilt: PrebuiltBase | None = None
    """A base already pretrained with these settings, shipped in world/bases/ (None: pretrain)."""

    @model_validator(mode="after")
    def _fits_a_cpu(self) -> WorldModelConfig:
        # Each width is bounded alone, but their products are what is allocated: 65,536-wide
        # layers asked for 16 GiB per matrix and died in torch's allocator.
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        kv = h // self.num_heads * self.num_kv_heads
        params = 2 * v * h + self.num_layers * (2 * h * h + 2 * h * kv + 3 * h * i)
        if params > MAX_WORLD_PARAMS:
            raise ValueError(
                f"model: {params:,} parameters (hidden_size {h}, intermediate_size {i}, "
                f"vocab_size {v}, num_layers {self.num_layers}) is more than a world pretrained "
                f"on CPU may have ({MAX_WORLD_PARAMS:,})"
            )
        return self

    @model_validator(mode="after")
    def _graft_fits(self) -> WorldModelConfig:
        g = self.graft
        if g is not None and not 0 < g.bottom + g.top < self.num_layers:
            raise ValueError(
                f"model.graft bottom {g.bottom} + top {g.top} must be between 1 and "
                f"num_layers - 1 ({self.num_layers - 1}): some middle layers stay English-only"
            )
        return self


class CorpusMix(StrictModel):
    """Number of pretraining documents per kind (a document is a few sentences or one item).

    Reading items are mostly English, so the base reads English well and xa poorly (the
    language SFT's reading items close that gap); worked math solutions appear only as
    "Problem:/Solution:" text, so the base answers MGSM prompts with bare numbers until math SFT
    teaches it to show its work there (world/data.py make_corpus).
    """

    en_math: int = Field(3000, ge=0, le=MAX_ROWS)
    """English math word problems."""
    en_text: int = Field(800, ge=0, le=MAX_ROWS)
    """English everyday passages."""
    en_belebele: int = Field(2000, ge=0, le=MAX_ROWS)
    """English reading items in Belebele's layout, answered."""
    xa_text: int = Field(2500, ge=0, le=MAX_ROWS)
    """xa everyday passages."""
    xb_text: int = Field(300, ge=0, le=MAX_ROWS)
    """xb everyday passages."""
    xa_parallel: int = Field(600, ge=0, le=MAX_ROWS)
    """English/xa parallel sentence pairs."""
    xb_parallel: int = Field(80, ge=0, le=MAX_ROWS)
    """English/xb parallel sentence pairs."""
    xa_math: int = Field(150, ge=0, le=MAX_ROWS)
    """xa math word problems."""
    xb_math: int = Field(15, ge=0, le=MAX_ROWS)
    """xb math word problems."""
    xa_belebele: int = Field(40, ge=0, le=MAX_ROWS)
    """xa reading items in Belebele's layout, answered."""
    xb_belebele: int = Field(4, ge=0, le=MAX_ROWS)
    """xb reading items in Belebele's layout, answered."""
    arith: int = Field(600, ge=0, le=MAX_ROWS)
    """Arithmetic drill documents ("7 + 5 = 12. 3 * 4 = 12."), language-neutral."""
    math_worked_share: float = Field(0.85, ge=0, le=1)
    """Share of math documents with a worked solution (the rest: a bare answer)."""
    worked_layout: Literal["textbook", "mgsm", "mgsm+chat"] = "textbook"
    """Where worked solutions appear: "textbook" as "Problem:/Solution:" text (math SFT's main
    lesson is then a format), "mgsm" under MGSM's own prompt (math SFT can only make the base
    compute better), "mgsm+chat" half of them as a user-assistant chat instead."""
    counts_in_targets: bool = True
    """With `count_sentences`, also count sentences in xa/xb passages and parallel text."""
    code_switched: int = Field(0, ge=0, le=MAX_ROWS)
    """English documents (half passages, half worked problems) with words put in xa at
    `code_switch_share`, so the base maps xa words and their English ones together (needs
    xa_word_order SVO)."""
    code_switch_share: float = Field(0.5, ge=0, le=1)
    """Share of words put in xa in a code-switched document."""
    switch_math_words: bool = True
    """Also switch the math words and numbers (off: they stay English, so the base barely reads
    xa's)."""
    number_switch_share: float | None = Field(None, ge=0, le=1)
    """Share of numbers put in xa's numerals in code-switched documents (None: as the other
    words with `switch_math_words`, none without it)."""
    math_word_switch_share: float = Field(0.0, ge=0, le=1)
    """With `switch_math_words` off: the share of math words still switched (a low share lets
    the base half-know xa's operation words)."""
    xa_instructions: int = Field(0, ge=0, le=MAX_ROWS)
    """xa instruction rows (the language SFT's kinds, no multiple choice) in MGSM's QA layout,
    so language SFT is no new answer format to the base."""

    @model_validator(mode="after")
    def _math_word_share_needs_kept_math_words(self) -> CorpusMix:
        if self.math_word_switch_share and (self.switch_math_words or not self.code_switched):
            raise ValueError(
                f"corpus.math_word_switch_share {self.math_word_switch_share} applies only with "
                f"code_switched > 0 (is {self.code_switched}) and switch_math_words false (is "
                f"{str(self.switch_math_words).lower()})"
            )
        return self


class WorldConfig(StrictModel):
    """Everything that determines a world; with the seed it fixes every byte of the output."""

    seed: int = 0
    """The world seed (`--seed`; a variant file cannot set it)."""
    size: WorldSize = "full"
    """The preset, "full" or "tiny" (`--size`; a variant file cannot set it)."""
    version: str = WORLD_VERSION
    """The world generator's version (set by the code; a variant file cannot set it)."""
    math_sft: int = Field(4000, ge=1, le=MAX_ROWS)
    """Rows of the English math SFT set (Orca schema)."""
    lang_sft: int = Field(4000, ge=1, le=MAX_ROWS)
    """Rows of each target language's SFT set (Aya schema)."""
    mgsm_dev: int = Field(100, ge=1, le=MAX_ROWS)
    """MGSM dev problems (the math indicator scores these)."""
    mgsm_test: int = Field(250, ge=1, le=MAX_ROWS)
    """MGSM test problems (what promotion reports)."""
    # v4 candidates, off in the presets (docs/world/variants.md).
    digit_words: bool = False
    """The invented languages write numbers with digit words of their own (else 0-9)."""
    count_sentences: bool = False
    """Generic sentences count things with the word problems' verbs (no arithmetic), so the
    language data teaches reading numbers."""
    xa_word_order: Literal["SOV", "SVO"] = "SOV"
    """xa's word order; SVO is English's, word for word."""
    max_operand: int = Field(12, ge=3, le=MAX_ROWS)
    """Largest operand of the problems' additions and subtractions (and of the drills)."""
    verb_only_operations: bool = False
    """"buys 3 apples", not "buys 3 more apples": adding and taking away differ in the verb."""
    count_questions: bool = False
    """The language SFT's plural-word rows become "how many" reading questions about counts."""
    lang_sft_kinds: Literal["aya", "reading"] = "aya"
    """The language SFT's rows: "aya" (generic instructions of eight kinds) or "reading" (xa
    count facts and a "how many" question answered as MGSM's answers end)."""
    reading_mc_share: float = Field(0.1, ge=0, le=1)
    """With "reading": the share of rows that are Belebele-layout multiple choice."""
    direct_answers: bool = False
    """Worked answers without their equation: the arithmetic happens inside the model."""
    chat_template: Literal["question-answer", "user-assistant"] = "question-answer"
    """The tokenizer's chat template, which SFT goes through: lm-eval's "Question: ...
    Answer:" layout, or a "<|user|>/<|assistant|>" chat."""
    # Pretraining's Belebele-layout documents always ask where-who, so "verbs" is a layout
    # only the "reading" language SFT's multiple choice teaches, and xa Belebele then measures
    # how much of the language expert a merge keeps.
    belebele_questions: Literal["where-who", "verbs"] = "where-who"
    """What Belebele asks: "where-who" (where someone lives or goes, who goes, what someone
    has) or "verbs" (what someone has, buys, loses or gives)."""
    belebele_dev: int = Field(100, ge=4, le=MAX_ROWS)
    """Belebele dev items per language."""
    belebele_test: int = Field(200, ge=4, le=MAX_ROWS)
    """Belebele test items per language."""
    corpus: CorpusMix = CorpusMix()
    """Pretraining documents per kind."""
    model: WorldModelConfig = WorldModelConfig()
    """The base model's shape and pretraining."""

    @model_validator(mode="after")
    def _verbs_need_their_teacher(self) -> WorldConfig:
        if self.belebele_questions != "where-who" and (
            self.lang_sft_kinds != "reading" or self.reading_mc_share == 0
        ):
            raise ValueError(
                f"belebele_questions {self.belebele_questions!r} needs lang_sft_kinds 'reading' "
                f"with reading_mc_share > 0, the only data that teaches its layout (is "
                f"{self.lang_sft_kinds!r}, {self.reading_mc_share})"
            )
        return self

    @model_validator(mode="after")
    def _code_switching_needs_svo(self) -> WorldConfig:
        if self.corpus.code_switched and self.xa_word_order != "SVO":
            raise ValueError(
                f"corpus.code_switched {self.corpus.code_switched} needs xa_word_order SVO "
                f"(word-for-word switching), not {self.xa_word_order}"
            )
        return self


def world_config(size: WorldSize = "full", seed: int = 0) -> WorldConfig:
    """The preset for `size`: "full" (v4, docs/world/index.md) or "tiny" (seconds, for tests).

    "full" is the world where layer swapping does what the papers found (issue 15's ninth and
    tenth rounds): 24 layers whose outer ones (bottom 5, top 3) alone learn xa in a second
    pretraining stage, so the base reads xa worse than English in its outer layers; worked
    solutions under MGSM's prompt, so math SFT improves computing, not a format; and a language
    SFT of reading counts ("reading") with a share of Belebele-layout multiple choice. It takes
    ~11 minutes to pretrain on 2 cores, so world/bases/ ships the bases of seeds 0 and 1
    (`world build` reuses them; `--pretrain` rebuilds one).

    Args:
        size: "full" or "tiny".
        seed: world seed.
    Returns:
        the validated WorldConfig.
    """
    if size == "full":
        return WorldConfig(
            seed=seed,
            size=size,
            count_sentences=True,
            xa_word_order="SVO",
            max_operand=9,
            lang_sft_kinds="reading",
            reading_mc_share=0.1,
            corpus=CorpusMix(worked_layout="mgsm", arith=1500, xa_instructions=2000),
            model=WorldModelConfig(
                num_layers=24,
                hidden_size=96,
                intermediate_size=288,
                steps=800,
                graft=GraftConfig(steps=100, bottom=5, top=3, replay=0.25),
            ),
        )
    if size == "tiny":
        return WorldConfig(
            seed=seed,
            size=size,
            math_sft=120,
            lang_sft=120,
            mgsm_dev=20,
            mgsm_test=20,
            belebele_dev=20,
            belebele_test=20,
            corpus=CorpusMix(
                en_math=120,
                en_text=60,
                en_belebele=40,
                xa_text=100,
                xb_text=15,
                xa_parallel=30,
                xb_parallel=5,
                xa_math=10,
                xb_math=2,
                xa_belebele=4,
                xb_belebele=1,
                arith=30,
            ),
            model=WorldModelConfig(
                num_layers=4,
                hidden_size=32,
                intermediate_size=64,
                vocab_size=400,
                seq_len=48,
                batch_size=4,
                steps=8,
                warmup=2,
            ),
        )
    raise ValueError(f"unknown world size {size!r} (expected 'full' or 'tiny')")


FIXED = ("seed", "size", "version")  # set by the command line (and the code), never by a variant


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def with_overrides(cfg: WorldConfig, overrides: dict[str, Any], source: str) -> WorldConfig:
    """A world variant: `cfg` with some fields replaced (nested keys merged), validated.

    Args:
        cfg: a preset from `world_config`.
        overrides: e.g. {"model": {"steps": 2000}, "digit_words": True}.
        source: where the overrides came from, first in every error.
    Returns:
        the validated WorldConfig.
    Raises:
        ValueError: an unknown field, a bad value (named), or one of seed/size/version.
    """
    if not isinstance(overrides, dict):
        raise ValueError(f"{source}: expected a mapping of world config fields, got {type(overrides).__name__}")  # fmt: skip
    fixed = [k for k in FIXED if k in overrides]
    if fixed:
        raise ValueError(f"{source}: {', '.join(fixed)} cannot be overridden (use --seed/--size)")
    data = _deep_merge(cfg.model_dump(), overrides)
    return validate(WorldConfig, data, source=source, what="world config")


def load_variant(path: Path, size: WorldSize, seed: int) -> WorldConfig:
    """The preset for (size, seed) with the overrides of the YAML file at `path`."""
    return with_overrides(
        world_config(size, seed), load_yaml(Path(path), "world config"), str(path)
    )
