"""S²ANTA-prop in Triton, exact global systematic sampling, in one cooperative launch.

The grid is persistent (:class:`santa.kernels.layout.PropGrid`): each CTA takes work items
``(group, slice)`` (a group is one sequence and KV head, a slice a run of its key tiles) round by
round. For one item the CTA

1. *streams* its slice (:func:`_stream_slice`): the G grouped heads' scores from one read of each K
   tile, the tile max ``m_t`` and mass ``ℓ_t = Σ exp(s − m_t)``, and ``u = exp(s − m_t)`` into its
   own slot (reused every round, so it stays in L2); it publishes the slice's ``(m_c, ℓ_c)`` per
   head and arrives at the group's counter;
2. waits until every slice of the group has arrived (every CTA is resident: the launch is cooperative);
3. *samples* its slice (:func:`_sample_slice`): from the group's slice statistics, in the same order
   in every CTA of the group (so they agree bit for bit), the global max ``m*``, ``Z`` and the
   prefix ``P_c = S·Σ_{c'≤c} W_{c'}/Z`` with ``W_c = exp(m_c − m*) ℓ_c``. Comb point m (one offset U
   per sequence and head) lies in slice c iff ``P_{c−1} − m ≤ U < P_c − m``; the CTA places those
   points on its tiles, then on keys (from its slot), gathers their V rows and writes the slice's
   partial sum. The group's last CTA to finish adds the partials in slice order and resets the
   group's counters.

This is S²ANTA-sys over the whole sequence: per key, ``c_j = #{m : F(j−1) ≤ (m+U)/S < F(j)}``, as
:func:`santa.sample_counts` with ``sampler="systematic"`` (up to float32 rounding of the CDF).

Triton's interpreter runs programs one after another, so a spin barrier cannot complete there:
on the CPU each round runs as two launches of the same kernel, streaming then sampling.
"""

from __future__ import annotations

import triton
import triton.language as tl

from santa.kernels._common import (
    LOG2E,
    checked_seq_len,
    load_cache_rows,
    load_offset,
    philox_uniform,
    row_offsets,
    tile_scores,
    tile_softmax_stats,
)
from santa.kernels._launch import Launcher
from santa.kernels.layout import next_pow2

STREAM, SAMPLE = 1, 2  # the kernel's phases, a bit mask: 3 runs both with the group barrier between them


@triton.jit
def _stream_tile(
    q_ptr, k_ptr, bt_ptr, slot_ptr, tile_m, tile_l, i, b, kvh, tile_lo, slot_rows, seq_len, n_pages,
    stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, qk_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    TILES_PER_SLICE: tl.constexpr, BLOCK_TPS: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    IEEE_DOT: tl.constexpr, K_EVICTION: tl.constexpr,
):
    """Tile i of the slice: its ``u`` into the slot, its ``(m_t, ℓ_t)`` into column i of tile_m, tile_l."""
    s = tile_scores(
        q_ptr, k_ptr, bt_ptr, b, kvh, (tile_lo + i) * BLOCK_N, seq_len, n_pages,
        stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, qk_scale,
        G, D, BLOCK_G, BLOCK_N, BLOCK_D, PAGED, PAGE_SIZE, IEEE_DOT, K_EVICTION,
    )  # [BLOCK_G, BLOCK_N], log2 units
    m, u, mass = tile_softmax_stats(s)  # u = exp(s − m_t), 0 off the sequence; ℓ_t NaN on a poisoned row
    offs_n = tl.arange(0, BLOCK_N)
    mask_g = tl.arange(0, BLOCK_G) < G
    tl.store(slot_ptr + slot_rows[:, None] * (TILES_PER_SLICE * BLOCK_N) + i * BLOCK_N + offs_n[None, :], u,
             mask=mask_g[:, None])
    here = tl.arange(0, BLOCK_TPS)[None, :] == i
    return tl.where(here, m[:, None], tile_m), tl.where(here, mass[:, None], tile_l)


@triton.jit
def _stream_slice(
    q_ptr, k_ptr, bt_ptr, slot_ptr, slot_max_ptr, slot_mass_ptr,
    b, kvh, c, pid, seq_len, n_pages, stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, qk_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    TILES_PER_SLICE: tl.constexpr, BLOCK_TPS: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    IEEE_DOT: tl.constexpr, NUM_STAGES: tl.constexpr, K_EVICTION: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Stream phase of item (group, slice c) on program pid: writes the slot (``u``, ``m_t``, ``ℓ_t`` of
    the slice's tiles) and returns the slice's ``(m_c, ℓ_c)`` per head, ``[BLOCK_G]`` each."""
    offs_g = tl.arange(0, BLOCK_G)
    offs_t = tl.arange(0, BLOCK_TPS)
    mask_g = offs_g < G
    slot_rows = (pid * G + offs_g).to(tl.int64)
    tile_lo = c * TILES_PER_SLICE
    n_tiles = tl.minimum(tl.cdiv(seq_len, BLOCK_N) - tile_lo, TILES_PER_SLICE)  # ≤ 0: the slice lies past the sequence
    tile_m = tl.full([BLOCK_G, BLOCK_TPS], -float("inf"), dtype=tl.float32)
    tile_l = tl.zeros([BLOCK_G, BLOCK_TPS], dtype=tl.float32)
    if INTERPRET:  # the interpreter's loops take no kernel arguments as bounds
        i = 0
        while i < n_tiles:
            tile_m, tile_l = _stream_tile(
                q_ptr, k_ptr, bt_ptr, slot_ptr, tile_m, tile_l, i, b, kvh, tile_lo, slot_rows, seq_len, n_pages,
                stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, qk_scale, G, D, BLOCK_G, BLOCK_N, BLOCK_D,
                TILES_PER_SLICE, BLOCK_TPS, PAGED, PAGE_SIZE, IEEE_DOT, K_EVICTION,
            )
            i += 1
    else:
        for i in tl.range(0, n_tiles, num_stages=NUM_STAGES):  # K loads pipelined NUM_STAGES deep
            tile_m, tile_l = _stream_tile(
                q_ptr, k_ptr, bt_ptr, slot_ptr, tile_m, tile_l, i, b, kvh, tile_lo, slot_rows, seq_len, n_pages,
                stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, qk_scale, G, D, BLOCK_G, BLOCK_N, BLOCK_D,
                TILES_PER_SLICE, BLOCK_TPS, PAGED, PAGE_SIZE, IEEE_DOT, K_EVICTION,
            )
    stats = slot_rows[:, None] * TILES_PER_SLICE + offs_t[None, :]
    mask_gt = mask_g[:, None] & (offs_t < TILES_PER_SLICE)[None, :]
    tl.store(slot_max_ptr + stats, tile_m, mask=mask_gt)
    tl.store(slot_mass_ptr + stats, tile_l, mask=mask_gt)
    m_c = tl.max(tile_m, axis=1)
    m_safe = tl.where(m_c == -float("inf"), 0.0, m_c)
    l_c = tl.sum(tl.exp2(tile_m - m_safe[:, None]) * tile_l, axis=1)  # ℓ_c = Σ_t exp(m_t − m_c) ℓ_t (NaN stays NaN)
    return m_c, l_c


@triton.jit
def _group_prefix(slice_max_ptr, slice_mass_ptr, rows, mask_g, c, n_slices, budget_f, BLOCK_C: tl.constexpr):
    """Per head of the group ``[BLOCK_G]``: ``(P_{c−1}, P_c, m*, Z, poisoned)`` from the published slice
    statistics, computed alike in every CTA of the group; ``P_last = S`` exactly (Z over itself)."""
    offs_c = tl.arange(0, BLOCK_C)
    mask = mask_g[:, None] & (offs_c < n_slices)[None, :]
    where = rows.to(tl.int64)[:, None] * n_slices + offs_c[None, :]
    smax = tl.load(slice_max_ptr + where, mask=mask, other=-float("inf"), cache_modifier=".cg")
    smass = tl.load(slice_mass_ptr + where, mask=mask, other=0.0, cache_modifier=".cg")
    m_star = tl.max(smax, axis=1)
    m_star = tl.where(m_star == -float("inf"), 0.0, m_star)
    w = tl.where(mask, tl.exp2(smax - m_star[:, None]) * smass, 0.0)  # W_c = exp(m_c − m*) ℓ_c
    poisoned = tl.max((smass != smass).to(tl.int32), axis=1) > 0
    cs = tl.cumsum(w, axis=1)
    z = tl.max(cs, axis=1)  # the last prefix, so that P_last = (Z/Z)·S = S exactly
    zs = tl.where(z > 0, z, 1.0)
    p = (cs / zs[:, None]) * budget_f  # P_c = S·C_c
    p_hi = tl.sum(tl.where(offs_c[None, :] == c, p, 0.0), axis=1)
    p_lo = tl.sum(tl.where(offs_c[None, :] == c - 1, p, 0.0), axis=1)
    return p_lo, p_hi, m_star, z, poisoned


@triton.jit
def _sample_slice(
    v_ptr, bt_ptr, slot_ptr, slot_max_ptr, slot_mass_ptr, slice_max_ptr, slice_mass_ptr, partial_ptr, counts_ptr,
    g, b, kvh, c, pid, seq_len, bad_len, n_pages, n_slices, u_heads, budget,
    stride_bt, stride_vb, stride_vn, stride_vh, stride_counts,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    TILES_PER_SLICE: tl.constexpr, BLOCK_TPS: tl.constexpr, BLOCK_C: tl.constexpr, SBLOCK: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, RETURN_COUNTS: tl.constexpr,
):
    """Sample phase of item (group g, slice c) on program pid: place the slice's comb points, gather
    their V rows, write each head's partial ``Σ v`` (NaN for a poisoned head or a bad seq_len)."""
    offs_g = tl.arange(0, BLOCK_G)
    offs_t = tl.arange(0, BLOCK_TPS)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < G
    mask_d = offs_d < D
    budget_f = budget.to(tl.float32)
    rows = g * G + offs_g  # b·H + h
    p_lo, p_hi, m_star, z, poisoned = _group_prefix(slice_max_ptr, slice_mass_ptr, rows, mask_g, c, n_slices, budget_f, BLOCK_C)

    # the slice's tile prefix Q_t = P_{c−1} + S·Σ_{t'≤t} W_{t'}/Z; its last tile ends at P_c exactly
    tile_lo = c * TILES_PER_SLICE
    n_tiles = tl.maximum(tl.minimum(tl.cdiv(seq_len, BLOCK_N) - tile_lo, TILES_PER_SLICE), 0)
    slot_rows = (pid * G + offs_g).to(tl.int64)
    mask_t = offs_t < n_tiles
    stats = slot_rows[:, None] * TILES_PER_SLICE + offs_t[None, :]
    tmax = tl.load(slot_max_ptr + stats, mask=mask_g[:, None] & mask_t[None, :], other=-float("inf"), cache_modifier=".cg")
    tmass = tl.load(slot_mass_ptr + stats, mask=mask_g[:, None] & mask_t[None, :], other=0.0, cache_modifier=".cg")
    w = tl.where(mask_t[None, :], tl.exp2(tmax - m_star[:, None]) * tmass, 0.0)
    zs = tl.where(z > 0, z, 1.0)
    prefix = p_lo[:, None] + (tl.cumsum(w, axis=1) / zs[:, None]) * budget_f
    prefix = tl.where(offs_t[None, :] == n_tiles - 1, p_hi[:, None], prefix)
    prefix = tl.where(mask_t[None, :], prefix, float("inf"))

    for gh in range(G):
        here = offs_g == gh
        row = g * G + gh
        u = tl.sum(tl.where(here, u_heads, 0.0), axis=0)
        lo_c = tl.sum(tl.where(here, p_lo, 0.0), axis=0)
        hi_c = tl.sum(tl.where(here, p_hi, 0.0), axis=0)
        z_h = tl.sum(tl.where(here, z, 0.0), axis=0)
        nan_row = (tl.sum(tl.where(here, poisoned.to(tl.int32), 0), axis=0) > 0) | bad_len
        live = (z_h > 0) & (n_tiles > 0) & ~nan_row
        q_h = tl.sum(tl.where(here[:, None], prefix, 0.0), axis=0)  # [BLOCK_TPS], +inf past the slice's tiles
        # the points with P_{c−1} − m ≤ U < P_c − m lie in [⌊P_{c−1} − U⌋, ⌈P_c − U⌉]: test each exactly
        m_first = tl.where(live, tl.maximum(tl.floor(lo_c - u), 0.0), 0.0).to(tl.int32)
        m_end = tl.where(live, tl.minimum(tl.ceil(hi_c - u) + 1.0, budget_f), 0.0).to(tl.int32)
        slot_row = (pid * G + gh).to(tl.int64) * (TILES_PER_SLICE * BLOCK_N)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        m0 = m_first
        while m0 < m_end:
            offs_m = m0 + tl.arange(0, SBLOCK)
            m_f = offs_m.to(tl.float32)
            ok = (offs_m < m_end) & ((lo_c - m_f) <= u) & ((hi_c - m_f) > u)
            le = (q_h[None, :] - m_f[:, None]) <= u  # [SBLOCK, BLOCK_TPS]
            tile = tl.minimum(tl.sum(le.to(tl.int32), axis=1), tl.maximum(n_tiles - 1, 0))
            lo = tl.max(tl.where(le, q_h[None, :], lo_c), axis=1)  # Q_{tile−1}, or P_{c−1} in the first tile
            hi = tl.min(tl.where(le, float("inf"), q_h[None, :]), axis=1)  # Q_tile
            # inside the tile: key = min{ j : F_tile(j) > x } with x the point's place in [Q_{tile−1}, Q_tile)
            pos = tile[:, None] * BLOCK_N + offs_n[None, :]  # [SBLOCK, BLOCK_N], keys from the slice's start
            stash = tl.load(slot_ptr + slot_row + pos, mask=ok[:, None] & (tile_lo * BLOCK_N + pos < seq_len), other=0.0,
                            cache_modifier=".cg")
            cu = tl.cumsum(stash, axis=1)
            tile_total = tl.max(cu, axis=1)
            frac = cu / tl.where(tile_total > 0, tile_total, 1.0)[:, None]
            width = hi - lo
            x = (u - (lo - m_f)) / tl.where(width > 0, width, 1.0)
            last_nonzero = tl.max(tl.where(stash > 0, offs_n[None, :], 0), axis=1)
            j = tl.sum((frac <= x[:, None]).to(tl.int32), axis=1)
            key = (tile_lo + tile) * BLOCK_N + tl.minimum(j, last_nonzero)
            v_rows, v_ok = row_offsets(b, key, ok, kvh, bt_ptr, stride_bt, n_pages, stride_vb, stride_vn, stride_vh, PAGED, PAGE_SIZE)
            vals = load_cache_rows(v_ptr, v_rows, v_ok, offs_d, mask_d, "")
            acc += tl.sum(vals.to(tl.float32), axis=0)  # Σ v_{J_m} (non-finite if a sampled row is)
            if RETURN_COUNTS:
                tl.atomic_add(counts_ptr + row.to(tl.int64) * stride_counts + key, 1, mask=ok)
            m0 += SBLOCK
        acc = tl.where(nan_row, float("nan"), acc)
        tl.store(partial_ptr + (row.to(tl.int64) * n_slices + c) * BLOCK_D + offs_d, acc)


@triton.jit
def _finish_group(partial_ptr, out_ptr, g, b, kvh, n_slices, budget, stride_ob, stride_oh,
                  G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK_C: tl.constexpr):
    """The group's last CTA: each head's output, the sum of its slices' partials in slice order, over S."""
    offs_d = tl.arange(0, BLOCK_D)
    budget_f = budget.to(tl.float32)
    for gh in range(G):
        row = (g * G + gh).to(tl.int64)
        total = tl.zeros([BLOCK_D], dtype=tl.float32)
        c0 = 0
        while c0 < n_slices:
            offs_c = c0 + tl.arange(0, CHUNK_C)
            part = tl.load(partial_ptr + (row * n_slices + offs_c)[:, None] * BLOCK_D + offs_d[None, :],
                           mask=(offs_c < n_slices)[:, None], other=0.0, cache_modifier=".cg")
            total += tl.sum(part, axis=0)
            c0 += CHUNK_C
        out = out_ptr + b.to(tl.int64) * stride_ob + (kvh * G + gh) * stride_oh + offs_d
        tl.store(out, (total / budget_f).to(out_ptr.dtype.element_ty), mask=offs_d < D)


@triton.jit(do_not_specialize=["seed", "offset", "budget", "round_lo", "round_hi"])
def _prop_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, offset_ptr, out_ptr, counts_ptr,
    counters_ptr, slot_ptr, slot_max_ptr, slot_mass_ptr, slice_max_ptr, slice_mass_ptr, partial_ptr,
    seed, offset, budget, n_keys, n_pages, n_kv_heads, n_slices, n_items, round_lo, round_hi,
    stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_ob, stride_oh, stride_counts, qk_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    TILES_PER_SLICE: tl.constexpr, BLOCK_TPS: tl.constexpr, BLOCK_C: tl.constexpr, CHUNK_C: tl.constexpr,
    SBLOCK: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_SEQ_LENS: tl.constexpr,
    OFFSET_IN_MEMORY: tl.constexpr, RETURN_COUNTS: tl.constexpr, IEEE_DOT: tl.constexpr, NUM_STAGES: tl.constexpr,
    K_EVICTION: tl.constexpr, PHASES: tl.constexpr,
):
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    off_lo, off_hi = load_offset(offset, offset_ptr, OFFSET_IN_MEMORY)
    offs_g = tl.arange(0, BLOCK_G)
    mask_g = offs_g < G
    r = round_lo
    while r < round_hi:  # (a while loop: the interpreter's range() takes no kernel arguments)
        item = r * n_programs + pid
        if item < n_items:
            g = item // n_slices
            c = item % n_slices
            b = g // n_kv_heads
            kvh = g % n_kv_heads
            seq_len, bad_len = checked_seq_len(seq_lens_ptr, b, n_keys, HAS_SEQ_LENS)
            rows = g * G + offs_g  # b·H + h
            arrivals = counters_ptr + 2 * g
            if PHASES & 1:  # STREAM
                m_c, l_c = _stream_slice(
                    q_ptr, k_ptr, bt_ptr, slot_ptr, slot_max_ptr, slot_mass_ptr,
                    b, kvh, c, pid, seq_len, n_pages, stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh,
                    qk_scale, G, D, BLOCK_G, BLOCK_N, BLOCK_D, TILES_PER_SLICE, BLOCK_TPS, PAGED, PAGE_SIZE, IEEE_DOT,
                    NUM_STAGES, K_EVICTION, PHASES != 3,
                )
                tl.store(slice_max_ptr + rows.to(tl.int64) * n_slices + c, m_c, mask=mask_g)
                tl.store(slice_mass_ptr + rows.to(tl.int64) * n_slices + c, l_c, mask=mask_g)
                tl.debug_barrier()  # every thread's stores are issued before the arrival
                tl.atomic_add(arrivals, 1, sem="release")
            if PHASES == 3:  # wait for the group's other slices (all resident: a cooperative launch)
                arrived = tl.atomic_add(arrivals, 0, sem="acquire")
                while arrived < n_slices:
                    arrived = tl.atomic_add(arrivals, 0, sem="acquire")
                tl.debug_barrier()
            if PHASES & 2:  # SAMPLE
                u_heads = philox_uniform(seed, off_lo, off_hi, rows, 0, [BLOCK_G])  # one U per (sequence, head)
                _sample_slice(
                    v_ptr, bt_ptr, slot_ptr, slot_max_ptr, slot_mass_ptr, slice_max_ptr, slice_mass_ptr, partial_ptr,
                    counts_ptr, g, b, kvh, c, pid, seq_len, bad_len, n_pages, n_slices, u_heads, budget,
                    stride_bt, stride_vb, stride_vn, stride_vh, stride_counts,
                    G, D, BLOCK_G, BLOCK_N, BLOCK_D, TILES_PER_SLICE, BLOCK_TPS, BLOCK_C, SBLOCK,
                    PAGED, PAGE_SIZE, RETURN_COUNTS,
                )
                tl.debug_barrier()  # every thread's partial is stored before the finish count
                finished = tl.atomic_add(arrivals + 1, 1, sem="acq_rel")
                if finished == n_slices - 1:  # the group's last slice: add the partials, reset the counters
                    _finish_group(partial_ptr, out_ptr, g, b, kvh, n_slices, budget, stride_ob, stride_oh,
                                  G, D, BLOCK_D, CHUNK_C)
                    tl.atomic_xchg(arrivals, 0)
                    tl.atomic_xchg(arrivals + 1, 0)
        r += 1


def prop_launchers(plan, *, has_seq_lens: bool, offset_in_memory: bool, return_counts: bool) -> list:
    """prop's launches for a :class:`santa.kernels.plan.DecodePlan` as ``[(name, Launcher)]``: one
    cooperative launch on the GPU; on the CPU (Triton's interpreter) a stream and a sample launch per
    round. Each call's other arguments come by kernel name from ``DecodePlan._arguments``."""
    shape, grid = plan.shape, plan.workspace_key.grid
    fixed = dict(budget=plan.budget, n_keys=shape.n_keys, n_kv_heads=shape.kv_heads, n_slices=grid.slices,
                 n_items=shape.batch * shape.kv_heads * grid.slices, qk_scale=plan.scale * LOG2E)
    meta = dict(
        G=plan.group, D=shape.head_dim, BLOCK_G=plan.block_g, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d,
        TILES_PER_SLICE=grid.tiles_per_slice, BLOCK_TPS=next_pow2(grid.tiles_per_slice), BLOCK_C=next_pow2(grid.slices),
        CHUNK_C=min(32, next_pow2(grid.slices)), SBLOCK=plan.samples_per_block,
        PAGED=shape.page_size is not None, PAGE_SIZE=shape.page_size or 1, HAS_SEQ_LENS=has_seq_lens,
        OFFSET_IN_MEMORY=offset_in_memory, RETURN_COUNTS=return_counts, IEEE_DOT=plan.ieee_dot,
        NUM_STAGES=plan.pipeline_stages, K_EVICTION="evict_first" if plan.k_evict_first else "",
        num_warps=plan.warps, num_stages=1,
    )
    if not plan.on_cpu:
        one = Launcher(_prop_kernel, grid=(grid.programs,), fixed=dict(fixed, round_lo=0, round_hi=grid.rounds),
                       meta=dict(meta, PHASES=STREAM | SAMPLE, launch_cooperative_grid=True))
        return [("prop", one)]
    launches = []
    for r in range(grid.rounds):
        for name, phase in (("stream", STREAM), ("sample", SAMPLE)):
            launches.append((f"round{r}.{name}", Launcher(_prop_kernel, grid=(grid.programs,),
                             fixed=dict(fixed, round_lo=r, round_hi=r + 1), meta=dict(meta, PHASES=phase))))
    return launches
