"""Which decode steps santa gives to dense attention by default in :mod:`santa.hf` and :mod:`santa.model`: those whose
keys are fewer than ``dense_below``, the keys below which santa's kernels lose to the dense ones on a contiguous cache.

A sampled decode step reads all of K and S value rows where dense reads all of K and V, but santa's launch has a chain
of dependent phases (scores, statistics, placement, gather) that a short sequence cannot amortise: at 512 keys and
batch 1 it takes 15.4–16.7 µs where cuDNN takes 10.0–13.0 (H100, 2026-12-07). Computing short sequences exactly
inside santa's launch was measured not to pay (1.09–29× the sampled time, ``benchmarks/kernels/covered_cost.py``), so
a short step goes to SDPA whole.

The default is measured per head shape (head dim d, query heads per KV head G) from the H100 contiguous grid of
2026-12-07 (``benchmarks/kernels/contiguous_ab.py``, santa's one launch at S = 128 against cuDNN SDPA in the same
call, CUDA-graph replay, clean cold L2; raw ``benchmarks/results/2026-12-07-contiguous-rule/``), n ∈ {512, 1k, 2k,
4k} keys × batch ∈ {1, 16, 64, 256}:

- Llama-3.1-8B's shape (d = 128, G = 4): santa/cuDNN 1.12–1.57× at 512 keys, at 1k for batch 1–16 and at 2k for
  batch 1; 0.63–0.99× at 1k for batch ≥ 64, at 2k for batch ≥ 16 and at 4k. So 4,096 (every losing cell dense; the
  wins at 1k from batch 64 and at 2k from batch 16 given up).
- Qwen2.5-0.5B's (d = 64, G = 7): 1.08–2.20× up to 2k, 0.95–1.34× at 4k (batch 64–256 win). So 8,192, which is also
  the default of every shape not measured.

santa's vLLM backend has its own default, measured on whole steps inside vLLM
(:func:`santa.vllm.config.default_dense_below`).
"""

from __future__ import annotations

DENSE_BELOW_BY_SHAPE = {(128, 4): 4096}  # (head dim, query heads per KV head) → keys
DENSE_BELOW = 8192  # every other shape


def default_dense_below(*, head_dim: int, group: int) -> int:
    """The keys below which a decode step of a model with this head shape runs dense by default on santa's kernels:
    :data:`DENSE_BELOW_BY_SHAPE` where the shape was measured, else :data:`DENSE_BELOW`."""
    return DENSE_BELOW_BY_SHAPE.get((head_dim, group), DENSE_BELOW)


def resolve_dense_below(dense_below: int | None, *, kernels_on_gpu: bool, head_dim: int, group: int) -> int:
    """``dense_below`` as the caller set it (an int ≥ 0, checked by the caller), or for None the default: by head shape
    (:func:`default_dense_below`) where the step would run santa's kernels on a GPU (``kernels_on_gpu``: not the torch
    reference, not batch-invariant plans), 0 (sample every step) elsewhere, where speed is not the point."""
    if dense_below is not None:
        return dense_below
    return default_dense_below(head_dim=head_dim, group=group) if kernels_on_gpu else 0
