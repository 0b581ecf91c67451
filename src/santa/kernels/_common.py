"""Triton helpers shared by the prop and flash kernels: cache addressing, tile scores, Philox uniforms."""

from __future__ import annotations

import os

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# Whether these kernels are defined for Triton's interpreter (read, as Triton reads it, when the module is imported).
# Triton 3.6's interpreter converts an e4m3 NaN byte (0x7F / 0xFF) to 480.0 where the GPU's conversion gives NaN.
INTERPRETED: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def row_offsets(
    b, pos, mask, kvh, bt_ptr, stride_bt, n_pages,
    stride_cb, stride_cn, stride_ch, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
):
    """Element offsets of key rows ``pos`` of sequence b, KV head kvh (contiguous or paged cache),
    and whether each row is addressable: a page id outside ``[0, n_pages)`` is never followed (its
    rows read page 0 under a false mask, and the caller turns them into NaN scores)."""
    if PAGED:
        page = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + pos // PAGE_SIZE, mask=mask, other=0)
        page_ok = (page >= 0) & (page < n_pages)
        page = tl.where(page_ok, page, 0)
        base = page.to(tl.int64) * stride_cb + (pos % PAGE_SIZE).to(tl.int64) * stride_cn
        ok = mask & page_ok
    else:
        base = b.to(tl.int64) * stride_cb + pos.to(tl.int64) * stride_cn
        ok = mask
    return base + kvh.to(tl.int64) * stride_ch, ok


@triton.jit
def load_cache_rows(cache_ptr, rows, ok, offs_d, mask_d, DTYPE: tl.constexpr, EVICTION: tl.constexpr):
    """Rows ``[len(rows), BLOCK_D]`` of a K or V cache at element offsets ``rows`` (0 where ``~ok`` or past
    d), converted to DTYPE: the one place the kernels read a cache. An fp8 (e4m3) cache converts exactly
    to bf16, fp16 or fp32; its dequantisation scale is applied by the caller (:func:`cache_scale`)."""
    rows = tl.load(cache_ptr + rows[:, None] + offs_d[None, :], mask=ok[:, None] & mask_d[None, :], other=0.0,
                   eviction_policy=EVICTION)
    values = rows.to(DTYPE)
    if INTERPRETED:  # a constexpr branch: the GPU's code is unchanged
        if cache_ptr.dtype.element_ty == tl.float8e4nv:  # e4m3 NaN is S.1111.111: NaN, as the GPU converts it
            nan = (rows.to(tl.uint8, bitcast=True) & 0x7F) == 0x7F
            values = tl.where(nan, float("nan"), values.to(tl.float32)).to(DTYPE)  # (the interpreter has no bf16 constant)
    return values


@triton.jit
def cache_scale(scale, scale_ptr, kvh, PER_HEAD: tl.constexpr):
    """The dequantisation scale of KV head kvh: ``scale_ptr[kvh]`` (a float32 tensor, one per KV head) or
    the scalar ``scale`` (1.0 for a bf16/fp16/fp32 cache, so that nothing changes there)."""
    if PER_HEAD:
        return tl.load(scale_ptr + kvh)
    else:
        return scale


@triton.jit
def gate_open(enabled_ptr, GATED: tl.constexpr):
    """Whether a launch runs: a gated one (GATED) only while the device int at ``enabled_ptr`` is non-zero (an engine
    that holds santa and a dense kernel in one CUDA graph picks one per replay); an ungated one always (a constexpr
    True: its code is unchanged)."""
    if GATED:
        return tl.load(enabled_ptr) != 0
    else:
        return True


@triton.jit
def checked_seq_len(seq_lens_ptr, b, n_keys, HAS_SEQ_LENS: tl.constexpr):
    """``(seq_len, bad)``: sequence b's length clamped to ``[0, n_keys]`` (so no read leaves the cache)
    and whether it had to be (the kernels then write NaN for every head of the sequence)."""
    if HAS_SEQ_LENS:
        raw = tl.load(seq_lens_ptr + b)
        bad = (raw < 0) | (raw > n_keys)
        return tl.minimum(tl.maximum(raw, 0), n_keys), bad
    else:
        return n_keys + 0 * b, b < 0


@triton.jit
def checked_first_key(starts_ptr, b, seq_len, HAS_STARTS: tl.constexpr):
    """``(first, bad)``: sequence b's first visible key (its keys are ``[first, seq_len)``: a left-padded
    or windowed run), clamped to ``[0, seq_len]``, and whether it had to be (NaN for the sequence)."""
    if HAS_STARTS:
        raw = tl.load(starts_ptr + b)
        return tl.minimum(tl.maximum(raw, 0), seq_len), (raw < 0) | (raw > seq_len)
    else:
        return 0 * b, b < 0


@triton.jit
def tile_scores(
    q_ptr, k_ptr, bt_ptr, b, kvh, start, seq_len, first_key, n_pages,
    stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, qk_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, IEEE_DOT: tl.constexpr, K_EVICTION: tl.constexpr,
    K_F16: tl.constexpr,
):
    """Scores of the G grouped heads on one K tile, in log2 units: ``[BLOCK_G, BLOCK_N]`` fp32, −inf off
    the sequence, NaN on rows behind a page id outside the pool (so that the heads' outputs are NaN).
    ``qk_scale`` includes the K cache's dequantisation scale (:func:`cache_scale`) for an fp8 cache.
    K_EVICTION: the K load's L2 eviction policy (``""``: the default; ``"evict_first"``: K is read once, so that what the
    caller writes, e.g. prop's stash, stays in L2 for the next launch).
    K_F16: an fp8 K tile is converted to float16 (one instruction per pair of elements; to bf16 it takes
    three more and the repacking) and q, scaled by a power of two, to float16 as well (:func:`f16_scaled`):
    the same products, so the same scores up to the float32 accumulation."""
    offs_g = tl.arange(0, BLOCK_G)
    offs_n = start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < G
    mask_n = (offs_n < seq_len) & (offs_n >= first_key)  # the sequence's visible keys [first_key, seq_len)
    mask_d = offs_d < D
    q_rows = b.to(tl.int64) * stride_qb + (kvh * G + offs_g).to(tl.int64) * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    k_rows, k_ok = row_offsets(b, offs_n, mask_n, kvh, bt_ptr, stride_bt, n_pages, stride_kb, stride_kn, stride_kh, PAGED, PAGE_SIZE)
    if K_F16:  # a constexpr branch: q's type may change
        k = load_cache_rows(k_ptr, k_rows, k_ok, offs_d, mask_d, tl.float16, K_EVICTION)  # e4m3 → f16: exact
        q, unscale = f16_scaled(q)
        qk_scale = qk_scale * unscale  # exact (a power of two): one multiply per score, as below
    else:
        k = load_cache_rows(k_ptr, k_rows, k_ok, offs_d, mask_d, q.dtype, K_EVICTION)  # an fp8 cache: converted exactly
    if IEEE_DOT:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = s * qk_scale
    s = tl.where(k_ok[None, :] | ~mask_n[None, :], s, float("nan"))
    return tl.where(mask_n[None, :], s, -float("inf"))


@triton.jit
def f16_scaled(q):
    """``(q16, unscale)``: q (bf16 or fp32, ``[M, D]``) times ``2**−e`` as float16, and ``2**e``, with e picked
    from the largest |q| so that it lands in ``[2**14, 2**15)``: every element within 28 binades of the
    largest converts exactly (bf16's 8 significant bits fit float16's 11), smaller ones to float16's
    subnormals (a change below 2**−38 of the largest, far under float32's rounding of the dot), and
    ``dot(q16, k) · unscale`` is the dot of q. The powers of two are built from exponent bits (exact);
    e stays in ``[−126, 126]``. NaN or ±inf in q stays NaN or inf in q16."""
    qf = q.to(tl.float32)
    largest = tl.max(tl.max(tl.abs(qf), axis=1), axis=0)
    binade = ((largest.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2 |q|max) for a normal float
    e = tl.minimum(tl.maximum(binade - 14, -126), 126)
    scale = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2**−e
    unscale = ((127 + e) << 23).to(tl.float32, bitcast=True)  # 2**e
    return (qf * scale).to(tl.float16), unscale


@triton.jit
def tile_softmax_stats(s):
    """Tile max ``m_t``, ``u = exp(s − m_t)`` and mass ``ℓ_t = Σ u`` per row of base-2 scores ``s``
    ``[BLOCK_G, BLOCK_N]``. A NaN or +inf score (NaN/inf in q or K, a bad page id) makes ``u`` NaN
    there (``s − m`` is NaN or ``inf − inf``), hence ``ℓ_t = NaN``, which every later stage turns into
    a NaN output. A row of −inf (no visible key, or −inf scores) gets ``u = 0``, ``ℓ_t = 0``."""
    m = tl.max(s, axis=1)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    u = tl.exp2(s - m_safe[:, None])
    mass = tl.sum(u, axis=1)
    return m, u, mass


@triton.jit
def philox_uniform(seed, off_lo, off_hi, row, stream, SHAPE: tl.constexpr):
    """float32 uniforms in [0, 1) of counter ``(off_lo, off_hi, row, stream)`` under key ``seed``.

    ``row`` and ``stream`` are scalars or blocks of shape SHAPE; reproduced by
    :func:`santa.kernels.reference.philox_uniforms`.
    """
    zero = tl.zeros(SHAPE, dtype=tl.uint32)
    c0 = zero + off_lo
    c1 = zero + off_hi
    c2 = (zero + row).to(tl.uint32)
    c3 = (zero + stream).to(tl.uint32)
    r0, _, _, _ = tl.philox(seed, c0, c1, c2, c3)
    return tl.uint_to_uniform_float(r0)


@triton.jit
def call_uniforms(seed, seeds_ptr, off_lo, off_hi, positions_ptr, b, n_heads, head_offset, h, stream, SHAPE: tl.constexpr,
                  SEED_PER_SEQUENCE: tl.constexpr, POSITIONAL: tl.constexpr):
    """The uniforms of sequence b, heads ``h`` of the call (a scalar or a block of SHAPE), ``stream``:
    key ``seeds_ptr[b]`` (SEED_PER_SEQUENCE) or ``seed``; counter ``(positions_ptr[b], head_offset + h, stream)``
    (POSITIONAL: a draw does not depend on the batch row) or ``(offset, b·H + head_offset + h, stream)``.
    ``head_offset`` (a runtime scalar, 0 but under tensor parallelism) makes the counter's head the model's
    global head when the call holds a slice of the heads (a rank's); the callers accept it with positions
    only (the batch-row form has no global head). Reproduced by :func:`santa.kernels.reference.call_uniforms`."""
    if SEED_PER_SEQUENCE:
        key = tl.load(seeds_ptr + b)
    else:
        key = seed
    head = head_offset + h
    if POSITIONAL:
        pos = tl.load(positions_ptr + b).to(tl.int64)
        lo = (pos & 0xFFFFFFFF).to(tl.uint32)
        hi = ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32)
        return philox_uniform(key, lo, hi, head, stream, SHAPE)
    else:
        return philox_uniform(key, off_lo, off_hi, b * n_heads + head, stream, SHAPE)


@triton.jit
def load_offset(offset, offset_ptr, OFFSET_IN_MEMORY: tl.constexpr):
    """The call's Philox offset split into two uint32 halves (read from device memory for graph replay)."""
    if OFFSET_IN_MEMORY:
        off = tl.load(offset_ptr).to(tl.int64)
    else:
        off = offset.to(tl.int64)
    return (off & 0xFFFFFFFF).to(tl.uint32), ((off >> 32) & 0xFFFFFFFF).to(tl.uint32)


@triton.jit
def _uniforms_kernel(out_ptr, rows_ptr, streams_ptr, seed, off_lo, off_hi, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    rows = tl.load(rows_ptr + offs, mask=mask, other=0)
    streams = tl.load(streams_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, philox_uniform(seed, off_lo, off_hi, rows, streams, [BLOCK]), mask=mask)


def kernel_uniforms(seed: int, offset: int, rows, streams):
    """The uniforms the kernels draw for int32 tensors ``rows`` (b·H + h) and ``streams`` (test hook)."""
    import torch

    rows, streams = torch.broadcast_tensors(rows.to(torch.int32), streams.to(rows.device, torch.int32))
    rows, streams = rows.contiguous(), streams.contiguous()
    out = torch.empty(rows.shape, dtype=torch.float32, device=rows.device)
    n = rows.numel()
    _uniforms_kernel[(triton.cdiv(n, 128),)](out, rows, streams, seed, offset & 0xFFFFFFFF, (offset >> 32) & 0xFFFFFFFF, n, BLOCK=128)
    return out
