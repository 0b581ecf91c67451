"""One decode step's K and V written into an fp8 (e4m3) cache in one launch: ``x / scale`` per KV head,
saturated to ±448 and rounded to nearest even, at each sequence's own position.

The torch spelling (:func:`santa.model.quantise` then an indexed copy) launches ten small kernels per
layer and step (cast, divide, clamp, cast and the copy, for K and for V), ~0.3 ms per token on a
24-layer model; this is one. It writes the bytes torch writes: IEEE division, then the e4m3 code
rounded to nearest even in integer arithmetic (:func:`_e4m3_bits`) rather than Triton's fp8 cast,
whose CPU-interpreter emulation rounds some values to the wrong binade; so the CPU tests check the GPU's
arithmetic bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)


@triton.jit
def _e4m3_bits(x):
    """The float8_e4m3fn byte of fp32 ``x`` already clamped to ±448 (NaN kept), rounded to nearest even."""
    sign = (x.to(tl.uint32, bitcast=True) >> 24) & 0x80
    a = tl.abs(x)
    bits = a.to(tl.uint32, bitcast=True)
    # a ≥ 2**-6: round the 23 mantissa bits to 3 (a carry moves into the exponent), rebias 127 → 7
    rounded = bits + 0x7FFFF + ((bits >> 20) & 1)
    normal = (rounded >> 20) - ((127 - 7) << 3)
    # a < 2**-6: subnormals, multiples of 2**-9 (2**23 added and taken away rounds to an integer, nearest even)
    subnormal = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.uint32)
    code = tl.where(a < 0.015625, subnormal, normal)
    code = tl.where(a != a, 0x7F, code)
    return (code | sign).to(tl.uint8)


@triton.jit
def _fp8_decode_write_kernel(
    k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, n_pos, max_len,
    stride_kb, stride_kh, stride_vb, stride_vh, stride_cb, stride_cn, stride_ch,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + tl.where(n_pos > 1, b, 0)).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = (offs < HEAD_DIM) & (pos >= 0) & (pos < max_len)  # never a write outside the cache
    dest = b.to(tl.int64) * stride_cb + pos * stride_cn + h.to(tl.int64) * stride_ch + offs
    k = tl.load(k_ptr + b.to(tl.int64) * stride_kb + h * stride_kh + offs, mask=mask, other=0.0).to(tl.float32)
    k = tl.clamp(tl.div_rn(k, tl.load(k_scale_ptr + h)), -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    tl.store(k_cache_ptr + dest, _e4m3_bits(k), mask=mask)
    v = tl.load(v_ptr + b.to(tl.int64) * stride_vb + h * stride_vh + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.clamp(tl.div_rn(v, tl.load(v_scale_ptr + h)), -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    tl.store(v_cache_ptr + dest, _e4m3_bits(v), mask=mask)


def fp8_decode_write(k_val: torch.Tensor, v_val: torch.Tensor, *, k_scale: torch.Tensor, v_scale: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor) -> None:
    """Write ``k_val``, ``v_val`` ``[B, 1, H_kv, d]`` (the model's dtype, rows contiguous in d) quantised with
    float32 ``k_scale``, ``v_scale`` ``[H_kv]`` into the contiguous e4m3 caches ``[B, L_max, H_kv, d]`` at
    ``positions`` (int ``[B]``, or ``[1]`` for every sequence). A position outside ``[0, L_max)`` writes
    nothing (santa.model never passes one). Shapes are the caller's contract: checked, not values."""
    batch, _, kv_heads, dim = k_val.shape
    if k_cache.dtype != torch.float8_e4m3fn or not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError("k_cache and v_cache must be contiguous float8_e4m3fn [B, L_max, H_kv, d]")
    if k_val.stride(-1) != 1 or v_val.stride(-1) != 1:
        raise ValueError("k_val and v_val need rows contiguous in d")
    _fp8_decode_write_kernel[(batch, kv_heads)](
        k_val, v_val, k_scale, v_scale, k_cache.view(torch.uint8), v_cache.view(torch.uint8), positions, positions.numel(), k_cache.shape[1],
        k_val.stride(0), k_val.stride(2), v_val.stride(0), v_val.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        HEAD_DIM=dim, BLOCK_D=max(16, triton.next_power_of_2(dim)),
    )
