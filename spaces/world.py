"""Config of the embedded world (DESIGN.md §3): dataset sizes, corpus mix, model shape, training.

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

    steps: int = Field(ge=1)
    bottom: int = Field(3, ge=0)
    top: int = Field(2, ge=0)
    # share of English (stage-one) blocks in stage two; at most every stage-one block once
    replay: float = Field(0.25, ge=0, lt=1)
    lr: float | None = Field(None, gt=0)  # None: the model's lr
    warmup: int = Field(30, ge=0)


SHA256 = r"^[0-9a-f]{64}$"
FILE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # a plain file or folder name (no path, no dotfile)
# what world/bases/NAME holds: the model `world build` would have pretrained, and the config of
# the world it was pretrained for
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "world_config.json")


class PrebuiltBase(StrictModel):
    """A base pretrained ahead of time, on a larger budget than `world build` has, and shipped.

    `layerswap world export-base WORLD --name NAME` writes one from a built world into
    world/bases/NAME and prints the world's variant with this entry; `world build` then checks
    that the world it is building is the one the base was pretrained for (config, corpus and
    tokenizer) and copies the base instead of pretraining (world/prebuilt.py).
    """

    name: str = Field(pattern=FILE_NAME)  # its folder under world/bases/
    files: dict[str, str]  # each of SHIPPED_FILES -> its sha256
    # the tokenizer files `world build` trains and writes into base/ -> sha256 (compared)
    tokenizer_files: dict[str, str] = Field(min_length=1)
    corpus_sha256: str = Field(pattern=SHA256)  # of that world's corpus/pretrain.txt
    final_pretrain_loss: float

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

    num_layers: int = Field(12, ge=1)
    hidden_size: int = Field(64, ge=8)
    intermediate_size: int = Field(192, ge=8)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    vocab_size: int = Field(1500, ge=300)
    seq_len: int = Field(128, ge=16)
    batch_size: int = Field(16, ge=1)
    steps: int = Field(500, ge=1)
    lr: float = Field(3e-3, gt=0)
    warmup: int = Field(30, ge=0)
    threads: int = Field(1, ge=1)  # 2 threads ran 5x slower on 2 shared cores (OMP spinning)
    graft: GraftConfig | None = None  # a staged pretraining (GraftConfig); None: one stage
    # a base already pretrained with the settings above, shipped in world/bases/; None: pretrain
    prebuilt: PrebuiltBase | None = None

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

    en_math: int = Field(3000, ge=0)
    en_text: int = Field(800, ge=0)
    en_belebele: int = Field(2000, ge=0)
    xa_text: int = Field(2500, ge=0)
    xb_text: int = Field(300, ge=0)
    xa_parallel: int = Field(600, ge=0)
    xb_parallel: int = Field(80, ge=0)
    xa_math: int = Field(150, ge=0)
    xb_math: int = Field(15, ge=0)
    xa_belebele: int = Field(40, ge=0)
    xb_belebele: int = Field(4, ge=0)
    arith: int = Field(600, ge=0)  # arithmetic drill documents ("7 + 5 = 12. 3 * 4 = 12.")
    math_worked_share: float = Field(0.85, ge=0, le=1)  # math docs with a worked solution
    # where worked solutions appear: "textbook" as "Problem:/Solution:" text (so math SFT's main
    # lesson is a format: show the work under MGSM's prompt), "mgsm" under MGSM's own prompt
    # (so the base already shows its work and math SFT can only make it compute better)
    # ("mgsm+chat": half under MGSM's prompt, half as a chat exchange in the user-assistant
    # layout, so the base links instruction-tuned math to MGSM's prompt)
    worked_layout: Literal["textbook", "mgsm", "mgsm+chat"] = "textbook"
    # code-switched documents (xa must be SVO): English text, half of it everyday passages and
    # half worked problems, with each word in xa at `code_switch_share`, so xa words and their
    # English counterparts share contexts and the base maps both to one representation;
    # `switch_math_words` off keeps MATH_WORDS and numbers as they are in English there, so the
    # base barely reads xa's
    counts_in_targets: bool = True  # count sentences (if on) also in xa/xb passages and parallel
    code_switched: int = Field(0, ge=0)
    code_switch_share: float = Field(0.5, ge=0, le=1)
    switch_math_words: bool = True
    # the share for numbers (into xa's numerals) in those documents; None: as the other words
    # with `switch_math_words`, none without it
    number_switch_share: float | None = Field(None, ge=0, le=1)
    # the share for MATH_WORDS there when `switch_math_words` is off: a low share lets the base
    # half-know xa's operation words (seen, rarely, in the contexts their English forms have)
    math_word_switch_share: float = Field(0.0, ge=0, le=1)
    # xa instructions (the language SFT's kinds of rows but multiple choice, from a random stream
    # of their own; short rows such as plurals repeat some SFT rows verbatim) in the QA layout
    # MGSM's prompt has, so the base already answers generic xa questions there with text and
    # word problems with their work, and language SFT is no new answer format to it
    xa_instructions: int = Field(0, ge=0)

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
    size: WorldSize = "full"
    version: str = WORLD_VERSION
    math_sft: int = Field(4000, ge=1)
    lang_sft: int = Field(4000, ge=1)
    mgsm_dev: int = Field(100, ge=1)
    mgsm_test: int = Field(250, ge=1)
    # v4 candidates, off in the presets (README "The embedded world"): the invented languages
    # write numbers with digit words of their own, and generic sentences count things with the
    # word problems' verbs (no arithmetic), so the language data teaches reading numbers
    digit_words: bool = False
    count_sentences: bool = False
    xa_word_order: Literal["SOV", "SVO"] = "SOV"  # SVO: English's, word for word
    # largest operand of the problems' additions and subtractions (and of the drills): larger
    # makes arithmetic, the language-neutral part of math, harder for the base
    max_operand: int = Field(12, ge=3)
    # "buys 3 apples", not "buys 3 more apples": adding and taking away differ in the verb alone
    verb_only_operations: bool = False
    # the language SFT's plural-word rows become reading questions about counts ("How many eggs
    # does Tom lose?" after two sentences that differ in the verb), answered by the sentence
    count_questions: bool = False
    # the language SFT's rows (world/data.py LANG_SFT): "aya", generic instructions of eight
    # kinds (a quarter multiple choice); "reading", xa count facts and a "how many" question
    # answered "The answer is 7." as MGSM's answers end, with a `reading_mc_share` of
    # belebele-layout multiple choice (so xa Belebele measures what the language SFT taught)
    lang_sft_kinds: Literal["aya", "reading"] = "aya"
    reading_mc_share: float = Field(0.1, ge=0, le=1)
    # worked answers without their equation (pretraining, math SFT, MGSM's train shots): the
    # arithmetic then happens inside the model, between reading the problem and writing the number
    direct_answers: bool = False
    # the tokenizer's chat template (world/model.py CHAT_TEMPLATES), which SFT goes through:
    # lm-eval's "Question: ...\nAnswer:" layout, or a "<|user|>/<|assistant|>" chat of its own
    chat_template: Literal["question-answer", "user-assistant"] = "question-answer"
    # what Belebele (and the language SFT's multiple choice) asks (world/items.py READINGS):
    # "where-who", where someone lives or goes, who goes somewhere, what someone has; "verbs",
    # what someone has, buys, loses or gives, the word problems' verbs. Pretraining's
    # Belebele-layout documents always ask where-who, so "verbs" is a layout only the "reading"
    # language SFT's multiple choice teaches, and xa Belebele then measures how much of the
    # language expert a merge keeps
    belebele_questions: Literal["where-who", "verbs"] = "where-who"
    belebele_dev: int = Field(100, ge=4)
    belebele_test: int = Field(200, ge=4)
    corpus: CorpusMix = CorpusMix()
    model: WorldModelConfig = WorldModelConfig()

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
    """The preset for `size`: "full" (v4, README "The embedded world") or "tiny" (seconds, for tests).

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
