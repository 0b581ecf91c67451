"""S²ANTA-prop in Triton, exact global systematic variant ("prop-global-sys"): two launches.

Pass 1 (:func:`_prop_scores_kernel`), one program per (tile, sequence·KV head): the scores of the
G grouped heads from one read of the K tile, tile max ``m_t`` and mass ``ℓ_t = Σ exp(s − m_t)``,
and the stash ``u = exp(s − m_t)``. Tiles are cut from each sequence's first key (``starts``: its run of keys is
``[first, seq_len)``), so a left-padded run has the tile masses, float32 CDF and samples it has unpadded.

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
from triton.language.extra.cuda import gdc_wait

from santa.kernels._common import (
    LOG2E,
    cache_scale,
    call_uniforms,
    checked_first_key,
    checked_seq_len,
    gate_open,
    load_cache_rows,
    load_offset,
    row_offsets,
    tile_scores,
    tile_softmax_stats,
)
from santa.kernels._launch import Launcher
from santa.kernels.layout import (
    prop_discard_mode,
    prop_pass1_tiles,
    prop_sample_chunks,
    prop_tile_search,
    workspace_strides,
)


@triton.jit
def _prop_tile(
    q_ptr, k_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, t, b, kvh, seq_len, first_key, n_pages, n_kv_heads,
    stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, stride_stash, stride_stats, qk_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, IEEE_DOT: tl.constexpr, K_EVICTION: tl.constexpr, K_F16: tl.constexpr,
):
    """Pass-1 work of one (tile, sequence, KV head) that the sequence's run reaches (``t·BLOCK_N < seq_len −
    first_key``: tiles past it are never read by pass 2): stash, tile max and mass of the G grouped heads. Tiles are
    cut from the run's first key (tile t holds keys ``first_key + t·BLOCK_N + i``, stash column ``t·BLOCK_N + i``), so
    a left-padded run has the tiles, tile masses and float32 CDF it has unpadded: its samples do not follow the pad."""
    start = t * BLOCK_N  # the run's column of the tile's first key
    s = tile_scores(
        q_ptr, k_ptr, bt_ptr, b, kvh, first_key + start, seq_len, first_key, n_pages,
        stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, qk_scale,
        G, D, BLOCK_G, BLOCK_N, BLOCK_D, PAGED, PAGE_SIZE, IEEE_DOT, K_EVICTION, K_F16,
    )  # [BLOCK_G, BLOCK_N], log2 units
    m, u, mass = tile_softmax_stats(s)  # u = exp(s − m_t), 0 off the sequence; ℓ_t NaN on a poisoned row
    offs_g = tl.arange(0, BLOCK_G)
    rows = (b * n_kv_heads + kvh) * G + offs_g  # b·H + h
    mask_g = offs_g < G
    offs_n = start + tl.arange(0, BLOCK_N)
    tl.store(stash_ptr + rows.to(tl.int64)[:, None] * stride_stash + offs_n[None, :], u, mask=mask_g[:, None])
    tl.store(tile_max_ptr + rows * stride_stats + t, m, mask=mask_g)
    tl.store(tile_mass_ptr + rows * stride_stats + t, mass, mask=mask_g)


@triton.jit
def _prop_scores_kernel(
    q_ptr, k_ptr, bt_ptr, seq_lens_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, k_scale_ptr, starts_ptr, enabled_ptr,
    n_keys, n_pages, n_kv_heads, stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh,
    stride_stash, stride_stats, qk_scale, k_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_SEQ_LENS: tl.constexpr, IEEE_DOT: tl.constexpr,
    K_EVICTION: tl.constexpr, K_SCALE_PER_HEAD: tl.constexpr, HAS_STARTS: tl.constexpr, K_F16: tl.constexpr,
    LOOP: tl.constexpr, GATED: tl.constexpr,
):
    """Pass 1 over tile ``program_id(0)`` of one (sequence, KV head); LOOP (a grid cut at
    :data:`santa.kernels.layout.PASS1_PROGRAMS`): tiles t, t + grid, … that the sequence reaches, one after the other.
    (Several tiles per program in a *pipelined* ``tl.range`` loop measured slower on every shape: benchmarks/RESULTS.md,
    2026-12-02; the loop here is a plain ``while``, for plans whose capacity far exceeds their sequences.)"""
    t = tl.program_id(0)
    pid_bk = tl.program_id(1)
    b = pid_bk // n_kv_heads
    kvh = pid_bk % n_kv_heads
    seq_len, _ = checked_seq_len(seq_lens_ptr, b, n_keys, HAS_SEQ_LENS)
    if GATED:  # a closed gate: no tile, nothing written
        seq_len = tl.where(gate_open(enabled_ptr, GATED), seq_len, 0)
    first_key, _ = checked_first_key(starts_ptr, b, seq_len, HAS_STARTS)
    run_keys = seq_len - first_key  # the run [first_key, seq_len): its tiles are cut from its first key
    score_scale = qk_scale * cache_scale(k_scale, k_scale_ptr, kvh, K_SCALE_PER_HEAD)  # q·(s_k k) = s_k (q·k)
    if LOOP:
        tile = t
        while tile * BLOCK_N < run_keys:
            _prop_tile(
                q_ptr, k_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, tile, b, kvh, seq_len, first_key, n_pages,
                n_kv_heads, stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, stride_stash, stride_stats,
                score_scale, G, D, BLOCK_G, BLOCK_N, BLOCK_D, PAGED, PAGE_SIZE, IEEE_DOT, K_EVICTION, K_F16,
            )
            tile += tl.num_programs(0)
    elif t * BLOCK_N < run_keys:
        _prop_tile(
            q_ptr, k_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, t, b, kvh, seq_len, first_key, n_pages,
            n_kv_heads, stride_qb, stride_qh, stride_bt, stride_kb, stride_kn, stride_kh, stride_stash, stride_stats,
            score_scale, G, D, BLOCK_G, BLOCK_N, BLOCK_D, PAGED, PAGE_SIZE, IEEE_DOT, K_EVICTION, K_F16,
        )


@triton.jit
def _bisect_tiles(prefix_ptr, prefix_row, n_tiles, u, m_f, budget_f, ok, LOG_T: tl.constexpr):
    """``tile = #{t < n_tiles : P_t − m ≤ U}`` by binary search over the stored prefix ``C_t`` (``P_t = S·C_t``,
    formed from the loaded C as the scan forms it, so the same float32 values; C is budget-free, so a pilot
    and its row's output draw can share it), and ``P_{tile−1}, P_tile``: the same tile and bounds as
    comparing with every tile, in O(log T) loads per sample."""
    pos = tl.zeros(m_f.shape, dtype=tl.int32)
    for level in tl.static_range(LOG_T):  # pos + 2^k for k = LOG_T−1 … 0: the largest pos whose predicate holds
        cand = pos + (1 << (LOG_T - 1 - level))
        inside = ok & (cand <= n_tiles)
        p = tl.load(prefix_ptr + prefix_row + cand - 1, mask=inside, other=0.0, cache_modifier=".cg") * budget_f
        pos = tl.where(inside & ((p - m_f) <= u), cand, pos)
    lo = tl.load(prefix_ptr + prefix_row + pos - 1, mask=ok & (pos > 0), other=0.0, cache_modifier=".cg") * budget_f
    hi = tl.load(prefix_ptr + prefix_row + pos, mask=ok & (pos < n_tiles), other=float("inf"), cache_modifier=".cg") * budget_f
    return pos, lo, hi


@triton.jit
def _tile_prefix_search(
    tile_max_ptr, tile_mass_ptr, prefix_ptr, stats_row, n_tiles, tiles_max, u, m_f, budget_f, valid_s,
    SBLOCK: tl.constexpr, BLOCK_T: tl.constexpr, ONE_CHUNK_T: tl.constexpr, BISECT: tl.constexpr,
    LOG_T: tl.constexpr, CM: tl.constexpr,
):
    """Tile of each sample, the tile's prefix bounds ``P_{t−1}, P_t`` (``P_t = S·C_t``), Z, and whether
    some tile mass is NaN (a poisoned row: its output is NaN).

    Sample m lies in tile t iff ``P_{t−1} ≤ m + U < P_t``; comparisons are made as
    ``P − m ≤ U`` so that no rounding of ``m + U`` can push a point past ``P_{last} = S``.
    BISECT: store C (each program of the row writes the same values, whatever its budget) and
    binary-search it, instead of comparing every sample with every tile (O(SBLOCK · T) per program).
    """
    offs_t = tl.arange(0, BLOCK_T)
    if ONE_CHUNK_T:
        mask_t = offs_t < n_tiles
        tmax = tl.load(tile_max_ptr + stats_row + offs_t, mask=mask_t, other=-float("inf"), cache_modifier=CM)
        tmass = tl.load(tile_mass_ptr + stats_row + offs_t, mask=mask_t, other=0.0, cache_modifier=CM)
        m_star = tl.max(tmax, axis=0)
        m_star = tl.where(m_star == -float("inf"), 0.0, m_star)
        w = tl.where(mask_t, tl.exp2(tmax - m_star) * tmass, 0.0)  # W_t = exp(m_t − m*) ℓ_t
        poisoned = tl.max((tmass != tmass).to(tl.int32), axis=0) > 0
        cs = tl.cumsum(w, axis=0)
        z = tl.max(cs, axis=0)  # the last prefix, so that P_last = (Z/Z)·S = S exactly
        zs = tl.where(z > 0, z, 1.0)
        c = cs / zs  # C_t
        p = c * budget_f  # P_t = S·C_t
        if BISECT:
            tl.store(prefix_ptr + stats_row + offs_t, c, mask=mask_t)
        else:
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
        n_poisoned = 0
        t0 = 0
        while t0 < tiles_max:  # a host bound (n_tiles masks); a while loop keeps the interpreter happy
            mask_t = t0 + offs_t < n_tiles
            tmax = tl.load(tile_max_ptr + stats_row + t0 + offs_t, mask=mask_t, other=-float("inf"), cache_modifier=CM)
            tmass = tl.load(tile_mass_ptr + stats_row + t0 + offs_t, mask=mask_t, other=0.0, cache_modifier=CM)
            w = tl.where(mask_t, tl.exp2(tmax - m_star) * tmass, 0.0)
            n_poisoned += tl.sum((tmass != tmass).to(tl.int32), axis=0)
            z = z + tl.max(tl.cumsum(w, axis=0), axis=0)  # carry + last prefix, as in the search below
            t0 += BLOCK_T
        poisoned = n_poisoned > 0
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
            c = tl.where(mask_t, (carry + cs) / zs, 1.0)  # C_t
            p = c * budget_f
            if BISECT:
                tl.store(prefix_ptr + stats_row + t0 + offs_t, c, mask=mask_t)
            else:
                le = (p[None, :] - m_f[:, None]) <= u[:, None]
                tile += tl.sum(le.to(tl.int32), axis=1)
                lo = tl.maximum(lo, tl.max(tl.where(le, p[None, :], 0.0), axis=1))
                hi = tl.minimum(hi, tl.min(tl.where(le, float("inf"), p[None, :]), axis=1))
            carry = carry + tl.max(cs, axis=0)
            t0 += BLOCK_T
    if BISECT:
        tl.debug_barrier()  # this program's stores of P are visible to all its threads
        searched = valid_s & ((tl.zeros([SBLOCK], dtype=tl.float32) + z) > 0)  # (a vector: the interpreter's & wants one)
        tile, lo, hi = _bisect_tiles(prefix_ptr, stats_row, n_tiles, u, m_f, budget_f, searched, LOG_T)
    return tile, lo, hi, z, poisoned


@triton.jit
def _discard_stash_lines(stash_ptr, row, stride_stash, line_lo, line_hi, LINES: tl.constexpr):
    """Drop lines ``[line_lo, line_hi)`` of one row's stash from L2 without writing them back (PTX
    ``discard.global.L2``, sm_80+): dead once their samples are placed, a dirty stash left in L2 is
    written to DRAM while later kernels (the rest of a decode step) evict it. The stash starts on a
    256-byte boundary and its rows hold ``stride_stash`` fp32, a multiple of 32 (``workspace_regions``
    pads them), so every row starts on a 128-byte line and a line is 32 fp32 of one row."""
    base = stash_ptr + row.to(tl.int64) * stride_stash
    for l0 in range(line_lo, line_hi, LINES):
        offs = l0 + tl.arange(0, LINES)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p discard.global.L2 [$1], 128; mov.u32 $0, 0; }",
            "=r,l,r", [base + offs.to(tl.int64) * 32, (offs < line_hi).to(tl.int32)],
            dtype=tl.int32, is_pure=False, pack=1,
        )


@triton.jit
def _place_samples(
    v_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, prefix_ptr, row, b, kvh, seq_len, first_key, nan_row, n_pages,
    u, m_f, budget_f, valid_s, tiles_max, stride_bt, stride_vb, stride_vn, stride_vh, stride_stash, stride_stats,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, SBLOCK: tl.constexpr,
    ONE_CHUNK_T: tl.constexpr, BISECT: tl.constexpr, LOG_T: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    CM: tl.constexpr,
):
    """Samples ``m_f`` (where ``valid_s``) of a ``budget_f``-sample systematic draw with offset u on one
    (sequence, head) row: their keys, which are real draws (``ok``), their V rows ``[SBLOCK, BLOCK_D]``
    (unscaled fp32, 0 where not ok), tile (for the stash discard), and whether a tile mass is NaN. The row's run is
    ``[first_key, seq_len)``; its tiles and stash columns count from ``first_key`` (:func:`_prop_tile`)."""
    run_keys = seq_len - first_key
    n_tiles = tl.cdiv(run_keys, BLOCK_N)
    stats_row = row.to(tl.int64) * stride_stats
    tile, lo, hi, z, poisoned = _tile_prefix_search(
        tile_max_ptr, tile_mass_ptr, prefix_ptr, stats_row, n_tiles, tiles_max, u, m_f, budget_f, valid_s,
        SBLOCK, BLOCK_T, ONE_CHUNK_T, BISECT, LOG_T, CM,
    )
    ok = valid_s & ((tl.zeros([SBLOCK], dtype=tl.float32) + z) > 0) & ~(nan_row | poisoned)
    tile = tl.minimum(tile, tl.maximum(n_tiles - 1, 0))

    # inside the tile: key = min{ j : F_tile(j) > x } with x the point's position in [P_{t−1}, P_t)
    offs_n = tl.arange(0, BLOCK_N)
    pos = tile[:, None] * BLOCK_N + offs_n[None, :]  # [SBLOCK, BLOCK_N]
    stash = tl.load(
        stash_ptr + row.to(tl.int64) * stride_stash + pos,
        mask=ok[:, None] & (pos < run_keys), other=0.0, cache_modifier=CM,
    )
    cu = tl.cumsum(stash, axis=1)
    tile_total = tl.max(cu, axis=1)
    frac = cu / tl.where(tile_total > 0, tile_total, 1.0)[:, None]
    width = hi - lo
    x = (u - (lo - m_f)) / tl.where(width > 0, width, 1.0)
    last_nonzero = tl.max(tl.where(stash > 0, offs_n[None, :], 0), axis=1)
    j = tl.sum((frac <= x[:, None]).to(tl.int32), axis=1)
    key = first_key + tile * BLOCK_N + tl.minimum(j, last_nonzero)  # the cache's key index

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    v_rows, v_ok = row_offsets(b, key, ok, kvh, bt_ptr, stride_bt, n_pages, stride_vb, stride_vn, stride_vh, PAGED, PAGE_SIZE)
    vals = load_cache_rows(v_ptr, v_rows, v_ok, offs_d, mask_d, tl.float32, "")
    return key, ok, vals, tile, poisoned


@triton.jit
def _pilot_budget(vals, v_scale, cap, inv_target2, PILOT: tl.constexpr):
    """A row's budget from its pilot's V rows ``vals [PBLOCK, BLOCK_D]`` (0 past the PILOT draws): the
    sample variance ``T̂ = S₀/(S₀−1) · ((1/S₀) Σ‖y‖² − ‖ȳ‖²)``, ``N̂ = ‖ȳ‖² − T̂/S₀`` and
    ``S_r = min(cap, max(S₀, ⌈T̂ · (1/ε²) / N̂⌉))``, cap where N̂ ≤ 0 or an estimate is not finite
    (:mod:`santa.error_target`; :func:`santa.kernels.reference.pilot_budget` is its float32 spec)."""
    y = vals * v_scale
    mean = tl.sum(y, axis=0) / PILOT  # ȳ [BLOCK_D]
    square_mean = tl.sum(tl.sum(y * y, axis=1), axis=0) / PILOT  # (1/S₀) Σ_m ‖y_m‖²
    mean_norm2 = tl.sum(mean * mean, axis=0)
    trace = tl.maximum((square_mean - mean_norm2) * (PILOT / (PILOT - 1)), 0.0)
    norm2 = mean_norm2 - trace / PILOT
    usable = (norm2 > 0) & (norm2 < float("inf")) & (trace < float("inf"))  # NaN compares false
    wanted = tl.ceil(trace * inv_target2 / tl.where(usable, norm2, 1.0))
    wanted = tl.minimum(tl.maximum(wanted, PILOT * 1.0), cap.to(tl.float32))  # never fewer draws than the pilot's
    return tl.where(usable, wanted.to(tl.int32), cap)


@triton.jit
def _prop_chunk(
    v_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, prefix_ptr, partial_ptr, sem_ptr, out_ptr, counts_ptr,
    budgets_ptr, pid_s, row, b, h, kvh, seq_len, first_key, bad_len, n_pages, u, u_pilot, inv_target2, v_scale, budget,
    tiles_max,
    stride_bt, stride_vb, stride_vn, stride_vh, stride_stash, stride_stats, stride_ob, stride_oh, stride_counts,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    SBLOCK: tl.constexpr, N_CHUNKS: tl.constexpr, CHUNK_BLOCK: tl.constexpr, ONE_CHUNK_T: tl.constexpr,
    BISECT: tl.constexpr, LOG_T: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, RETURN_COUNTS: tl.constexpr, CM: tl.constexpr,
    DISCARD: tl.constexpr, PILOT: tl.constexpr, PBLOCK: tl.constexpr,
):
    """Pass-2 work of one chunk of samples of one (sequence, head) row: place them, gather V, reduce.
    DISCARD (see :func:`santa.kernels.layout.prop_discard_mode`): 0 keeps the stash in L2, 1 has the
    row's last chunk drop the whole row, 2 has every chunk drop the part that no other chunk reads.
    PILOT > 0 (an error target): the row's budget is not ``budget`` (then the cap) but the one its pilot
    asks for (:func:`_pilot_budget`): a systematic draw of PILOT samples on the offset ``u_pilot``, which
    every chunk of the row places and reads itself (the same rows, the same budget), then the chunk's
    samples of the row's own budget. The grid is the cap's: a chunk past the row's budget skips its search. Chunk 0
    stores the row's budget at ``budgets_ptr[row]``."""
    nan_row = bad_len  # NaN/+inf scores (a tile mass is NaN), a bad page id or a bad seq_len: the output is NaN
    if PILOT > 0:
        offs_p = tl.arange(0, PBLOCK)
        _, _, pilot_vals, _, _ = _place_samples(
            v_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, prefix_ptr, row, b, kvh, seq_len, first_key, nan_row, n_pages,
            u_pilot, offs_p.to(tl.float32), tl.full([], PILOT, tl.float32), offs_p < PILOT, tiles_max, stride_bt, stride_vb,
            stride_vn, stride_vh, stride_stash, stride_stats, D, BLOCK_D, BLOCK_N, BLOCK_T, PBLOCK, ONE_CHUNK_T, BISECT,
            LOG_T, PAGED, PAGE_SIZE, CM,
        )
        budget = _pilot_budget(pilot_vals, v_scale, budget, inv_target2, PILOT)
        if pid_s == 0:  # the row's budget S_r, for the caller's count of value rows read (DecodePlan.run's reads)
            tl.store(budgets_ptr + row, budget)
    if PILOT == 0:  # a fixed budget: every chunk of the grid holds samples
        offs_s = pid_s * SBLOCK + tl.arange(0, SBLOCK)
        m_f = offs_s.to(tl.float32)
        budget_f = budget.to(tl.float32)
        key, ok, vals, tile, poisoned = _place_samples(
            v_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, prefix_ptr, row, b, kvh, seq_len, first_key, nan_row, n_pages, u, m_f,
            budget_f, offs_s < budget, tiles_max, stride_bt, stride_vb, stride_vn, stride_vh, stride_stash, stride_stats,
            D, BLOCK_D, BLOCK_N, BLOCK_T, SBLOCK, ONE_CHUNK_T, BISECT, LOG_T, PAGED, PAGE_SIZE, CM,
        )
        nan_row = nan_row | poisoned
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < D
        acc = tl.sum(vals, axis=0) * v_scale  # Σ over this chunk's samples of v_{J_m} (non-finite if a sampled row is)
        if RETURN_COUNTS:
            tl.atomic_add(counts_ptr + row.to(tl.int64) * stride_counts + key, 1, mask=ok)
    else:
        # an error target: the grid is the cap's, and a chunk wholly past its row's budget places and reads nothing,
        # so it skips its search (the program's branch: every thread takes it alike); DISCARD ≤ 1 needs no tile
        budget_f = budget.to(tl.float32)
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < D
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        if pid_s * SBLOCK < budget:
            offs_s = pid_s * SBLOCK + tl.arange(0, SBLOCK)
            key, ok, vals, _tile, poisoned = _place_samples(
                v_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, prefix_ptr, row, b, kvh, seq_len, first_key, nan_row, n_pages, u,
                offs_s.to(tl.float32), budget_f, offs_s < budget, tiles_max, stride_bt, stride_vb, stride_vn, stride_vh,
                stride_stash, stride_stats, D, BLOCK_D, BLOCK_N, BLOCK_T, SBLOCK, ONE_CHUNK_T, BISECT, LOG_T, PAGED, PAGE_SIZE,
                CM,
            )
            nan_row = nan_row | poisoned
            acc = tl.sum(vals, axis=0) * v_scale
            if RETURN_COUNTS:
                tl.atomic_add(counts_ptr + row.to(tl.int64) * stride_counts + key, 1, mask=ok)

    out_offs = b.to(tl.int64) * stride_ob + h * stride_oh + offs_d
    if DISCARD == 2:
        # The tile of sample m never decreases with m, so this chunk's samples lie in tiles [first, last]
        # and every other chunk's in tiles ≤ first or ≥ last: the tiles strictly between are read by this
        # chunk alone, the ones before the first chunk's and after the last chunk's by nobody. Each chunk
        # drops those once its own loads are done; the few tiles two chunks may share stay in L2.
        first = tl.min(tl.where(ok, tile, 2147483647), axis=0)
        last = tl.max(tl.where(ok, tile, -1), axis=0)
        tile_lo = tl.where(pid_s == 0, 0, first + 1)
        line_lo = tl.cdiv(tile_lo * BLOCK_N, 32)  # whole lines only
        line_hi = tl.where(pid_s == N_CHUNKS - 1, stride_stash // 32, (last * BLOCK_N) // 32)
        tl.debug_barrier()  # every thread's stash loads are done
        if last >= 0:
            _discard_stash_lines(stash_ptr, row, stride_stash, line_lo, line_hi, 512)
    if N_CHUNKS == 1:
        result = tl.where(nan_row, float("nan"), acc / budget_f)
        tl.store(out_ptr + out_offs, result.to(out_ptr.dtype.element_ty), mask=mask_d)
        if DISCARD == 1:
            tl.debug_barrier()  # every thread's stash loads are done
            _discard_stash_lines(stash_ptr, row, stride_stash, 0, stride_stash // 32, 1024)
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
            result = tl.where(nan_row, float("nan"), total / budget_f)
            tl.store(out_ptr + out_offs, result.to(out_ptr.dtype.element_ty), mask=mask_d)
            tl.atomic_xchg(sem_ptr + row, 0)
            if DISCARD == 1:  # every chunk of the row has read its stash (they arrived before this one)
                _discard_stash_lines(stash_ptr, row, stride_stash, 0, stride_stash // 32, 1024)


@triton.jit(do_not_specialize=["seed", "offset", "head_offset", "budget", "inv_target2"])
def _prop_gather_kernel(
    v_ptr, bt_ptr, seq_lens_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, prefix_ptr, partial_ptr, sem_ptr,
    out_ptr, counts_ptr, offset_ptr, v_scale_ptr, seeds_ptr, positions_ptr, starts_ptr, budgets_ptr, enabled_ptr,
    seed, offset, head_offset, budget, n_keys, n_pages, n_heads, tiles_max, v_scale, inv_target2,
    stride_bt, stride_vb, stride_vn, stride_vh, stride_stash, stride_stats, stride_ob, stride_oh, stride_counts,
    G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    SBLOCK: tl.constexpr, N_CHUNKS: tl.constexpr, CHUNK_BLOCK: tl.constexpr, ONE_CHUNK_T: tl.constexpr,
    BISECT: tl.constexpr, LOG_T: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_SEQ_LENS: tl.constexpr, OFFSET_IN_MEMORY: tl.constexpr,
    RETURN_COUNTS: tl.constexpr, USE_PDL: tl.constexpr, DISCARD: tl.constexpr, V_SCALE_PER_HEAD: tl.constexpr,
    SEED_PER_SEQUENCE: tl.constexpr, POSITIONAL: tl.constexpr, HAS_STARTS: tl.constexpr,
    PILOT: tl.constexpr, PBLOCK: tl.constexpr, GATED: tl.constexpr,
):
    pid_s = tl.program_id(0)
    row = tl.program_id(1)  # b·H + h
    b = row // n_heads
    h = row % n_heads
    kvh = h // G
    seq_len, bad_len = checked_seq_len(seq_lens_ptr, b, n_keys, HAS_SEQ_LENS)
    first_key, bad_start = checked_first_key(starts_ptr, b, seq_len, HAS_STARTS)
    bad_len = bad_len | bad_start  # the run's keys were masked in pass 1; a bad start makes the sequence NaN
    off_lo, off_hi = load_offset(offset, offset_ptr, OFFSET_IN_MEMORY)
    u = call_uniforms(seed, seeds_ptr, off_lo, off_hi, positions_ptr, b, n_heads, head_offset, h, 0, [SBLOCK],
                      SEED_PER_SEQUENCE, POSITIONAL)  # one U per (sequence, head); the counter's head: head_offset + h
    u_pilot = u
    if PILOT > 0:  # an error target: the pilot's own offset, stream 1 (prop's draw is stream 0)
        u_pilot = call_uniforms(seed, seeds_ptr, off_lo, off_hi, positions_ptr, b, n_heads, head_offset, h, 1, [PBLOCK],
                                SEED_PER_SEQUENCE, POSITIONAL)
    if USE_PDL:
        gdc_wait()  # launched early (programmatic dependent launch): wait for pass 1's writes here
    if gate_open(enabled_ptr, GATED):  # a closed gate: nothing written, counted or left in the semaphores
        _prop_chunk(
            v_ptr, bt_ptr, stash_ptr, tile_max_ptr, tile_mass_ptr, prefix_ptr, partial_ptr, sem_ptr, out_ptr, counts_ptr,
            budgets_ptr, pid_s, row, b, h, kvh, seq_len, first_key, bad_len, n_pages, u, u_pilot, inv_target2,
            cache_scale(v_scale, v_scale_ptr, kvh, V_SCALE_PER_HEAD), budget, tiles_max, stride_bt, stride_vb, stride_vn,
            stride_vh, stride_stash, stride_stats, stride_ob, stride_oh, stride_counts,
            D, BLOCK_D, BLOCK_N, BLOCK_T, SBLOCK, N_CHUNKS, CHUNK_BLOCK, ONE_CHUNK_T, BISECT, LOG_T,
            PAGED, PAGE_SIZE, RETURN_COUNTS, "", DISCARD, PILOT, PBLOCK,
        )


def prop_launchers(plan, *, has_seq_lens: bool, offset_in_memory: bool, return_counts: bool, k_scale_per_head: bool = False,
                   v_scale_per_head: bool = False, seed_per_sequence: bool = False, positional: bool = False,
                   has_starts: bool = False, gated: bool = False) -> list:
    """prop's two launches for a :class:`santa.kernels.plan.DecodePlan`: ``[(name, Launcher)]``; each
    call's other arguments come by kernel name from ``DecodePlan._arguments``."""
    shape, tuning = plan.shape, plan.tuning
    sblock, n_chunks = prop_sample_chunks(plan.budget, plan.tiles, shape.batch * shape.heads, tuning)
    block_t = min(triton.next_power_of_2(plan.tiles), 1024)
    common = dict(
        G=plan.group, D=shape.head_dim, BLOCK_D=plan.block_d, BLOCK_N=plan.block_n,
        PAGED=shape.page_size is not None, PAGE_SIZE=shape.page_size or 1, HAS_SEQ_LENS=has_seq_lens, GATED=gated,
    )
    n_keys, qk_scale = shape.n_keys, plan.scale * LOG2E
    stride_stash, stride_stats = workspace_strides(plan.workspace_key)  # fixed by the workspace's key
    fixed1 = dict(n_keys=n_keys, n_kv_heads=shape.kv_heads, stride_stash=stride_stash, stride_stats=stride_stats, qk_scale=qk_scale)
    pilot = plan.pilot if plan.error_target is not None else 0  # 0: a fixed budget, no pilot
    fixed2 = dict(budget=plan.budget, n_keys=n_keys, n_heads=shape.heads, tiles_max=plan.tiles,
                  stride_stash=stride_stash, stride_stats=stride_stats,
                  inv_target2=0.0 if plan.error_target is None else 1.0 / plan.error_target**2)
    pass1_tiles = prop_pass1_tiles(plan.tiles, shape.batch * shape.kv_heads, tuning)
    pass1 = Launcher(_prop_scores_kernel, grid=(pass1_tiles, shape.batch * shape.kv_heads), fixed=fixed1, meta=dict(
        common, BLOCK_G=plan.block_g, IEEE_DOT=plan.ieee_dot, K_EVICTION="evict_first" if plan.k_evict_first else "",
        K_SCALE_PER_HEAD=k_scale_per_head, HAS_STARTS=has_starts, K_F16=plan.k_f16, LOOP=pass1_tiles < plan.tiles,
        num_warps=tuning.warps_pass1 or (8 if shape.head_dim > 128 else 4), num_stages=tuning.stages_pass1 or 1,
    ))
    pass2 = Launcher(_prop_gather_kernel, grid=(n_chunks, shape.batch * shape.heads), fixed=fixed2, meta=dict(
        common, BLOCK_T=block_t, SBLOCK=sblock, N_CHUNKS=n_chunks, CHUNK_BLOCK=min(32, triton.next_power_of_2(n_chunks)),
        ONE_CHUNK_T=plan.tiles <= block_t, BISECT=prop_tile_search(plan.tiles, tuning) == "bisect",
        LOG_T=max(1, plan.tiles.bit_length()), OFFSET_IN_MEMORY=offset_in_memory, RETURN_COUNTS=return_counts, USE_PDL=plan.pdl,
        # an error target's pilot reads the row's stash in every chunk: only the row's last chunk may drop it (mode 1)
        DISCARD=min(prop_discard_mode(n_chunks), 1 if pilot else 2) if plan.discard_stash else 0,
        V_SCALE_PER_HEAD=v_scale_per_head, SEED_PER_SEQUENCE=seed_per_sequence, POSITIONAL=positional, HAS_STARTS=has_starts,
        PILOT=pilot, PBLOCK=triton.next_power_of_2(max(pilot, 2)),
        # 8 warps up to 256 tiles (32k: 31.2 vs 34.5 µs), 4 beyond (128k: 95.1 with 8 vs 86.7 with 4; H200, 2026-11-29)
        num_warps=tuning.warps_pass2 or (8 if plan.tiles <= 256 else 4), num_stages=1, launch_pdl=plan.pdl,
    ))

    return [("pass1", pass1), ("pass2", pass2)]
