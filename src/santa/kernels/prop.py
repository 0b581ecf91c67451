"""S²ANTA-prop in Triton, exact global systematic variant ("prop-global-sys"): two launches.

Pass 1 (:func:`_prop_scores_kernel`), one program per (tile, sequence·KV head): the scores of the
G grouped heads from one read of the K tile, tile max ``m_t`` and mass ``ℓ_t = Σ exp(s − m_t)``,
and the stash ``u = exp(s − m_t)``.

Pass 2 (:func:`_prop_gather_kernel`), one program per (chunk of samples, sequence·head): with one
offset U per (sequence, head), sample m sits at ``(m + U)/S`` on the global CDF. The tile prefix
``C_t = Σ_{t'≤t} W_{t'} / Z`` (``W_t = exp(m_t − m*) ℓ_t``) places each sample in a tile, the tile's
stash places it on a key, and only those V rows are read. This is S²ANTA-sys over the whole
sequence (no budget kernel, no largest-remainder split): per key, ``c_j = #{m : F(j−1) ≤ (m+U)/S
< F(j)}``, as in :func:`santa.sample_counts` with ``sampler="systematic"``.

The sum over sample chunks is deterministic: each chunk writes its partial sum, and the last chunk
to finish (an integer semaphore) adds the partials in chunk order, then resets the semaphore.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from santa.kernels._common import load_offset, philox_uniform, row_offsets, tile_scores
from santa.kernels.decode import prop_sample_chunks


@triton.jit
def _prop_tile(
    q_ptr, k_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, t, b, kvh, seq_len, n_kv_heads,
    stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, stride_stash, stride_stats, qk_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, IEEE_DOT: tl.constexpr,
):
    """Pass-1 work of one (tile, sequence, KV head): stash, tile max and mass of the G grouped heads."""
    start = t * BLOCK_N
    if start < seq_len:  # tiles past the sequence are never read by pass 2
        s = tile_scores(
            q_ptr, k_ptr, bt_ptr, b, kvh, start, seq_len,
            stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, qk_scale,
            G, D, BLOCK_G, BLOCK_N, BLOCK_D, PAGED, PAGE_SIZE, IEEE_DOT,
        )  # [BLOCK_G, BLOCK_N], log2 units
        m = tl.max(s, axis=1)
        u = tl.exp2(s - m[:, None])  # u = exp(s − m_t); 0 off the sequence
        mass = tl.sum(u, axis=1)
        offs_g = tl.arange(0, BLOCK_G)
        rows = (b * n_kv_heads + kvh) * G + offs_g  # b·H + h
        mask_g = offs_g < G
        offs_n = start + tl.arange(0, BLOCK_N)
        tl.store(stash_ptr + rows.to(tl.int64)[:, None] * stride_stash + offs_n[None, :], u, mask=mask_g[:, None])
        tl.store(tile_max_ptr + rows * stride_stats + t, m, mask=mask_g)
        tl.store(tile_mass_ptr + rows * stride_stats + t, mass, mask=mask_g)


@triton.jit
def _prop_scores_kernel(
    q_ptr, k_ptr, bt_ptr, seq_lens_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr,
    n_keys, n_kv_heads, stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh,
    stride_stash, stride_stats, qk_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_SEQ_LENS: tl.constexpr, IEEE_DOT: tl.constexpr,
    PDL_TRIGGER: tl.constexpr,
):
    if PDL_TRIGGER:
        gdc_launch_dependents()  # pass 2 may start launching once every pass-1 program has started
    t = tl.program_id(0)
    pid_bk = tl.program_id(1)
    b = pid_bk // n_kv_heads
    kvh = pid_bk % n_kv_heads
    if HAS_SEQ_LENS:
        seq_len = tl.load(seq_lens_ptr + b)
    else:
        seq_len = n_keys
    _prop_tile(
        q_ptr, k_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, t, b, kvh, seq_len, n_kv_heads,
        stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, stride_stash, stride_stats, qk_scale,
        G, D, BLOCK_G, BLOCK_N, BLOCK_D, PAGED, PAGE_SIZE, IEEE_DOT,
    )


@triton.jit
def _tile_prefix_search(
    tile_max_ptr, tile_mass_ptr, stats_row, n_tiles, tiles_max, u, m_f, budget_f,
    SBLOCK: tl.constexpr, BLOCK_T: tl.constexpr, ONE_CHUNK_T: tl.constexpr, CM: tl.constexpr,
):
    """Tile of each sample and the tile's prefix bounds ``P_{t−1}, P_t`` (``P_t = S·C_t``), and Z.

    Sample m lies in tile t iff ``P_{t−1} ≤ m + U < P_t``; comparisons are made as
    ``P − m ≤ U`` so that no rounding of ``m + U`` can push a point past ``P_{last} = S``.
    """
    offs_t = tl.arange(0, BLOCK_T)
    if ONE_CHUNK_T:
        mask_t = offs_t < n_tiles
        tmax = tl.load(tile_max_ptr + stats_row + offs_t, mask=mask_t, other=-float("inf"), cache_modifier=CM)
        tmass = tl.load(tile_mass_ptr + stats_row + offs_t, mask=mask_t, other=0.0, cache_modifier=CM)
        m_star = tl.max(tmax, axis=0)
        m_star = tl.where(m_star == -float("inf"), 0.0, m_star)
        w = tl.where(mask_t, tl.exp2(tmax - m_star) * tmass, 0.0)  # W_t = exp(m_t − m*) ℓ_t
        cs = tl.cumsum(w, axis=0)
        z = tl.max(cs, axis=0)  # the last prefix, so that P_last = (Z/Z)·S = S exactly
        zs = tl.where(z > 0, z, 1.0)
        p = (cs / zs) * budget_f  # P_t = S·C_t
        le = (p[None, :] - m_f[:, None]) <= u[:, None]  # [SBLOCK, BLOCK_T]
        tile = tl.sum(le.to(tl.int32), axis=1)
        lo = tl.max(tl.where(le, p[None, :], 0.0), axis=1)
        hi = tl.min(tl.where(le, float("inf"), p[None, :]), axis=1)
    else:
        m_star = -float("inf")
        t0 = 0
        while t0 < tiles_max:  # a host bound (n_tiles masks); a while loop keeps the interpreter happy
            mask_t = t0 + offs_t < n_tiles
            tmax = tl.load(tile_max_ptr + stats_row + t0 + offs_t, mask=mask_t, other=-float("inf"), cache_modifier=CM)
            m_star = tl.maximum(m_star, tl.max(tmax, axis=0))
            t0 += BLOCK_T
        m_star = tl.where(m_star == -float("inf"), 0.0, m_star)
        z = 0.0
        t0 = 0
        while t0 < tiles_max:  # a host bound (n_tiles masks); a while loop keeps the interpreter happy
            mask_t = t0 + offs_t < n_tiles
            tmax = tl.load(tile_max_ptr + stats_row + t0 + offs_t, mask=mask_t, other=-float("inf"), cache_modifier=CM)
            tmass = tl.load(tile_mass_ptr + stats_row + t0 + offs_t, mask=mask_t, other=0.0, cache_modifier=CM)
            w = tl.where(mask_t, tl.exp2(tmax - m_star) * tmass, 0.0)
            z = z + tl.max(tl.cumsum(w, axis=0), axis=0)  # carry + last prefix, as in the search below
            t0 += BLOCK_T
        zs = tl.where(z > 0, z, 1.0)
        tile = tl.zeros([SBLOCK], dtype=tl.int32)
        lo = tl.zeros([SBLOCK], dtype=tl.float32)
        hi = tl.full([SBLOCK], float("inf"), dtype=tl.float32)
        carry = 0.0
        t0 = 0
        while t0 < tiles_max:  # a host bound (n_tiles masks); a while loop keeps the interpreter happy
            mask_t = t0 + offs_t < n_tiles
            tmax = tl.load(tile_max_ptr + stats_row + t0 + offs_t, mask=mask_t, other=-float("inf"), cache_modifier=CM)
            tmass = tl.load(tile_mass_ptr + stats_row + t0 + offs_t, mask=mask_t, other=0.0, cache_modifier=CM)
            w = tl.where(mask_t, tl.exp2(tmax - m_star) * tmass, 0.0)
            cs = tl.cumsum(w, axis=0)
            p = ((carry + cs) / zs) * budget_f
            p = tl.where(mask_t, p, budget_f)
            le = (p[None, :] - m_f[:, None]) <= u[:, None]
            tile += tl.sum(le.to(tl.int32), axis=1)
            lo = tl.maximum(lo, tl.max(tl.where(le, p[None, :], 0.0), axis=1))
            hi = tl.minimum(hi, tl.min(tl.where(le, float("inf"), p[None, :]), axis=1))
            carry = carry + tl.max(cs, axis=0)
            t0 += BLOCK_T
    return tile, lo, hi, z


@triton.jit
def _prop_chunk(
    v_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, partial_ptr, sem_ptr, out_ptr, counts_ptr,
    pid_s, row, b, h, kvh, seq_len, u, budget, tiles_max,
    stride_bt, stride_vb, stride_vn, stride_vh, stride_stash, stride_stats, stride_ob, stride_oh, stride_counts,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    SBLOCK: tl.constexpr, N_CHUNKS: tl.constexpr, CHUNK_BLOCK: tl.constexpr, ONE_CHUNK_T: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, RETURN_COUNTS: tl.constexpr, CM: tl.constexpr,
):
    """Pass-2 work of one chunk of samples of one (sequence, head) row: place them, gather V, reduce."""
    n_tiles = tl.cdiv(seq_len, BLOCK_N)
    offs_s = pid_s * SBLOCK + tl.arange(0, SBLOCK)
    valid_s = offs_s < budget
    m_f = offs_s.to(tl.float32)
    budget_f = budget.to(tl.float32)
    stats_row = row.to(tl.int64) * stride_stats
    tile, lo, hi, z = _tile_prefix_search(
        tile_max_ptr, tile_mass_ptr, stats_row, n_tiles, tiles_max, u, m_f, budget_f, SBLOCK, BLOCK_T, ONE_CHUNK_T, CM
    )
    ok = valid_s & ((tl.zeros([SBLOCK], dtype=tl.float32) + z) > 0)
    tile = tl.minimum(tile, tl.maximum(n_tiles - 1, 0))

    # inside the tile: key = min{ j : F_tile(j) > x } with x the point's position in [P_{t−1}, P_t)
    offs_n = tl.arange(0, BLOCK_N)
    pos = tile[:, None] * BLOCK_N + offs_n[None, :]  # [SBLOCK, BLOCK_N]
    stash = tl.load(
        stash_ptr + row.to(tl.int64) * stride_stash + pos,
        mask=ok[:, None] & (pos < seq_len), other=0.0, cache_modifier=CM,
    )
    cu = tl.cumsum(stash, axis=1)
    tile_total = tl.max(cu, axis=1)
    frac = cu / tl.where(tile_total > 0, tile_total, 1.0)[:, None]
    width = hi - lo
    x = (u - (lo - m_f)) / tl.where(width > 0, width, 1.0)
    last_nonzero = tl.max(tl.where(stash > 0, offs_n[None, :], 0), axis=1)
    j = tl.sum((frac <= x[:, None]).to(tl.int32), axis=1)
    key = tile * BLOCK_N + tl.minimum(j, last_nonzero)

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    v_rows = row_offsets(b, key, ok, kvh, bt_ptr, stride_bt, stride_vb, stride_vn, stride_vh, PAGED, PAGE_SIZE)
    vals = tl.load(v_ptr + v_rows[:, None] + offs_d[None, :], mask=ok[:, None] & mask_d[None, :], other=0.0)
    acc = tl.sum(vals.to(tl.float32), axis=0)  # Σ over this chunk's samples of v_{J_m}
    if RETURN_COUNTS:
        tl.atomic_add(counts_ptr + row.to(tl.int64) * stride_counts + key, 1, mask=ok)

    out_offs = b.to(tl.int64) * stride_ob + h * stride_oh + offs_d
    if N_CHUNKS == 1:
        tl.store(out_ptr + out_offs, (acc / budget_f).to(out_ptr.dtype.element_ty), mask=mask_d)
    else:
        part_row = row.to(tl.int64) * N_CHUNKS
        tl.store(partial_ptr + (part_row + pid_s) * BLOCK_D + offs_d, acc)
        tl.debug_barrier()
        arrived = tl.atomic_add(sem_ptr + row, 1, sem="acq_rel")
        if arrived == N_CHUNKS - 1:  # last chunk of this head: add the partials in chunk order
            total = tl.zeros([BLOCK_D], dtype=tl.float32)
            for c0 in range(0, N_CHUNKS, CHUNK_BLOCK):
                offs_c = c0 + tl.arange(0, CHUNK_BLOCK)
                part = tl.load(
                    partial_ptr + (part_row + offs_c)[:, None] * BLOCK_D + offs_d[None, :],
                    mask=(offs_c < N_CHUNKS)[:, None], other=0.0, cache_modifier=".cg",
                )
                total += tl.sum(part, axis=0)
            tl.store(out_ptr + out_offs, (total / budget_f).to(out_ptr.dtype.element_ty), mask=mask_d)
            tl.atomic_xchg(sem_ptr + row, 0)


@triton.jit(do_not_specialize=["seed", "offset", "budget"])
def _prop_gather_kernel(
    v_ptr, bt_ptr, seq_lens_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, partial_ptr, sem_ptr,
    out_ptr, counts_ptr, offset_ptr,
    seed, offset, budget, n_keys, n_heads, tiles_max,
    stride_bt, stride_vb, stride_vn, stride_vh, stride_stash, stride_stats, stride_ob, stride_oh, stride_counts,
    G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    SBLOCK: tl.constexpr, N_CHUNKS: tl.constexpr, CHUNK_BLOCK: tl.constexpr, ONE_CHUNK_T: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_SEQ_LENS: tl.constexpr, OFFSET_IN_MEMORY: tl.constexpr,
    RETURN_COUNTS: tl.constexpr, USE_PDL: tl.constexpr,
):
    pid_s = tl.program_id(0)
    row = tl.program_id(1)  # b·H + h
    b = row // n_heads
    h = row % n_heads
    kvh = h // G
    if HAS_SEQ_LENS:
        seq_len = tl.load(seq_lens_ptr + b)
    else:
        seq_len = n_keys
    off_lo, off_hi = load_offset(offset, offset_ptr, OFFSET_IN_MEMORY)
    u = philox_uniform(seed, off_lo, off_hi, row, 0, [SBLOCK])  # one U per (sequence, head)
    if USE_PDL:
        gdc_wait()  # launched early (programmatic dependent launch): wait for pass 1's writes here
    _prop_chunk(
        v_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, partial_ptr, sem_ptr, out_ptr, counts_ptr,
        pid_s, row, b, h, kvh, seq_len, u, budget, tiles_max,
        stride_bt, stride_vb, stride_vn, stride_vh, stride_stash, stride_stats, stride_ob, stride_oh, stride_counts,
        D, BLOCK_D, BLOCK_N, BLOCK_T, SBLOCK, N_CHUNKS, CHUNK_BLOCK, ONE_CHUNK_T, PAGED, PAGE_SIZE, RETURN_COUNTS, "",
    )


@triton.jit(do_not_specialize=["seed", "offset", "budget"])
def _prop_fused_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, partial_ptr, sem_ptr,
    sync_ptr, out_ptr, counts_ptr, offset_ptr,
    seed, offset, budget, n_keys, n_kv_heads, tiles_max, n_groups,
    stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_stash, stride_stats, stride_ob, stride_oh, stride_counts, qk_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr, SBLOCK: tl.constexpr, N_CHUNKS: tl.constexpr, CHUNK_BLOCK: tl.constexpr,
    ONE_CHUNK_T: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_SEQ_LENS: tl.constexpr,
    OFFSET_IN_MEMORY: tl.constexpr, RETURN_COUNTS: tl.constexpr, IEEE_DOT: tl.constexpr,
):
    """Both passes in one launch. Work items are taken in ticket order (an atomic counter, so an
    item only ever waits on items already running or done), group by group: for each (sequence,
    KV head) its ``tiles_max`` pass-1 tiles, then its ``G·N_CHUNKS`` pass-2 chunks, which wait on
    the group's arrival counter. Pass 2 of one group thus runs while later groups stream K.
    ``sync``: [ticket, arrivals per group, pass-2 entries per group]; every launch leaves it at zero.
    """
    items_per_group = tiles_max + G * N_CHUNKS
    n_items = n_groups * items_per_group
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    if ticket == n_items - 1:  # every ticket is drawn: reset for the next launch
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed")
    grp = ticket // items_per_group
    r = ticket % items_per_group
    b = grp // n_kv_heads
    kvh = grp % n_kv_heads
    if HAS_SEQ_LENS:
        seq_len = tl.load(seq_lens_ptr + b)
    else:
        seq_len = n_keys
    arrive_ptr = sync_ptr + 1 + grp
    if r < tiles_max:
        _prop_tile(
            q_ptr, k_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, r, b, kvh, seq_len, n_kv_heads,
            stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, stride_stash, stride_stats, qk_scale,
            G, D, BLOCK_G, BLOCK_N, BLOCK_D, PAGED, PAGE_SIZE, IEEE_DOT,
        )
        tl.debug_barrier()
        tl.atomic_add(arrive_ptr, 1, sem="release")
    else:
        c = r - tiles_max
        h = kvh * G + c // N_CHUNKS
        pid_s = c % N_CHUNKS
        row = b * (n_kv_heads * G) + h
        off_lo, off_hi = load_offset(offset, offset_ptr, OFFSET_IN_MEMORY)
        u = philox_uniform(seed, off_lo, off_hi, row, 0, [SBLOCK])  # one U per (sequence, head)
        arrived = tl.atomic_add(arrive_ptr, 0, sem="acquire")
        while arrived < tiles_max:  # the group's tiles were all taken before this ticket: they finish
            arrived = tl.atomic_add(arrive_ptr, 0, sem="acquire")
        tl.debug_barrier()
        _prop_chunk(
            v_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, partial_ptr, sem_ptr, out_ptr, counts_ptr,
            pid_s, row, b, h, kvh, seq_len, u, budget, tiles_max,
            stride_bt, stride_vb, stride_vn, stride_vh, stride_stash, stride_stats, stride_ob, stride_oh, stride_counts,
            D, BLOCK_D, BLOCK_N, BLOCK_T, SBLOCK, N_CHUNKS, CHUNK_BLOCK, ONE_CHUNK_T, PAGED, PAGE_SIZE, RETURN_COUNTS, ".cg",
        )
        entered = tl.atomic_add(sync_ptr + 1 + n_groups + grp, 1, sem="relaxed")
        if entered == G * N_CHUNKS - 1:  # every chunk of the group is past its wait: reset both counters
            tl.atomic_xchg(arrive_ptr, 0, sem="relaxed")
            tl.atomic_xchg(sync_ptr + 1 + n_groups + grp, 0, sem="relaxed")


def launch_prop(call, budget: int, out, ws, counts, *, seed: int, offset, offset_ptr) -> None:
    """Run prop for a validated :class:`santa.kernels.decode._Call`: the two passes (default) or one
    fused launch (``PROP_TUNING["fused"] = True``; same results, bitwise at equal warp counts;
    measured slower on the H200, see benchmarks/KERNEL_NOTES.md run 3)."""
    if call.fused:
        launch_prop_fused(call, budget, out, ws, counts, seed=seed, offset=offset, offset_ptr=offset_ptr)
        return
    launch_prop_scores(call, ws)
    launch_prop_gather(call, budget, out, ws, counts, seed=seed, offset=offset, offset_ptr=offset_ptr)


def launch_prop_fused(call, budget: int, out, ws, counts, *, seed: int, offset, offset_ptr) -> None:
    """Both passes in one launch (:func:`_prop_fused_kernel`)."""
    c = call
    tiles_max = triton.cdiv(c.n_keys, c.block_n)
    sblock, n_chunks = prop_sample_chunks(budget, tiles_max)
    block_t = min(triton.next_power_of_2(tiles_max), 1024)
    n_groups = c.batch * c.kv_heads
    _prop_fused_kernel[(n_groups * (tiles_max + c.group * n_chunks),)](
        c.q, c.k, c.v, c.block_table, c.seq_lens, ws["stash"], ws["tile_max"], ws["tile_mass"], ws["partial"],
        ws["sem"], ws["sync"], out, counts, offset_ptr,
        seed, offset, budget, c.n_keys, c.kv_heads, tiles_max, n_groups,
        c.q.stride(0), c.q.stride(1), c.stride_bt, *c.k_strides, *c.v_strides,
        ws["stash"].stride(0), ws["tile_max"].stride(0), out.stride(0), out.stride(1),
        counts.stride(1) if c.return_counts else 0, c.qk_scale,
        G=c.group, D=c.dim, BLOCK_G=c.block_g, BLOCK_D=c.block_d, BLOCK_N=c.block_n, BLOCK_T=block_t,
        SBLOCK=sblock, N_CHUNKS=n_chunks, CHUNK_BLOCK=min(32, triton.next_power_of_2(n_chunks)),
        ONE_CHUNK_T=tiles_max <= block_t, PAGED=c.paged, PAGE_SIZE=c.page_size, HAS_SEQ_LENS=c.has_seq_lens,
        OFFSET_IN_MEMORY=offset_ptr is not c.q, RETURN_COUNTS=c.return_counts, IEEE_DOT=c.ieee_dot,
        num_warps=c.warps_fused, num_stages=1,
    )


def launch_prop_scores(call, ws) -> None:
    """Pass 1: scores, tile stats and stash."""
    c = call
    tiles_max = triton.cdiv(c.n_keys, c.block_n)
    _prop_scores_kernel[(tiles_max, c.batch * c.kv_heads)](
        c.q, c.k, c.block_table, c.seq_lens, ws["stash"], ws["tile_max"], ws["tile_mass"],
        c.n_keys, c.kv_heads, c.q.stride(0), c.q.stride(1), c.stride_bt, *c.k_strides,
        ws["stash"].stride(0), ws["tile_max"].stride(0), c.qk_scale,
        G=c.group, D=c.dim, BLOCK_G=c.block_g, BLOCK_N=c.block_n, BLOCK_D=c.block_d,
        PAGED=c.paged, PAGE_SIZE=c.page_size, HAS_SEQ_LENS=c.has_seq_lens, IEEE_DOT=c.ieee_dot,
        PDL_TRIGGER=c.pdl and c.pdl_trigger, num_warps=c.warps_pass1, num_stages=c.stages_pass1,
    )


def launch_prop_gather(call, budget: int, out, ws, counts, *, seed: int, offset, offset_ptr) -> None:
    """Pass 2: place the S samples of every head, gather their V rows, reduce."""
    c = call
    tiles_max = triton.cdiv(c.n_keys, c.block_n)
    sblock, n_chunks = prop_sample_chunks(budget, tiles_max)
    block_t = min(triton.next_power_of_2(tiles_max), 1024)
    _prop_gather_kernel[(n_chunks, c.batch * c.heads)](
        c.v, c.block_table, c.seq_lens, ws["stash"], ws["tile_max"], ws["tile_mass"], ws["partial"], ws["sem"],
        out, counts, offset_ptr,
        seed, offset, budget, c.n_keys, c.heads, tiles_max,
        c.stride_bt, *c.v_strides, ws["stash"].stride(0), ws["tile_max"].stride(0),
        out.stride(0), out.stride(1), counts.stride(1) if c.return_counts else 0,
        G=c.group, D=c.dim, BLOCK_D=c.block_d, BLOCK_N=c.block_n, BLOCK_T=block_t,
        SBLOCK=sblock, N_CHUNKS=n_chunks, CHUNK_BLOCK=min(32, triton.next_power_of_2(n_chunks)),
        ONE_CHUNK_T=tiles_max <= block_t, PAGED=c.paged, PAGE_SIZE=c.page_size, HAS_SEQ_LENS=c.has_seq_lens,
        OFFSET_IN_MEMORY=offset_ptr is not c.q, RETURN_COUNTS=c.return_counts, USE_PDL=c.pdl,
        num_warps=c.warps_pass2, num_stages=1, launch_pdl=c.pdl,
    )
