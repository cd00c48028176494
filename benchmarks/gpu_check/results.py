"""The result builders of the GPU check's stages, used for a kept part (ctx.keep) and for the
whole stage alike: a part that failed as a figure, the training stage's result, the ray_train
stage's killed run and whole result, the evaluator's notes, and each stage's throughput entries
(the figures spaces/throughput.yaml takes; throughput.py). Each takes what it needs as arguments and imports no stage module (the stages import it),
so one function makes both a kept part's result and the whole stage's.

Not run on its own; the stages (trials.py, training.py, ray_train.py, evaluator.py) call it.
"""

from __future__ import annotations

from gpu_check.figures import Figure, Target


def failed_part(name: str, error: str) -> Figure:
    """A part of a stage that raised: its finding, a missed target (0 of "yes=1").

    Args:
        name: the figure's name, e.g. "FSDP2 wrap finished".
        error: the one-line error (common.failure's text).
    """
    return Figure(name, 0.0, "yes=1", Target(">=", 1), note=error)


def training_result(cfg, out: dict) -> dict:
    """The training stage's result: `out` (not changed) with the notes on the runs so far.

    Args:
        cfg: the trained model's config.
        out: {"figures", "notes", "runs", ...} as training.run builds it.
    """
    out = {**out, "notes": list(out["notes"])}
    if out["runs"]:
        p = out["runs"][0]["precision"]
        out["notes"].append(
            f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}: "
            f"{out['runs'][0]['parameters']:,} parameters; precision {p['policy']} (masters "
            f"{p['master_dtype']}, compute {p['compute_dtype']}); checkpoints save "
            f"{p['checkpoint_dtype']}: trainables/train/precision.py resolve_precision sets "
            "Policy.save to the base's dtype unless precision.checkpoint_dtype is fp32, and "
            "state.py / sharded.py write the HF weights in it"
        )
        out["notes"].append(
            "moved shares count every trainable element; embedding rows of tokens absent from "
            "the random batches get no gradient (and weight decay is 0), so AdamW leaves them "
            "as they were: at the real vocabulary most of the embedding cannot move in 4 steps"
        )
    return out


def killed_run_part(gpu: bool, killed: dict, backends: dict | None, nccl_inits: int, every_samples: int) -> dict:  # fmt: skip
    """The ray_train stage's killed attempt on its own: what is known before the resume.

    Args:
        gpu: whether it ran on a GPU.
        killed: ray_train._killed_run's dict.
        backends, nccl_inits: ray_train.backends_in_logs of the killed attempt's output.
        every_samples: samples between checkpoints (its first checkpoint's name).
    """
    figures = [
        Figure("seconds to the first checkpoint", killed["first_checkpoint_s"], "s",
               note=f"`layerswap train` start to samples_{every_samples:09d} on disk, Ray start included"),
        Figure("NCCL communicators initialised (killed attempt)", nccl_inits if gpu else None, "",
               note="NCCL_DEBUG=INFO 'Init COMPLETE' lines in its log" if gpu else "CPU run: gloo only"),
    ]  # fmt: skip
    notes = [f"killed attempt: checkpoints at the kill {', '.join(killed['checkpoints_at_kill'])}; process group backends {backends or 'no log line found'}"]  # fmt: skip
    return {"figures": figures, "notes": notes, "backends": backends, "checkpoints_at_kill": killed["checkpoints_at_kill"]}  # fmt: skip


def evaluator_notes(shape_txt: str, prompts: dict, max_gen_toks: int, vocab: int, tokenizer_len: int, built_s: float, race: dict) -> list[str]:  # fmt: skip
    """The evaluator stage's notes: its items, decoding budget, timing rules and any batch that
    ran out of memory, for the race so far (a kept candidate) or whole.

    Args:
        shape_txt: the items and model in words (evaluator._result's).
        prompts: evaluator._prompt_tokens's {task: {"items", "mean", "max"}}.
        max_gen_toks, vocab, tokenizer_len: the decoding budget, the model's vocabulary and the
            world tokenizer's size.
        built_s: seconds to build the evaluator; race: evaluator._race's dict.
    """
    lengths = ", ".join(f"{t} mean {p['mean']:.0f}, max {p['max']}" for t, p in prompts.items())
    return [
        f"Items: {shape_txt}. Prompt tokens (world tokenizer): {lengths}; real 5-shot Belebele "
        "prompts are ~2,100 Llama-3 tokens, 8-shot MGSM ~700-900.",
        f"max_gen_toks {max_gen_toks} (the shipped config: 256): random weights "
        "rarely emit a stop string, so most rows run the whole budget, and a shorter one "
        "times the same decoding step for less GPU time. The lm_head rows of ids the world "
        f"tokenizer lacks ({vocab} - {tokenizer_len}) are zero, so generated texts are real "
        "text and their agreement means something (evaluator.in_tokenizer_vocab).",
        f"Evaluator built once in {built_s:.1f} s (prompts tokenized), not in its per-candidate "
        "time, and timed with its forward hooks on (two syncs a forward: conservative); HFLM's "
        "time includes simple_evaluate building its tasks. " + race["extra_note"] + ".",
        *(
            f"HFLM batch {b} ran out of device memory: it does not fit"
            for b in race["out_of_memory"]
        ),
        "Prefill FLOPs count real tokens (no padding) at each token's mean causal context; the "
        "plan's eval_cost uses the whole row (~2 % more at 2,100 tokens). decode bytes/s is over "
        "the decoding forward alone, the overhead is the rest of the step: bytes / bytes/s + "
        "overhead, the plan's step, is then the measured one.",
    ]


# ------------------------------------------------------------- throughput entries and whole results


def evaluator_throughput(s: dict, cost, shape_txt: str) -> dict:
    """The evaluator stage's profile figures (GPU runs only), with their provenance: prefill
    FLOP/s, and decoding's bytes/s and step overhead when it decoded."""
    step, fwd, wb = s["decode_step_s"], s["decode_forward_s"], cost.weight_bytes
    out = {"prefill_flops_per_s": {
        "value": s["prefill_flops_per_s"], "unit": "FLOP/s", "shape": shape_txt,
        "result": f"layerswap's evaluator: {s['prefill_calls']} prefill forwards, "
        f"{s['prefill_rows']} rows, {s['prefill_tokens']} real tokens in {s['prefill_s']:.3f} s",
        "derivation": f"sum over rows of n x forward_flops(model_cost, (n + 1) / 2) = "
        f"{s['prefill_flops']:.4g} FLOPs (lm_head on every token, the plan's rule) / that time",
    }}  # fmt: skip
    if step:
        res = (f"layerswap's evaluator: {s['decode_steps']} decoding steps of "
               f"{s['decode_rows']:.1f} rows on average: forward {fwd * 1e3:.2f} ms, whole step "
               f"{step * 1e3:.2f} ms")  # fmt: skip
        out["decode_bytes_per_s"] = {
            "value": wb / fwd, "unit": "B/s", "shape": shape_txt, "result": res,
            "derivation": f"{wb:.4g} weight bytes / the mean decoding forward; the rest of a "
            "step is decode_step_overhead_s, so bytes / this + overhead = the measured step",
        }  # fmt: skip
        out["decode_step_overhead_s"] = {
            "value": max(step - fwd, 1e-4), "unit": "s/step", "shape": shape_txt, "result": res,
            "derivation": "whole step - forward (the loop's host work), floored at 0.1 ms",
        }  # fmt: skip
    return out


def trials_throughput(ctx, p: dict) -> dict:
    """The trials stage's merge_bytes_per_s, from the host-placement pass (the placement layerswap picks at 8B);
    {} when its trials swapped nothing in (no rate to give)."""
    timed = [r for r in p["rows"] if not r["first"]]
    nbytes, secs = sum(r["moved_bytes"] for r in timed), sum(r["compose_s"] + r["move_s"] for r in timed)  # fmt: skip
    if not nbytes:
        return {}
    return {"merge_bytes_per_s": {
        "value": nbytes / secs, "unit": "B/s",
        "shape": f"{ctx.shape}: {p['depth']} layers, vocab {ctx.config().vocab_size}, bf16, random weights",
        "result": f"{len(timed)} trials after the first, experts in host memory, changed tensors copied: "
                  f"{nbytes / 2**30:.2f} GiB swapped in over {secs:.2f} s of compose (move included)",
        "derivation": "bytes of the tensors whose assembly op changed / TrialResult.t_compose_s, summed over the trials",
    }}  # fmt: skip


def training_throughput(ctx, r: dict, cfg, args) -> dict:
    """The training stage's measured train_flops_per_s entry (GPU runs only) for spaces/throughput.yaml."""
    shape = (
        f"{ctx.shape} width, {cfg.num_hidden_layers} layers, vocab {cfg.vocab_size}, micro-batch "
        f"{args.micro_batch} x seq {args.seq_len}, full SFT, bf16-mixed, gradient checkpointing, "
        "1 GPU"
    )
    result = (
        f"{r['tokens_per_s']:,.0f} tokens/s over {args.steps} timed steps (after {args.warmup} "
        f"warmup) of the trainer's _train_step at LR {r['lr']:g}"
    )
    derivation = (
        f"tokens/s x {r['flops_per_token']:.4g} training FLOPs per token "
        "(study.estimate.train_flops); one GPU, no FSDP communication, so an upper bound for "
        "multi-GPU FSDP; the recompute counted is the decoder layers' (not the lm_head's), as "
        "Hugging Face gradient checkpointing runs it"
    )
    value = r["tokens_per_s"] * r["flops_per_token"]
    return {
        "train_flops_per_s": {
            "value": value,
            "unit": "FLOP/s",
            "shape": shape,
            "result": result,
            "derivation": derivation,
        }
    }


def ray_train_result(ctx, killed: dict, resumed: dict, summary: dict, final: dict, backends: dict | None, used: str | None, nccl_inits: int, *, steps: int, every_samples: int, step_delay_s: float) -> dict:  # fmt: skip
    """The ray_train stage's figures and notes, killed and resumed.

    Args:
        killed, resumed: ray_train._killed_run's and _resumed_run's dicts.
        summary: ray_train.resume_summary; final: ray_train._final_checkpoint.
        backends, used, nccl_inits: the process group's backends, the one the run's tensors
            used, and NCCL communicators made (ray_train.backends_in_logs of both attempts).
        steps, every_samples, step_delay_s: the run's steps, samples between checkpoints, and
            sleep per step.
    """
    gpu = ctx.device == "cuda"
    start = summary["resumed_from"]
    recovery_s = resumed["done_at"] - killed["killed_at"]
    figures = [
        Figure("resumed from step N", start, "step", Target(">=", 1),
               note=f"the run's step log: killed after step {summary['last_before_kill']} (checkpoints then: "
                    f"{', '.join(killed['checkpoints_at_kill'])}); the resumed attempt "
                    f"{'ran steps N+1..' + str(steps) if summary['continued'] else 'did NOT run exactly N+1..' + str(steps)}"),
        Figure("steps trained again after the kill", summary["redone"], "steps",
               note="done before the kill but after the checkpoint resumed from"),
        Figure("seconds to the first checkpoint", killed["first_checkpoint_s"], "s",
               note=f"`layerswap train` start to samples_{every_samples:09d} on disk, Ray start included"),
        Figure("seconds from the kill to the resumed run's end", recovery_s, "s",
               note=f"SIGKILL to the process group, then `--resume` to exit 0 ({steps} steps, "
                    f"{step_delay_s} s sleep each: debug.step_delay_s)"),
        Figure("final checkpoint loads (safetensors)", float(final["loads"]), "yes=1", Target(">=", 1),
               note=f"{final['path']} at step {final['step']}: model.safetensors through from_pretrained, "
                    f"every tensor as saved; sharded state {', '.join(final['dcp_files']) or 'MISSING'}"),
        Figure("NCCL communicators initialised", nccl_inits if gpu else None, "", Target(">=", 1) if gpu else None,
               note="NCCL_DEBUG=INFO 'Init COMPLETE' lines in the run's logs" if gpu
                    else "CPU run: gloo only, there is no NCCL to use"),
    ]  # fmt: skip
    notes = [
        f"process group backends (the worker's c10d log): {backends or 'no log line found'}; "
        f"the {'cuda' if gpu else 'cpu'} tensors' backend: {used or 'unknown'}",
        f"checkpoints are FSDP2's sharded ones: trainer_state/dcp ({', '.join(final['dcp_files'])}) beside the "
        f"gathered model.safetensors; the final manifest says world_size {final['world_size']}",
        "the command's output (tails) is kept as ray_train_killed.log and ray_train_resumed.log",
    ]  # fmt: skip
    if gpu and used != "nccl":
        notes.append(
            f"on a GPU the process group's cuda backend should be nccl; the logs say {used}"
        )
    if gpu and nccl_inits == 0:
        notes.append(
            "no NCCL communicator was made: no collective of this one-worker run reached NCCL "
            "(FSDP2 skips all-gathers and reduce-scatters at world size 1, and object collectives "
            "take the cpu backend, gloo): the backend is configured, not exercised"
        )
    return {
        "figures": figures, "notes": notes, "backends": backends, "backend_used": used,
        "nccl_inits": nccl_inits, "resume": summary, "final_checkpoint": final,
        "checkpoints_at_kill": killed["checkpoints_at_kill"],
    }  # fmt: skip
