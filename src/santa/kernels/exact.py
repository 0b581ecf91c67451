"""Exact attention for the sequences a budget covers: the one rule of every decode path.

A sequence with ``n_live ≤ S`` live keys cannot be read more cheaply by sampling S value rows than by
reading its n_live rows, and sampling would only add variance; so every path computes it exactly,
``o = softmax(q·Kᵀ·scale) V`` over its live keys, each V row read once (count 1): the torch reference
(:func:`santa.kernels.reference.covered`), the Triton prop and flash (this launch after their two), the one-launch
CUDA prop (inside its launch) and ``santa.hf``. The decision is per sequence, on its own live keys (``seq_lens[b] − starts[b]``, read on
the device), never on the cache's capacity or a batch's padded length.

:func:`_exact_covered_kernel` runs after the Triton launches (and alone where S covers every sequence's keys), one
program per (sequence, KV head):
a sequence with more than S live keys (or a bad length or start, which the sampled launch has already
made NaN) returns at once; a covered one has its G heads' outputs (and counts) overwritten with exact
attention over its ≤ S keys, in blocks of BLOCK_N keys with an online softmax (base 2, as the scores).
A NaN or +inf score makes the head's output NaN and its counts zero, as where it samples.
"""

from __future__ import annotations

import triton
import triton.language as tl

from santa.kernels._common import (
    LOG2E,
    cache_scale,
    checked_first_key,
    checked_seq_len,
    gate_open,
    load_cache_rows,
    row_offsets,
    tile_scores,
)
from santa.kernels._launch import Launcher


@triton.jit(do_not_specialize=["budget"])
def _exact_covered_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, starts_ptr, out_ptr, counts_ptr, k_scale_ptr, v_scale_ptr, enabled_ptr,
    budget, n_keys, n_pages, n_kv_heads, stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_ob, stride_oh, stride_counts, qk_scale, k_scale, v_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_SEQ_LENS: tl.constexpr, HAS_STARTS: tl.constexpr,
    K_F16: tl.constexpr, RETURN_COUNTS: tl.constexpr, K_SCALE_PER_HEAD: tl.constexpr, V_SCALE_PER_HEAD: tl.constexpr,
    GATED: tl.constexpr,
):
    pid = tl.program_id(0)
    b = pid // n_kv_heads
    kvh = pid % n_kv_heads
    seq_len, bad_len = checked_seq_len(seq_lens_ptr, b, n_keys, HAS_SEQ_LENS)
    first, bad_start = checked_first_key(starts_ptr, b, seq_len, HAS_STARTS)
    if GATED:  # a closed gate: every sequence as if uncovered (nothing written)
        seq_len = tl.where(gate_open(enabled_ptr, GATED), seq_len, budget + first + 1)
    if (seq_len - first <= budget) & ~(bad_len | bad_start):
        score_scale = qk_scale * cache_scale(k_scale, k_scale_ptr, kvh, K_SCALE_PER_HEAD)
        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        mask_g = offs_g < G
        mask_d = offs_d < D
        row_max = tl.full([BLOCK_G], -float("inf"), dtype=tl.float32)
        mass = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
        poisoned = tl.zeros([BLOCK_G], dtype=tl.int32)
        start = first
        while start < seq_len:
            s = tile_scores(
                q_ptr, k_ptr, bt_ptr, b, kvh, start, seq_len, first, n_pages,
                stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, score_scale,
                G, D, BLOCK_G, BLOCK_N, BLOCK_D, PAGED, PAGE_SIZE, True, "", K_F16,
            )  # [BLOCK_G, BLOCK_N], log2 units: −inf off the run, NaN behind a bad page id
            bad = (s != s) | (s == float("inf"))
            poisoned = tl.maximum(poisoned, tl.max(bad.to(tl.int32), axis=1))
            s = tl.where(bad, -float("inf"), s)
            new_max = tl.maximum(row_max, tl.max(s, axis=1))
            safe = tl.where(new_max == -float("inf"), 0.0, new_max)
            rescale = tl.exp2(row_max - safe)  # 0 while row_max is −inf
            p = tl.exp2(s - safe[:, None])
            offs_n = start + tl.arange(0, BLOCK_N)
            live = offs_n < seq_len
            v_rows, v_ok = row_offsets(b, offs_n, live, kvh, bt_ptr, stride_bt, n_pages, stride_vb, stride_vn, stride_vh,
                                       PAGED, PAGE_SIZE)
            vals = load_cache_rows(v_ptr, v_rows, v_ok, offs_d, mask_d, tl.float32, "")  # every live row, read once
            acc = acc * rescale[:, None] + tl.dot(p, vals, input_precision="ieee")
            mass = mass * rescale + tl.sum(p, axis=1)
            row_max = new_max
            start += BLOCK_N
        result = tl.where(mass[:, None] > 0, acc / tl.where(mass > 0, mass, 1.0)[:, None], 0.0)
        result = result * cache_scale(v_scale, v_scale_ptr, kvh, V_SCALE_PER_HEAD)
        result = tl.where(poisoned[:, None] > 0, float("nan"), result)
        heads = kvh * G + offs_g
        out_rows = b.to(tl.int64) * stride_ob + heads.to(tl.int64) * stride_oh
        tl.store(out_ptr + out_rows[:, None] + offs_d[None, :], result.to(out_ptr.dtype.element_ty),
                 mask=mask_g[:, None] & mask_d[None, :])
        if RETURN_COUNTS:  # one read per live key; zero for a poisoned head (it reads nothing)
            rows = (b * n_kv_heads * G + heads).to(tl.int64) * stride_counts
            start = first
            while start < seq_len:
                offs_n = start + tl.arange(0, BLOCK_N)
                read = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.int32) + (poisoned == 0).to(tl.int32)[:, None]
                tl.store(counts_ptr + rows[:, None] + offs_n[None, :], read,
                         mask=mask_g[:, None] & (offs_n < seq_len)[None, :])
                start += BLOCK_N


def exact_launcher(plan, *, has_seq_lens: bool, return_counts: bool, k_scale_per_head: bool, v_scale_per_head: bool,
                   has_starts: bool, gated: bool = False) -> Launcher:
    """The covered-sequence launch of a :class:`santa.kernels.plan.DecodePlan` (its other arguments come by
    name from ``DecodePlan._arguments``)."""
    shape = plan.shape
    return Launcher(_exact_covered_kernel, grid=(shape.batch * shape.kv_heads,), fixed=dict(
        budget=plan.budget, n_keys=shape.n_keys, n_kv_heads=shape.kv_heads, qk_scale=plan.scale * LOG2E,
    ), meta=dict(
        G=plan.group, D=shape.head_dim, BLOCK_G=plan.block_g, BLOCK_N=32, BLOCK_D=plan.block_d,
        PAGED=shape.page_size is not None, PAGE_SIZE=shape.page_size or 1, HAS_SEQ_LENS=has_seq_lens,
        HAS_STARTS=has_starts, K_F16=plan.k_f16, RETURN_COUNTS=return_counts, K_SCALE_PER_HEAD=k_scale_per_head,
        V_SCALE_PER_HEAD=v_scale_per_head, GATED=gated, num_warps=4, num_stages=1,
    ))
