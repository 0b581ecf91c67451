"""S²ANTA-flash in Triton: uniform per-tile budgets, per-tile systematic sampling, FlashDecoding merge.

Kernel 1 (:func:`_flash_partial_kernel`), one program per (tile, sequence·KV head): scores of the G
grouped heads, tile max ``m_t`` and mass ``ℓ_t``, then ``S_tile = ⌈S/T⌉`` systematic samples of
the tile's own distribution with the offset of stream ``t + 1``: cumulative counts
``K(j) = ⌈S_tile·F_t(j) − U⌉`` (clamped to ``[0, S_tile]``), ``c_j = K(j) − K(j−1)``. Only V rows
that some head of the group sampled are read; ``Õ_t = Σ_j c_j v_j``.

Kernel 2 (:func:`_flash_merge_kernel`), one program per (sequence·head):
``ô = Σ_t W_t Õ_t / (S_tile · Z)`` with ``W_t = exp(m_t − m*) ℓ_t``, ``Z = Σ_t W_t``, in tile order.
"""

from __future__ import annotations

import triton
import triton.language as tl

from santa.kernels._common import (
    LOG2E,
    cache_scale,
    call_uniforms,
    checked_seq_len,
    load_cache_rows,
    load_offset,
    row_offsets,
    tile_scores,
    tile_softmax_stats,
)
from santa.kernels._launch import Launcher
from santa.kernels.layout import workspace_strides


@triton.jit(do_not_specialize=["seed", "offset", "head_offset", "budget"])
def _flash_partial_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, partial_ptr, tile_max_ptr, tile_mass_ptr, counts_ptr, offset_ptr,
    k_scale_ptr, v_scale_ptr, seeds_ptr, positions_ptr, seed, offset, head_offset, budget, n_keys, n_pages, n_kv_heads,
    stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_part, stride_stats, stride_counts, qk_scale, k_scale, v_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_SEQ_LENS: tl.constexpr, IEEE_DOT: tl.constexpr,
    OFFSET_IN_MEMORY: tl.constexpr, RETURN_COUNTS: tl.constexpr, K_SCALE_PER_HEAD: tl.constexpr,
    V_SCALE_PER_HEAD: tl.constexpr, SEED_PER_SEQUENCE: tl.constexpr, POSITIONAL: tl.constexpr, K_F16: tl.constexpr,
):
    t = tl.program_id(0)
    pid_bk = tl.program_id(1)
    b = pid_bk // n_kv_heads
    kvh = pid_bk % n_kv_heads
    seq_len, _ = checked_seq_len(seq_lens_ptr, b, n_keys, HAS_SEQ_LENS)
    start = t * BLOCK_N
    if start < seq_len:
        s = tile_scores(
            q_ptr, k_ptr, bt_ptr, b, kvh, start, seq_len, 0, n_pages,
            stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh,
            qk_scale * cache_scale(k_scale, k_scale_ptr, kvh, K_SCALE_PER_HEAD),  # q·(s_k k) = s_k (q·k)
            G, D, BLOCK_G, BLOCK_N, BLOCK_D, PAGED, PAGE_SIZE, IEEE_DOT, "", K_F16,
        )  # [BLOCK_G, BLOCK_N], log2 units
        m, u, poisoned_mass = tile_softmax_stats(s)  # ℓ_t NaN on a row with NaN/+inf scores
        healthy = poisoned_mass == poisoned_mass  # [BLOCK_G]
        cu = tl.cumsum(u, axis=1)
        mass = tl.max(cu, axis=1)
        frac = cu / tl.where(mass > 0, mass, 1.0)[:, None]  # F_t(j), exactly 1 from the last nonzero weight on
        offs_g = tl.arange(0, BLOCK_G)
        mask_g = offs_g < G
        offs_n = tl.arange(0, BLOCK_N)
        rows = (b * n_kv_heads + kvh) * G + offs_g  # b·H + h
        n_tiles = tl.cdiv(seq_len, BLOCK_N)
        s_tile = (budget + n_tiles - 1) // n_tiles  # S_tile = ⌈S/T⌉
        s_tile_f = s_tile.to(tl.float32)
        off_lo, off_hi = load_offset(offset, offset_ptr, OFFSET_IN_MEMORY)
        uni = call_uniforms(seed, seeds_ptr, off_lo, off_hi, positions_ptr, b, n_kv_heads * G, head_offset, kvh * G + offs_g,
                            t + 1, [BLOCK_G], SEED_PER_SEQUENCE, POSITIONAL)  # the counter's head: head_offset + h
        last_nonzero = tl.max(tl.where(u > 0, offs_n[None, :], 0), axis=1)
        # K(j) = #{m < S_tile : (m + U)/S_tile < F_t(j)}
        cum = tl.ceil(s_tile_f * frac - uni[:, None])
        cum = tl.minimum(tl.maximum(cum, 0.0), s_tile_f)
        cum = tl.where(offs_n[None, :] >= last_nonzero[:, None], s_tile_f, cum).to(tl.int32)
        prev = tl.gather(cum, tl.maximum(offs_n - 1, 0)[None, :] + tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.int32), axis=1)
        prev = tl.where(offs_n[None, :] == 0, 0, prev)
        counts = tl.where(mask_g[:, None] & healthy[:, None] & (mass > 0)[:, None], cum - prev, 0)  # c_j = K(j) − K(j−1)

        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < D
        pos = start + offs_n
        needed = (tl.max(counts, axis=0) > 0) & (pos < seq_len)  # one V read serves every head of the group
        v_rows, v_ok = row_offsets(b, pos, needed, kvh, bt_ptr, stride_bt, n_pages, stride_vb, stride_vn, stride_vh, PAGED, PAGE_SIZE)
        v = load_cache_rows(v_ptr, v_rows, v_ok, offs_d, mask_d, q_ptr.dtype.element_ty, "")  # fp8: exact in q's dtype
        if IEEE_DOT:
            o = tl.dot(counts.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            # counts split into bytes so that every product is exact in bf16/fp16 operands
            c_lo = (counts % 256).to(v.dtype)
            c_hi = (counts // 256).to(v.dtype)
            o = tl.dot(c_lo, v) + 256.0 * tl.dot(c_hi, v)
        o = o * cache_scale(v_scale, v_scale_ptr, kvh, V_SCALE_PER_HEAD)  # Σ c_j (s_v v_j) = s_v Σ c_j v_j
        part_rows = rows.to(tl.int64) * stride_part + t
        tl.store(partial_ptr + part_rows[:, None] * BLOCK_D + offs_d[None, :], o, mask=mask_g[:, None])
        tl.store(tile_max_ptr + rows * stride_stats + t, m, mask=mask_g)
        tl.store(tile_mass_ptr + rows * stride_stats + t, tl.where(healthy, mass, float("nan")), mask=mask_g)
        if RETURN_COUNTS:
            c_offs = rows.to(tl.int64)[:, None] * stride_counts + pos[None, :]
            tl.store(counts_ptr + c_offs, counts, mask=mask_g[:, None] & (pos < seq_len)[None, :])


@triton.jit(do_not_specialize=["budget"])
def _flash_merge_kernel(
    partial_ptr, tile_max_ptr, tile_mass_ptr, seq_lens_ptr, out_ptr,
    budget, n_keys, n_heads, tiles_max, stride_part, stride_stats, stride_ob, stride_oh,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    HAS_SEQ_LENS: tl.constexpr,
):
    row = tl.program_id(0)
    b = row // n_heads
    h = row % n_heads
    seq_len, bad_len = checked_seq_len(seq_lens_ptr, b, n_keys, HAS_SEQ_LENS)
    n_tiles = tl.cdiv(seq_len, BLOCK_N)
    s_tile = (budget + tl.maximum(n_tiles, 1) - 1) // tl.maximum(n_tiles, 1)
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    stats_row = row.to(tl.int64) * stride_stats
    m_star = -float("inf")
    t0 = 0
    while t0 < tiles_max:  # a host bound (n_tiles masks); a while loop keeps the interpreter happy
        mask_t = t0 + offs_t < n_tiles
        tmax = tl.load(tile_max_ptr + stats_row + t0 + offs_t, mask=mask_t, other=-float("inf"))
        m_star = tl.maximum(m_star, tl.max(tmax, axis=0))
        t0 += BLOCK_T
    m_star = tl.where(m_star == -float("inf"), 0.0, m_star)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    z = 0.0
    n_poisoned = 0
    t0 = 0
    while t0 < tiles_max:  # a host bound (n_tiles masks); a while loop keeps the interpreter happy
        mask_t = t0 + offs_t < n_tiles
        tmax = tl.load(tile_max_ptr + stats_row + t0 + offs_t, mask=mask_t, other=-float("inf"))
        tmass = tl.load(tile_mass_ptr + stats_row + t0 + offs_t, mask=mask_t, other=0.0)
        w = tl.where(mask_t, tl.exp2(tmax - m_star) * tmass, 0.0)  # W_t = exp(m_t − m*) ℓ_t
        part_rows = row.to(tl.int64) * stride_part + t0 + offs_t
        part = tl.load(partial_ptr + part_rows[:, None] * BLOCK_D + offs_d[None, :], mask=mask_t[:, None], other=0.0)
        n_poisoned += tl.sum((tmass != tmass).to(tl.int32), axis=0)
        acc += tl.sum(tl.where(mask_t[:, None], w[:, None] * part, 0.0), axis=0)
        z += tl.sum(w, axis=0)
        t0 += BLOCK_T
    denom = z * s_tile.to(tl.float32)
    result = tl.where(denom > 0, acc / tl.where(denom > 0, denom, 1.0), 0.0)
    result = tl.where((n_poisoned > 0) | bad_len, float("nan"), result)  # NaN/+inf scores, bad page ids or seq_len
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d, result.to(out_ptr.dtype.element_ty), mask=offs_d < D)


def flash_launchers(plan, *, has_seq_lens: bool, offset_in_memory: bool, return_counts: bool, k_scale_per_head: bool = False,
                    v_scale_per_head: bool = False, seed_per_sequence: bool = False, positional: bool = False,
                    has_starts: bool = False) -> list:
    """flash's two launches for a :class:`santa.kernels.plan.DecodePlan`: ``[(name, Launcher)]``; each
    call's other arguments come by kernel name from ``DecodePlan._arguments``. flash's tile budgets
    count tiles from key 0, so runs that start later (``starts``) are prop's alone."""
    if has_starts:
        raise ValueError("starts (keys visible from a later first key: left padding, windows) need kernel='prop': "
                         "flash's per-tile budgets count the tiles from key 0")
    shape = plan.shape
    paged = shape.page_size is not None
    n_keys, qk_scale = shape.n_keys, plan.scale * LOG2E
    _, stride_stats = workspace_strides(plan.workspace_key)
    stats_fixed = dict(stride_part=plan.tiles, stride_stats=stride_stats, budget=plan.budget, n_keys=n_keys)
    partial = Launcher(_flash_partial_kernel, grid=(plan.tiles, shape.batch * shape.kv_heads),
                       fixed=dict(stats_fixed, n_kv_heads=shape.kv_heads, qk_scale=qk_scale), meta=dict(
        G=plan.group, D=shape.head_dim, BLOCK_G=plan.block_g, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d,
        PAGED=paged, PAGE_SIZE=shape.page_size or 1, HAS_SEQ_LENS=has_seq_lens, IEEE_DOT=plan.ieee_dot,
        OFFSET_IN_MEMORY=offset_in_memory, RETURN_COUNTS=return_counts, K_SCALE_PER_HEAD=k_scale_per_head,
        V_SCALE_PER_HEAD=v_scale_per_head, SEED_PER_SEQUENCE=seed_per_sequence, POSITIONAL=positional, K_F16=plan.k_f16,
        num_warps=8 if shape.head_dim > 128 else 4, num_stages=1,
    ))
    merge = Launcher(_flash_merge_kernel, grid=(shape.batch * shape.heads,),
                     fixed=dict(stats_fixed, n_heads=shape.heads, tiles_max=plan.tiles), meta=dict(
        D=shape.head_dim, BLOCK_D=plan.block_d, BLOCK_N=plan.block_n, BLOCK_T=min(64, triton.next_power_of_2(plan.tiles)),
        HAS_SEQ_LENS=has_seq_lens, num_warps=4, num_stages=1,
    ))

    return [("partial", partial), ("merge", merge)]
