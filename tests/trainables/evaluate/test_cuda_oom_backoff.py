"""Out-of-memory on a GPU, as the evaluator meets it: every way CUDA says "full" is one, and the
batch back-off frees the failed batch's tensors before it empties the CUDA cache and retries
smaller. A CPU stands in: the chunk raises the errors a GPU raises, and torch.cuda.empty_cache
is recorded, not called.

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_cuda_oom_backoff.py
"""

from __future__ import annotations

import weakref

import torch

from layerswap.trainables.devices import is_out_of_memory, says_out_of_memory
from layerswap.trainables.evaluate.proxy_lm import BatchSizer


def test_every_way_cuda_says_out_of_memory_is_one():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))  # a kernel's allocation
    # near the limit, cuBLAS cannot make its workspace
    assert is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))  # fmt: skip
    assert not is_out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))  # fmt: skip
    assert not is_out_of_memory(ValueError("out of memory"))  # not a device error
    # as a failed trial records it (TrialResult.error)
    assert says_out_of_memory("RuntimeError: CUDA error: out of memory\nTraceback ...")
    assert not says_out_of_memory("ValueError: non-finite merged tensor model.norm.weight")


def test_back_off_frees_the_failed_batch_before_emptying_the_cache(monkeypatch):
    held: list[weakref.ref] = []
    alive_at_empty_cache: list[bool] = []
    done: list[tuple[int, int]] = []

    def chunk(start: int, stop: int) -> None:
        logits = torch.empty(stop - start, 1 << 16)  # the batch's [rows, vocab] logits
        if stop - start > 2:
            held.append(weakref.ref(logits))
            raise RuntimeError("CUDA error: out of memory")
        done.append((start, stop))

    def empty_cache():
        alive_at_empty_cache.append(any(r() is not None for r in held))

    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    sizer = BatchSizer("auto")
    sizer.run(6, chunk, torch.device("cuda"), "loglikelihood")  # the device is only its type
    assert done == [(0, 2), (2, 4), (4, 6)]
    assert sizer.fitted == {("cuda", "loglikelihood"): 2} and sizer.backoffs == 5
    # 64, 32, 16, 8, 4 failed; each retry came after the failed batch's logits were freed
    assert alive_at_empty_cache and not any(alive_at_empty_cache)
