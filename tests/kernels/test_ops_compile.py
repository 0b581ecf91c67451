"""torch.compile over float8_e4m3fn (fp8) KV caches: the santa::decode custom op against eager santa.decode.

santa.kernels.ops takes fp8 caches and their dequantisation scales (k_scale / v_scale floats, or
k_scale_tensor / v_scale_tensor float32 [H_kv]); a compiled call of the op gives eager santa.decode's
output and counts bit for bit. On the CPU the op runs the torch fallback (the fixture unsets
TRITON_INTERPRET): one small case, compiled once.

santa.decode under torch.compile passes fp8 caches and their scales to the op (it refused them before, which
surfaced as dynamo's ``Unsupported: Observed exception`` with ``fullgraph=True`` and, in the default mode, as
``InternalTorchDynamoError: TypeError: an integer is required`` from the graph break into the eager fallback).
"""

from __future__ import annotations

import pytest
import torch

import santa
from helpers import DEVICE, make_inputs

pytestmark = pytest.mark.usefixtures("torch_fallback")
FP8 = torch.float8_e4m3fn


def fp8_call():
    """A tiny fp8 call (GQA 2, two sequences of other lengths): q, the fp8 caches, seq_lens and
    per-KV-head K scales (the caches hold 8·K and 8·V)."""
    q, k, v = make_inputs(2, 4, 2, 16, 40, seed=7)
    seq_lens = torch.tensor([40, 17], dtype=torch.int32, device=DEVICE)
    k_scale = torch.tensor([0.125, 0.25], device=DEVICE)
    return q, (k * 8).to(FP8), (v * 8).to(FP8), seq_lens, k_scale


def test_compiled_op_on_fp8_caches_equals_eager_santa_decode():
    q, k8, v8, seq_lens, k_scale = fp8_call()

    def step(q, k_cache, v_cache, seq_lens, k_scale):
        return torch.ops.santa.decode_counts(q, k_cache, v_cache, seq_lens, None, None, None, None, None, 16, "prop", "NHD",
                                             None, 3, 0, v_scale=0.125, k_scale_tensor=k_scale)

    want_out, want_counts = santa.decode(q, k8, v8, 16, seq_lens=seq_lens, seed=3, k_scale=k_scale, v_scale=0.125,
                                         return_counts=True)
    torch._dynamo.reset()
    out, counts = torch.compile(step)(q, k8, v8, seq_lens, k_scale)
    assert torch.equal(out, want_out) and torch.equal(counts, want_counts)
    assert counts.sum(-1)[0].eq(16).all()  # every head of the full-length sequence drew its 16 samples


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compiled_santa_decode_on_fp8_caches_equals_eager(fullgraph):
    q, k8, v8, seq_lens, k_scale = fp8_call()

    def step(q, k_cache, v_cache, seq_lens, k_scale):
        return santa.decode(q, k_cache, v_cache, 16, seq_lens=seq_lens, seed=3, k_scale=k_scale, v_scale=0.125,
                            return_counts=True)

    want_out, want_counts = step(q, k8, v8, seq_lens, k_scale)
    torch._dynamo.reset()
    out, counts = torch.compile(step, fullgraph=fullgraph)(q, k8, v8, seq_lens, k_scale)
    assert torch.equal(out, want_out) and torch.equal(counts, want_counts)
