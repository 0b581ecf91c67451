"""What the decode kernels and their plan share: tile sizes, prop's launch parameters (:class:`Tuning`
and the measured defaults it overrides) and the workspace's layout (:class:`WorkspaceKey`, its regions
and row strides). The kernels (``prop``, ``flash``) and :mod:`santa.kernels.plan` import this module;
it imports neither, so the package has no import cycle."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TILE_SEARCHES = ("scan", "bisect")
ALIGN = 256  # bytes; every workspace region starts on this boundary
ELEMENT_SIZE = {torch.float32: 4, torch.int32: 4}


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Tuning:
    """prop's launch parameters (they change speed, never samples); ``None`` picks the measured default."""

    block_n: int | None = None  # keys per pass-1 tile
    warps_pass1: int | None = None
    stages_pass1: int | None = None
    warps_pass2: int | None = None
    samples_per_program: int | None = None  # pass-2 samples per program
    tile_search: str | None = None  # pass 2's tile of each sample: "scan" (compare with every tile) or "bisect"
    pdl: bool | None = None  # pass 2 as a programmatic dependent launch (Hopper)
    k_evict_first: bool | None = None  # pass 1 loads K with L2 policy evict_first, so the stash stays in L2
    discard_stash: bool | None = None  # pass 2 drops each row's dead stash from L2 (no write-back to DRAM)
    pass1_programs: int | None = None  # pass-1 programs at most (a power of two); a smaller grid loops over the tiles
    # the one-launch CUDA prop (santa.kernels.one_launch) where it serves the call (None: yes); False: the Triton prop's
    # two launches always. The two draw the same samples up to float32 CDF rounding (a sample on a CDF step may move).
    one_launch: bool | None = None


# The tuning of a batch-invariant decode: a request's samples the same bit for bit alone or batched. The Triton prop's
# tiles follow the keys alone; the one launch's float32 CDF follows its slices, which follow the batch (a plan-free
# order measured 10-13 % slower: benchmarks/KERNEL_NOTES.md, run 27). santa.model's batch_invariant=True and santa.vllm
# under VLLM_BATCH_INVARIANT=1 plan with it.
BATCH_INVARIANT = Tuning(one_launch=False)


def prop_tile(dim: int, tuning: Tuning = Tuning()) -> int:
    """Keys per prop pass-1 tile (does not change prop's samples, only rounding)."""
    return tuning.block_n or (128 if dim <= 128 else 64)


def flash_tile(dim: int) -> int:
    """Keys per flash tile: the sampling unit, so part of flash's semantics."""
    return 128 if dim <= 128 else 64


# Pass 1 launches a program per (tile, sequence, KV head) of the *planned* keys: under CUDA graphs the grid is fixed
# at the capacity (vLLM's max_model_len, a static cache's length), and the programs past a sequence's length exit at
# once but are still launched, ~0.83 ns each on the H200 (2026-12-02, benchmarks/vllm/capacity_ab.py: 2k-key
# sequences planned for 128k keys at batch 64 take 640 µs against 210.5 planned for 2k). Past this many programs
# the grid is cut and each program loops over tiles t, t + grid, … that its sequence reaches. 2^16 is the largest
# grid any timed table uses (Llama B = 32 × 32k: 32 · 8 · 256), so every timed plan keeps its one-tile programs.
PASS1_PROGRAMS = 1 << 16


def prop_pass1_tiles(tiles: int, rows: int, tuning: Tuning = Tuning()) -> int:
    """Pass-1 programs per (sequence, KV head) for ``rows = B·H_kv`` and ``tiles`` planned tiles: all of them up to
    ``Tuning.pass1_programs`` (default :data:`PASS1_PROGRAMS`) programs in all, else as many as fit (at least one)."""
    cap = tuning.pass1_programs or PASS1_PROGRAMS
    return tiles if rows * tiles <= cap else max(1, cap // rows)


def prop_sample_chunks(budget: int, tiles: int, rows: int, tuning: Tuning = Tuning()) -> tuple[int, int]:
    """(samples per pass-2 program, pass-2 programs per head) for ``rows = B·H`` heads: fewer samples
    per program when the tile search, O(samples × tiles) per program, grows with long sequences;
    more when many heads already fill the GPU (H200, 2026-12-01, 32k keys: 64 per program 159.3 /
    596.7 µs against 164.2 / 613.4 with 32 at B = 8 / 32; worse at batch 1, 32.1 against 31.2)."""
    if tuning.samples_per_program:
        per_program = tuning.samples_per_program
    elif tiles <= 256:
        per_program = 64 if rows >= 256 else 32
    else:
        per_program = 16 if tiles <= 512 else 8
    sblock = min(per_program, next_pow2(budget))
    return sblock, cdiv(budget, sblock)


def prop_tile_search(tiles: int, tuning: Tuning = Tuning()) -> str:
    """How pass 2 finds each sample's tile: ``"scan"`` compares every sample of a program with every
    tile (O(samples × T)), ``"bisect"`` binary-searches the stored prefix (O(T + samples · log T))."""
    return tuning.tile_search or ("bisect" if tiles > 256 else "scan")


def prop_discard_mode(chunks_per_head: int) -> int:
    """How pass 2 drops the dead stash from L2 (when ``DecodePlan.discard_stash``): 1, the last chunk
    of a head drops the whole row; 2, every chunk drops the part no other chunk reads. H200,
    2026-12-01, graph µs, cold L2, no discard → discard in one call: 1 at B = 8 × 32k (2 chunks)
    155.0 → 156.1 and Qwen B = 16 × 32k (4) 63.0 → 63.8, 2 there 155.2 → 174.3 and 63.2 → 73.9; at
    128k, batch 1 (16 chunks) 1's serial drop of 4,096 lines costs pass 2 +6 µs, 2 82.0 → 82.5. End to
    end (the write-back it saves is real there) 1 gave −1.6…−1.9 % per token at Qwen B = 16, Llama
    B = 6 × 30k and SmolLM2 B = 64, and 2 −0.7…−1.4 % at Llama 128k, batch 1."""
    return 2 if chunks_per_head >= 8 else 1


def prop_k_evict_first(stash_bytes: int, l2_bytes: int | None, tuning: Tuning = Tuning()) -> bool:
    """Whether pass 1 loads K as evict-first: when prop's stash (``B·H·n·4`` bytes, read by pass 2
    right after) fits in L2 but is not tiny. H200, 2026-12-01, same call, graph µs (no hint → hint):
    Llama shapes 128k 86.4 → 81.5, B = 6 × 30k 119.4 → 113.1, B = 8 × 32k 160.5 → 155.1; SmolLM2
    B = 64 80.6 → 77.4; Qwen B = 16 65.4 → 63.4; but +0.5 µs with a stash of ≤ 4 MB and +1–4 % once
    it outgrows L2 (Llama B = 24, 32; Qwen B = 32, 64). End to end −2.1 % per token at Qwen B = 16
    × 32k, −1.9 % at Llama B = 6 × 30k. Without a known L2 size (CPU): no hint."""
    if tuning.k_evict_first is not None:
        return tuning.k_evict_first
    return l2_bytes is not None and l2_bytes // 8 <= stash_bytes <= 3 * l2_bytes // 4


@dataclass(frozen=True)
class WorkspaceKey:
    """What a workspace was made for: a workspace serves calls with exactly this key."""

    kernel: str
    batch: int
    heads: int
    head_dim: int
    n_keys: int
    budget: int
    block_n: int
    sample_chunks: int  # prop: pass-2 programs per head (0 for flash)
    device: str

    def describe(self) -> str:
        return (f"kernel={self.kernel!r}, B={self.batch}, H={self.heads}, d={self.head_dim}, n_keys={self.n_keys}, "
                f"budget={self.budget}, tile={self.block_n}, chunks={self.sample_chunks}, device={self.device}")

    @classmethod
    def of(cls, *, kernel: str, batch: int, heads: int, head_dim: int, n_keys: int, budget: int, device: str,
           tuning: Tuning = Tuning()) -> WorkspaceKey:
        block_n = prop_tile(head_dim, tuning) if kernel == "prop" else flash_tile(head_dim)
        chunks = prop_sample_chunks(budget, cdiv(n_keys, block_n), batch * heads, tuning)[1] if kernel == "prop" else 0
        return cls(kernel, batch, heads, head_dim, n_keys, budget, block_n, chunks, device)


def workspace_regions(key: WorkspaceKey) -> tuple[tuple[str, torch.dtype, tuple[int, ...], int], ...]:
    """The workspace's regions as (name, dtype, shape, byte offset); each starts on a 256-byte boundary."""
    block_d = max(16, next_pow2(key.head_dim))
    tiles = cdiv(key.n_keys, key.block_n)
    rows = key.batch * key.heads
    if key.kernel == "prop":
        n_chunks = key.sample_chunks
        regions = [
            ("sem", torch.int32, (rows,)),  # zero when made; every call leaves it at zero
            # rows padded to whole 128-byte lines: pass 2 drops dead rows from L2 line by line
            ("stash", torch.float32, (rows, cdiv(tiles * key.block_n, 32) * 32)),
            ("tile_max", torch.float32, (rows, tiles)),
            ("tile_mass", torch.float32, (rows, tiles)),
            ("prefix", torch.float32, (rows, tiles)),  # P_t = S·C_t, written by pass 2 for its tile search
            ("partial", torch.float32, (rows * n_chunks, block_d)),
            # an error target's budget S_r per (sequence, head) row, written by pass 2 each call and read by the same
            # call (its reads); the call's, not the plan's, so no state outlives a call (the compiled op's scratch)
            ("budgets", torch.int32, (rows,)),
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


def workspace_strides(key: WorkspaceKey) -> tuple[int, int]:
    """Row strides (elements) of the stash (prop; 0 for flash) and of the tile statistics."""
    regions = {name: shape for name, _, shape, _ in workspace_regions(key)}
    return (regions["stash"][1] if "stash" in regions else 0), regions["tile_max"][1]


def workspace_nbytes(key: WorkspaceKey) -> int:
    name, dtype, shape, start = workspace_regions(key)[-1]
    return start + math.prod(shape) * ELEMENT_SIZE[dtype]
