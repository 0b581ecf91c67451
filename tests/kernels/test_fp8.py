"""fp8 (e4m3) KV caches with dequantisation scales: prop and flash against the dequantised caches.

The cache holds ``round_e4m3(x / s)`` and the kernels read ``cache.float() * s``: the counts must be
those of the systematic (prop) or per-tile (flash) sampler on the dequantised keys, up to float32
rounding of the CDF, and the output the counts-weighted mean of the dequantised values. On CPU the
kernels run in Triton's interpreter (and, without it, the torch fallback); on a GPU, compiled.
"""

from __future__ import annotations

import pytest
import torch

from helpers import CUDA, DEVICE, make_inputs, to_paged
from santa.kernels import decode, flash_reference, flash_tile, plan_decode, prop_reference
from test_kernels import assert_counts_match_systematic, dense_probs, prop_uniforms

triton = pytest.importorskip("triton")  # the interpreter's setup: tests/kernels/conftest.py
FP8 = torch.float8_e4m3fn
QDTYPE = torch.bfloat16 if CUDA else torch.float32  # bf16 dots on the GPU; the interpreter computes in fp32


def quantised(x: torch.Tensor, scale: torch.Tensor, head_axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cache, dequantised)``: x / scale rounded to e4m3 (scale per KV head along ``head_axis``) and its fp32 values."""
    shape = [1, 1, 1, 1]
    shape[head_axis] = -1
    per_head = scale.reshape(shape).to(x.device)
    cache = (x.float() / per_head).to(FP8)
    return cache, cache.float() * per_head


def scales(kind: str, kv_heads: int):
    """(the argument given to decode, the per-head values it means)."""
    values = torch.tensor([0.5, 0.03125, 2.0, 0.25][:kv_heads], dtype=torch.float32)
    if kind == "scalar":
        return 0.125, torch.full((kv_heads,), 0.125)
    return values.to(DEVICE), values


@pytest.mark.parametrize("kernel", ["prop", "flash"])
@pytest.mark.parametrize("layout,paged", [("NHD", False), ("HND", False), ("NHD", True)])
@pytest.mark.parametrize("scale_kind", ["scalar", "per_head"])
def test_fp8_caches_sample_as_the_dequantised_caches(kernel, layout, paged, scale_kind):
    batch, heads, kv_heads, dim, n_keys, budget = 2, 8, 2, 64, 300, 64
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, seed=21, q_scale=2.0)
    q = q.to(QDTYPE)
    k_arg, k_values = scales(scale_kind, kv_heads)
    v_arg, v_values = scales(scale_kind, kv_heads)
    k8, k_deq = quantised(k, k_values, head_axis=2)  # NHD [B, L, H_kv, d]
    v8, v_deq = quantised(v, v_values, head_axis=2)
    seq_lens = torch.tensor([n_keys, 131], dtype=torch.int32, device=DEVICE)
    kwargs = dict(kernel=kernel, seq_lens=seq_lens, seed=5, offset=2, return_counts=True, k_scale=k_arg, v_scale=v_arg)
    if paged:
        k_pages, table = to_paged(k8.float(), 16, seed=3)
        v_pages, _ = to_paged(v8.float(), 16, seed=3)
        out, counts = decode(q, k_pages.to(FP8), v_pages.to(FP8), budget, block_table=table, **kwargs)
    elif layout == "HND":
        out, counts = decode(q, k8.transpose(1, 2).contiguous(), v8.transpose(1, 2).contiguous(), budget, kv_layout="HND",
                             **kwargs)
    else:
        out, counts = decode(q, k8, v8, budget, **kwargs)
    counts = counts[..., :n_keys]
    if kernel == "prop":
        probs = dense_probs(q, k_deq, seq_lens)
        assert_counts_match_systematic(counts, probs, budget, prop_uniforms(batch, heads, 5, 2))
        group = heads // kv_heads
        values = v_deq.repeat_interleave(group, dim=2).transpose(1, 2).double()  # [B, H, L, d]
        expected = (counts.double().unsqueeze(-2) @ values).squeeze(-2) / budget
        torch.testing.assert_close(out.double(), expected.to(out.dtype).double(), rtol=2e-2, atol=2e-2)
    else:
        ref_out, ref_counts = flash_reference(q, k_deq, v_deq, budget, tile=flash_tile(dim), seq_lens=seq_lens, seed=5, offset=2)
        same = (counts.long() == ref_counts[..., :n_keys]).all(-1)
        assert same.float().mean() >= 0.75
        torch.testing.assert_close(out[same].double(), ref_out[same].double(), rtol=2e-2, atol=2e-2)


def test_a_planned_fp8_run_equals_eager_decode_and_the_torch_fallback(monkeypatch):
    q, k, v = make_inputs(2, 4, 2, 32, 100, seed=10)
    q = q.to(QDTYPE)
    k8, v8 = (k * 8).to(FP8), (v * 8).to(FP8)
    k_scale = torch.tensor([0.125, 0.25], device=DEVICE)
    eager, eager_counts = decode(q, k8, v8, 24, seed=4, offset=1, k_scale=k_scale, v_scale=0.125, return_counts=True)
    plan = plan_decode(batch=2, heads=4, kv_heads=2, head_dim=32, n_keys=100, budget=24, dtype=q.dtype, device=DEVICE,
                       kv_dtype=FP8)
    counts = torch.zeros_like(eager_counts)
    out = plan.run(q, k8, v8, seed=4, offset=1, k_scale=k_scale, v_scale=0.125, counts=counts)
    assert torch.equal(out, eager) and torch.equal(counts, eager_counts)
    # the torch reference of the same estimator on the dequantised caches
    ref_out, ref_counts = prop_reference(q, k8.float() * k_scale.view(1, 1, 2, 1), v8.float() * 0.125, 24, seed=4, offset=1)
    same = (eager_counts.long() == ref_counts).all(-1)
    assert same.float().mean() >= 0.75
    if not CUDA:  # without the interpreter, a CPU call runs that reference itself
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        cpu_out, cpu_counts = decode(q, k8, v8, 24, seed=4, offset=1, k_scale=k_scale, v_scale=0.125, return_counts=True)
        assert torch.equal(cpu_counts.long(), ref_counts) and torch.equal(cpu_out, ref_out)


@pytest.mark.parametrize("kernel", ["prop", "flash"])
@pytest.mark.parametrize("q_range", [1.0, 2.0**60, 2.0**-60])
def test_fp8_keys_read_as_float16_give_the_samples_of_the_dequantised_bf16_cache(kernel, q_range):
    """A bf16 q on an fp8 cache reads the K tile as float16 and q, scaled by a power of two, as float16 too
    (``DecodePlan.k_f16``); the products are the bf16 ones, so the counts and outputs are bit for bit those of
    the same call on the dequantised bf16 caches in the interpreter (its dots are fp32 of the same exact
    products; power-of-two scales keep the dequantised values exact in bf16), also for queries far outside
    float16's range. On the GPU the f16 and bf16 tensor-core dots may round their sums apart: the samples
    of the dequantised caches' probabilities."""
    batch, heads, kv_heads, dim, n_keys, budget = 2, 8, 2, 64, 300, 64
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, seed=23)
    q = (q * q_range).to(torch.bfloat16)
    k8, v8 = (k * 4).to(FP8), (v * 4).to(FP8)
    k_scale = torch.tensor([0.25, 0.5], device=DEVICE)
    k16 = (k8.float() * k_scale.view(1, 1, 2, 1)).to(torch.bfloat16)  # exact: e4m3 times a power of two
    v16 = (v8.float() * 0.25).to(torch.bfloat16)
    seq_lens = torch.tensor([n_keys, 131], dtype=torch.int32, device=DEVICE)
    runs = {}
    for name, kc, vc, kv_dtype, scales in (("fp8", k8, v8, FP8, dict(k_scale=k_scale, v_scale=0.25)),
                                           ("bf16", k16, v16, None, {})):
        plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                           dtype=torch.bfloat16, kv_dtype=kv_dtype, device=DEVICE, kernel=kernel)
        assert plan.k_f16 is (name == "fp8")
        counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device=DEVICE)
        out = plan.run(q, kc, vc, seq_lens=seq_lens, seed=5, offset=2, counts=counts, **scales)
        runs[name] = out, counts
    assert runs["fp8"][1].sum(-1).gt(0).all()  # every head sampled (not all NaN or empty)
    if CUDA:
        if kernel == "prop":
            probs = dense_probs(q, k16.float(), seq_lens)
            assert_counts_match_systematic(runs["fp8"][1], probs, budget, prop_uniforms(batch, heads, 5, 2))
        else:
            assert (runs["fp8"][1] == runs["bf16"][1]).all(-1).float().mean() >= 0.75
    else:
        assert torch.equal(runs["fp8"][1], runs["bf16"][1]) and torch.equal(runs["fp8"][0], runs["bf16"][0])


def test_fp8_keys_as_float16_apply_to_bf16_queries_on_fp8_caches_only():
    common = dict(batch=1, heads=2, kv_heads=1, head_dim=16, n_keys=10, budget=4, device=DEVICE)
    assert plan_decode(dtype=torch.bfloat16, kv_dtype=FP8, **common).k_f16
    assert not plan_decode(dtype=torch.float16, kv_dtype=FP8, **common).k_f16  # an f16 q reads K as f16 already
    assert not plan_decode(dtype=torch.float32, kv_dtype=FP8, **common).k_f16  # an fp32 q: the fp32 dot
    assert not plan_decode(dtype=torch.bfloat16, **common).k_f16


@pytest.mark.parametrize(
    "change,error,match",
    [
        (dict(k_cache="e5m2", v_cache="e5m2"), TypeError, r"k_cache must be one of .* only e4m3"),
        (dict(v_cache="bf16"), TypeError, "share one dtype"),
        (dict(q="fp8"), TypeError, "q must be one of"),
        (dict(k_scale="0.5"), TypeError, "k_scale must be a float"),
        (dict(v_scale=True), TypeError, "v_scale must be a float"),
        (dict(k_scale=-1.0), ValueError, "k_scale must be a finite scale > 0"),
        (dict(v_scale=float("nan")), ValueError, "v_scale must be a finite scale > 0"),
        (dict(k_scale=torch.ones(3)), ValueError, r"k_scale as a tensor must be float32 \[H_kv=2\]"),
        (dict(k_scale=torch.ones(2, dtype=torch.float64)), ValueError, "k_scale as a tensor must be float32"),
        (dict(v_scale=torch.tensor([1.0, 0.0])), ValueError, "v_scale must hold finite scales > 0"),
    ],
)
def test_bad_fp8_arguments_raise_naming_the_argument(change, error, match):
    q, k, v = make_inputs(2, 4, 2, 32, 20, seed=1, device="cpu")
    casts = {"e5m2": lambda x: x.to(torch.float8_e5m2), "bf16": lambda x: x.to(torch.bfloat16), "fp8": lambda x: x.to(FP8)}
    args = dict(q=q, k_cache=k.to(FP8), v_cache=v.to(FP8))
    kwargs = {}
    for key, value in change.items():
        if key in args:
            args[key] = casts[value](args[key])
        else:
            kwargs[key] = value
    with pytest.raises(error, match=match):
        decode(args["q"], args["k_cache"], args["v_cache"], 8, **kwargs)


def test_scales_are_refused_for_caches_that_are_not_fp8_and_plans_refuse_e5m2():
    q, k, v = make_inputs(1, 2, 1, 16, 10, seed=2, device="cpu")
    with pytest.raises(ValueError, match="k_scale dequantises a float8_e4m3fn cache; these caches are torch.float32"):
        decode(q, k, v, 4, k_scale=0.5)
    with pytest.raises(TypeError, match=r"kv_dtype must be .* \(float8_e5m2 caches are not supported"):
        plan_decode(batch=1, heads=2, kv_heads=1, head_dim=16, n_keys=10, budget=4, dtype=torch.float32, device="cpu",
                    kv_dtype=torch.float8_e5m2)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs")
def test_an_fp8_plan_replays_in_a_cuda_graph_with_per_head_scales():
    q, k, v = make_inputs(2, 32, 8, 128, 5000, torch.bfloat16, seed=13)
    k8, v8 = (k * 4).to(FP8), (v * 4).to(FP8)
    k_scale = torch.full((8,), 0.25, device=DEVICE)
    plan = plan_decode(batch=2, heads=32, kv_heads=8, head_dim=128, n_keys=5000, budget=128, dtype=q.dtype, device=DEVICE,
                       kv_dtype=FP8)
    out = torch.empty_like(q)
    offset = torch.tensor([0], dtype=torch.int64, device=DEVICE)
    plan.run(q, k8, v8, offset=offset, out=out, k_scale=k_scale, v_scale=0.25)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k8, v8, offset=offset, out=out, k_scale=k_scale, v_scale=0.25)
    offset.fill_(3)
    graph.replay()
    eager = decode(q, k8, v8, 128, offset=3, k_scale=k_scale, v_scale=0.25)
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("kernel", ["prop", "flash"])
def test_an_e4m3_nan_byte_in_a_visible_key_gives_nan_on_every_path(kernel, monkeypatch):
    """0x7F is e4m3's NaN: the heads that score it get NaN, in the kernels (the GPU, or Triton's interpreter, which
    reads the byte as 480.0 unless told) and in the torch fallback alike; the other KV group stays finite."""
    q, k, v = make_inputs(2, 4, 2, 16, 40, seed=12)
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    k8.view(torch.uint8)[1, 5, 0, 3] = 0x7F  # sequence 1, key 5, KV head 0 (query heads 0 and 1)
    seq_lens = torch.tensor([40, 40], dtype=torch.int32, device=DEVICE)
    outs = [decode(q, k8, v8, 8, kernel=kernel, seq_lens=seq_lens)]
    if not CUDA:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the torch fallback
        outs.append(decode(q, k8, v8, 8, kernel=kernel, seq_lens=seq_lens))
    for out in outs:
        assert torch.isnan(out[1, :2]).all() and torch.isfinite(out[1, 2:]).all() and torch.isfinite(out[0]).all()
