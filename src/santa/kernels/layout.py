"""The kernels' shared layout: tile sizes, prop's persistent grid, the workspace's regions and key.

Both the Triton kernels (:mod:`santa.kernels.prop`, :mod:`santa.kernels.flash`) and the plan
(:mod:`santa.kernels.plan`) import this module; it imports neither (no import cycle, no triton).

prop runs as one cooperative launch of ``programs`` CTAs (all resident at once). A *group* is one
(sequence, KV head); its ``T`` key tiles are cut into ``slices`` runs of ``tiles_per_slice``
tiles. Work item ``i = group · slices + slice`` runs on program ``i mod programs`` in round
``i div programs``; ``programs`` is a multiple of ``slices``, so a group's slices share a round
and can wait for one another at the group's barrier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ALIGN = 256  # bytes; every workspace region starts on this boundary
ELEMENT_SIZE = {torch.float32: 4, torch.int32: 4}
CPU_PROGRAMS = 8  # prop's grid under Triton's interpreter (the CPU has no SMs to fill)


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Tuning:
    """prop's launch parameters (they change speed, never which key a comb point lands on beyond the
    documented float32 rounding); ``None`` picks the measured default."""

    block_n: int | None = None  # keys per tile
    warps: int | None = None  # warps per CTA
    stages: int | None = None  # software-pipelining depth of the K tile loop
    ctas_per_sm: int | None = None  # resident CTAs per SM: the persistent grid is SMs × this
    tiles_per_slice: int | None = None  # force the slice length (tiles) instead of the grid's choice
    samples_per_block: int | None = None  # comb points placed and gathered together
    k_evict_first: bool | None = None  # K loads as L2 evict-first (so the CTAs' slots stay in L2)


def prop_tile(dim: int, tuning: Tuning = Tuning()) -> int:
    """Keys per prop tile (does not change prop's samples, only rounding)."""
    return tuning.block_n or (128 if dim <= 128 else 64)


def flash_tile(dim: int) -> int:
    """Keys per flash tile: the sampling unit, so part of flash's semantics."""
    return 128 if dim <= 128 else 64


@dataclass(frozen=True)
class PropGrid:
    """prop's persistent grid for one shape: ``programs`` CTAs, ``slices`` per group of
    ``tiles_per_slice`` tiles, ``rounds`` of work per CTA."""

    programs: int
    slices: int
    tiles_per_slice: int
    rounds: int


def prop_grid(*, tiles: int, groups: int, resident: int, slot_tiles: int, tiles_per_slice: int | None = None) -> PropGrid:
    """Slice length and grid for ``groups`` groups of ``tiles`` tiles on ``resident`` co-resident CTAs.

    ``slot_tiles``: the most tiles one CTA's slot may hold (its scores stay in L2 while it samples).
    Among slice lengths within that cap, pick the one with the least modelled time: rounds × (tiles
    per slice + a fixed 2-tile cost per round for the barrier and the gather), stretched by
    ``resident / programs`` where the grid runs part-empty.
    """
    best = None
    candidates = [tiles_per_slice] if tiles_per_slice else range(1, min(tiles, max(1, slot_tiles)) + 1)
    for tps in candidates:
        slices = cdiv(tiles, tps)
        tps = cdiv(tiles, slices)
        if slices > resident:
            continue
        per_round = min(groups, resident // slices)  # groups in flight
        rounds = cdiv(groups, per_round)
        per_round = cdiv(groups, rounds)  # the same rounds, balanced
        programs = per_round * slices
        cost = rounds * (tps + 2) * resident / programs
        if best is None or cost < best[0] - 1e-9:
            best = (cost, PropGrid(programs=programs, slices=slices, tiles_per_slice=tps, rounds=rounds))
    if best is None:  # one slice per CTA is too long for a slot: a slice per CTA, cut as evenly as it goes
        tps = cdiv(tiles, resident)
        slices = cdiv(tiles, tps)
        return PropGrid(programs=slices, slices=slices, tiles_per_slice=tps, rounds=groups)
    return best[1]


@dataclass(frozen=True)
class WorkspaceKey:
    """What a workspace was made for: a workspace serves calls with exactly this key."""

    kernel: str
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    n_keys: int
    budget: int
    block_n: int
    grid: PropGrid | None  # prop's grid (None for flash)
    device: str

    def describe(self) -> str:
        grid = "" if self.grid is None else f", programs={self.grid.programs}, slices={self.grid.slices}"
        return (f"kernel={self.kernel!r}, B={self.batch}, H={self.heads}, H_kv={self.kv_heads}, d={self.head_dim}, "
                f"n_keys={self.n_keys}, budget={self.budget}, tile={self.block_n}{grid}, device={self.device}")

    @classmethod
    def of(cls, *, kernel: str, batch: int, heads: int, kv_heads: int, head_dim: int, n_keys: int, budget: int,
           device: str, tuning: Tuning = Tuning()) -> WorkspaceKey:
        block_n = prop_tile(head_dim, tuning) if kernel == "prop" else flash_tile(head_dim)
        grid = None
        if kernel == "prop":
            sms, l2_bytes = device_resources(device)
            resident = CPU_PROGRAMS if sms is None else sms * (tuning.ctas_per_sm or 2)
            group = heads // kv_heads
            # the CTAs' slots together take at most half of L2 (16 MB where L2 is unknown)
            slot_tiles = (l2_bytes or 32 << 20) // 2 // (resident * group * block_n * 4)
            grid = prop_grid(tiles=cdiv(n_keys, block_n), groups=batch * kv_heads, resident=resident,
                             slot_tiles=max(1, slot_tiles), tiles_per_slice=tuning.tiles_per_slice)
        return cls(kernel, batch, heads, kv_heads, head_dim, n_keys, budget, block_n, grid, device)


def device_resources(device: str) -> tuple[int | None, int | None]:
    """(SM count, L2 bytes) of a CUDA device, (None, None) for the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None, None
    props = torch.cuda.get_device_properties(device)
    return props.multi_processor_count, props.L2_cache_size


def workspace_regions(key: WorkspaceKey) -> tuple[tuple[str, torch.dtype, tuple[int, ...], int], ...]:
    """The workspace's regions as (name, dtype, shape, byte offset); each starts on a 256-byte boundary."""
    block_d = max(16, next_pow2(key.head_dim))
    tiles = cdiv(key.n_keys, key.block_n)
    rows = key.batch * key.heads
    if key.kernel == "prop":
        grid, group = key.grid, key.heads // key.kv_heads
        groups = key.batch * key.kv_heads
        regions = [
            ("counters", torch.int32, (groups, 2)),  # arrivals, finished slices; zero when made, every call leaves them so
            ("slot", torch.float32, (grid.programs * group, grid.tiles_per_slice * key.block_n)),  # exp(s − m_t) per CTA
            ("slot_max", torch.float32, (grid.programs * group, grid.tiles_per_slice)),  # tile max m_t per CTA
            ("slot_mass", torch.float32, (grid.programs * group, grid.tiles_per_slice)),  # tile mass ℓ_t per CTA
            ("slice_max", torch.float32, (rows, grid.slices)),  # the group's published slice statistics
            ("slice_mass", torch.float32, (rows, grid.slices)),
            ("partial", torch.float32, (rows * grid.slices, block_d)),  # Σ v over a slice's samples
        ]
    else:
        regions = [
            ("partial", torch.float32, (rows * tiles, block_d)),
            ("tile_max", torch.float32, (rows, tiles)),
            ("tile_mass", torch.float32, (rows, tiles)),
        ]
    layout, start = [], 0
    for name, dtype, shape in regions:
        layout.append((name, dtype, shape, start))
        start += cdiv(math.prod(shape) * ELEMENT_SIZE[dtype], ALIGN) * ALIGN
    return tuple(layout)


def workspace_nbytes(key: WorkspaceKey) -> int:
    name, dtype, shape, start = workspace_regions(key)[-1]
    return start + math.prod(shape) * ELEMENT_SIZE[dtype]
