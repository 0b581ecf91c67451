"""``decode()``: one sampled-attention decode step over a contiguous or paged KV cache.

Runs the Triton kernels on CUDA (or under ``TRITON_INTERPRET=1``) and the torch reference of the
same estimator otherwise; both draw the same Philox uniforms, so they agree up to float rounding.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import numbers
import os
from dataclasses import dataclass

import torch

from santa.kernels import reference
from santa.sampling import check_budget

# triton is imported only when a kernel runs, so that importing santa never fixes Triton's mode
# (TRITON_INTERPRET is read when the kernels are defined)
HAVE_TRITON = importlib.util.find_spec("triton") is not None

KERNELS = ("prop", "flash", "auto")
KV_LAYOUTS = ("NHD", "HND")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634
_ALIGN = 256  # bytes; every workspace region starts on this boundary


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def use_triton(device: torch.device) -> bool:
    """Whether decode() runs the Triton kernels for tensors on ``device``."""
    if not HAVE_TRITON:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


# Launch parameters of prop's passes (they change speed, not samples); the benchmark sweeps them.
PROP_TUNING: dict[str, int | None] = {
    "block_n": None, "warps_pass1": None, "stages_pass1": None, "warps_pass2": None,
    "samples_per_program": None, "pdl": None, "fused": None, "warps_fused": None, "pdl_trigger": None,
}


def prop_tile(dim: int) -> int:
    """Keys per prop pass-1 tile (does not change prop's samples, only rounding)."""
    return PROP_TUNING["block_n"] or (128 if dim <= 128 else 64)


def prop_sample_chunks(budget: int, tiles: int) -> tuple[int, int]:
    """(samples per pass-2 program, pass-2 programs per head): fewer samples per program when the
    tile search, O(samples × tiles) per program, grows with long sequences."""
    per_program = PROP_TUNING["samples_per_program"] or (32 if tiles <= 256 else 16 if tiles <= 512 else 8)
    sblock = min(per_program, _next_pow2(budget))
    return sblock, _cdiv(budget, sblock)


def flash_tile(dim: int) -> int:
    """Keys per flash tile: the sampling unit, so part of flash's semantics."""
    return 128 if dim <= 128 else 64


@dataclass
class _Call:
    """A validated call: shapes, strides and launch constants shared by both kernels."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    batch: int
    heads: int
    kv_heads: int
    group: int
    dim: int
    n_keys: int  # keys addressable per sequence (L_max, or max_pages · page_size)
    paged: bool
    page_size: int
    has_seq_lens: bool
    stride_bt: int
    k_strides: tuple[int, int, int]  # (batch or page, position, kv head)
    v_strides: tuple[int, int, int]
    qk_scale: float  # scale · log2(e): the kernels work in base 2
    ieee_dot: bool
    block_g: int
    block_n: int
    block_d: int
    warps_pass1: int
    stages_pass1: int
    warps_pass2: int
    pdl: bool  # launch pass 2 as a programmatic dependent launch (Hopper), hiding its launch latency
    pdl_trigger: bool  # pass 1 triggers pass 2's launch as its programs start (two-launch path)
    fused: bool  # prop: both passes in one launch (pass 2 of a group overlaps later groups' pass 1)
    warps_fused: int
    return_counts: bool


def _check_float_tensor(name: str, x: object, dims: int, shape_doc: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {shape_doc}, got {type(x).__name__}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() != dims:
        raise ValueError(f"{name} must have shape {shape_doc} ({dims} dims), got {tuple(x.shape)}")
    if x.shape[-1] > 0 and x.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension, got strides {x.stride()}")
    return x


def _cache_strides(x: torch.Tensor, kv_layout: str) -> tuple[int, int, int]:
    """(batch or page, position, kv head) strides of a cache in ``kv_layout``."""
    if kv_layout == "NHD":  # [B or pages, L or page_size, H_kv, d]
        return x.stride(0), x.stride(1), x.stride(2)
    return x.stride(0), x.stride(2), x.stride(1)  # HND: [B or pages, H_kv, L or page_size, d]


def _validate(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, seed, offset, out, return_counts):
    q = _check_float_tensor("q", q, 3, "[B, H, d]")
    paged = block_table is not None
    cache_doc = "[pages, page_size, H_kv, d]" if paged else "[B, L_max, H_kv, d]"
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if kv_layout == "HND":
        cache_doc = "[pages, H_kv, page_size, d]" if paged else "[B, H_kv, L_max, d]"
    k_cache = _check_float_tensor("k_cache", k_cache, 4, cache_doc)
    v_cache = _check_float_tensor("v_cache", v_cache, 4, cache_doc)
    budget = check_budget(budget)
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"q, k_cache and v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    device = q.device
    if k_cache.device != device or v_cache.device != device:
        raise ValueError(f"q, k_cache and v_cache must be on one device, got {device}, {k_cache.device}, {v_cache.device}")
    batch, heads, dim = q.shape
    if batch < 1 or heads < 1 or dim < 1:
        raise ValueError(f"q must have B, H, d ≥ 1, got {tuple(q.shape)}")
    pos_axis, head_axis = (1, 2) if kv_layout == "NHD" else (2, 1)
    kv_heads = k_cache.shape[head_axis]
    if k_cache.shape[3] != dim:
        raise ValueError(f"k_cache head_dim {k_cache.shape[3]} does not match q's head_dim {dim}")
    if kv_heads < 1 or heads % kv_heads != 0:
        raise ValueError(f"q's heads H={heads} must be a multiple of k_cache's KV heads H_kv={kv_heads}")
    if k_cache.shape[pos_axis] < 1:
        raise ValueError(f"k_cache must hold at least one key position, got shape {tuple(k_cache.shape)}")
    if paged:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2:
            got = f"{block_table.dtype} {tuple(block_table.shape)}" if isinstance(block_table, torch.Tensor) else type(block_table).__name__
            raise TypeError(f"block_table must be an int32 tensor [B, max_pages], got {got}")
        if block_table.shape[0] != batch or block_table.shape[1] < 1:
            raise ValueError(f"block_table must have shape [B={batch}, max_pages ≥ 1], got {tuple(block_table.shape)}")
        if block_table.device != device:
            raise ValueError(f"block_table is on {block_table.device} but q is on {device}")
        if block_table.stride(1) != 1:
            raise ValueError("block_table must be contiguous along its pages dimension")
        if seq_lens is None:
            raise ValueError("seq_lens is required with a paged cache (block_table)")
        n_keys = block_table.shape[1] * k_cache.shape[pos_axis]
    else:
        if k_cache.shape[0] != batch:
            raise ValueError(f"k_cache batch {k_cache.shape[0]} does not match q's batch {batch}")
        n_keys = k_cache.shape[pos_axis]
    if seq_lens is not None:
        if not isinstance(seq_lens, torch.Tensor) or seq_lens.dtype != torch.int32 or seq_lens.shape != (batch,):
            got = f"{seq_lens.dtype} {tuple(seq_lens.shape)}" if isinstance(seq_lens, torch.Tensor) else type(seq_lens).__name__
            raise TypeError(f"seq_lens must be an int32 tensor [B={batch}], got {got}")
        if seq_lens.device != device:
            raise ValueError(f"seq_lens is on {seq_lens.device} but q is on {device}")
        if device.type == "cpu" and ((seq_lens < 0) | (seq_lens > n_keys)).any():
            raise ValueError(f"seq_lens must lie in [0, {n_keys}] (the keys the cache can address)")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale)):
        raise TypeError(f"scale must be a finite float or None, got {scale!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
    if isinstance(offset, torch.Tensor):
        if offset.dtype != torch.int64 or offset.numel() != 1 or offset.device != device:
            raise ValueError(f"offset as a tensor must be one int64 element on {device}, got {offset.dtype} {tuple(offset.shape)} on {offset.device}")
    elif isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or not 0 <= offset < 2**63:
        raise ValueError(f"offset must be an int in [0, 2**63) or a one-element int64 tensor, got {offset!r}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != device:
            got = f"{out.dtype} {tuple(out.shape)} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"out must be a tensor like q ({q.dtype} {tuple(q.shape)} on {device}), got {got}")
        if out.stride(-1) != 1:
            raise ValueError("out must be contiguous in its last dimension")
    if not isinstance(return_counts, bool):
        raise TypeError(f"return_counts must be a bool, got {type(return_counts).__name__}")
    return q, k_cache, v_cache, budget, n_keys, kv_heads


_ELEMENT_SIZE = {torch.float32: 4, torch.int32: 4}


@functools.lru_cache(maxsize=64)
def _workspace_layout(kernel: str, batch: int, heads: int, dim: int, n_keys: int, budget: int, block_n: int) -> tuple[tuple[str, torch.dtype, tuple[int, ...], int], ...]:
    """The workspace's regions as (name, dtype, shape, byte offset); each starts on a 256-byte boundary."""
    block_d = _next_pow2(dim)
    tiles = _cdiv(n_keys, block_n)
    rows = batch * heads
    if kernel == "prop":
        _, n_chunks = prop_sample_chunks(budget, tiles)
        regions = [
            # first, so that it stays at offset 0: zero when made, and each call leaves it at zero
            ("sem", torch.int32, (rows,)),
            # fused launch: [ticket, arrivals per (sequence, KV head), pass-2 entries per group]; also kept at zero
            ("sync", torch.int32, (1 + 2 * rows,)),
            ("stash", torch.float32, (rows, tiles * block_n)),
            ("tile_max", torch.float32, (rows, tiles)),
            ("tile_mass", torch.float32, (rows, tiles)),
            ("partial", torch.float32, (rows * n_chunks, block_d)),
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
        start += _cdiv(math.prod(shape) * _ELEMENT_SIZE[dtype], _ALIGN) * _ALIGN
    return tuple(layout)


def _layout_bytes(layout) -> int:
    name, dtype, shape, start = layout[-1]
    return start + math.prod(shape) * _ELEMENT_SIZE[dtype]


_VIEWS_CACHE: dict[tuple, dict[str, torch.Tensor]] = {}


def _carve(workspace: torch.Tensor, layout) -> dict[str, torch.Tensor]:
    """Typed views of the workspace's regions (cached per buffer and layout: views cost host time)."""
    key = (workspace.data_ptr(), workspace.numel(), str(workspace.device), layout)
    views = _VIEWS_CACHE.get(key)
    if views is None:
        views = {}
        for name, dtype, shape, start in layout:
            nbytes = math.prod(shape) * _ELEMENT_SIZE[dtype]
            views[name] = workspace[start : start + nbytes].view(dtype).view(shape)
        if len(_VIEWS_CACHE) >= 32:
            _VIEWS_CACHE.pop(next(iter(_VIEWS_CACHE)))
        _VIEWS_CACHE[key] = views
    return views


def workspace_bytes(batch: int, heads: int, dim: int, n_keys: int, budget: int, kernel: str = "prop") -> int:
    """Bytes of workspace a decode call with these sizes needs (``n_keys``: L_max or max_pages·page_size)."""
    kernel = "prop" if kernel == "auto" else kernel
    block_n = prop_tile(dim) if kernel == "prop" else flash_tile(dim)
    return _layout_bytes(_workspace_layout(kernel, batch, heads, dim, n_keys, budget, block_n))


def make_workspace(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    budget: int,
    *,
    kernel: str = "auto",
    block_table: torch.Tensor | None = None,
    kv_layout: str = "NHD",
) -> torch.Tensor:
    """A zeroed uint8 workspace for :func:`decode` calls with these shapes (reuse it across steps).

    A workspace belongs to one call shape (B, H, d, n_keys, budget, kernel) and serves one call at
    a time: it holds the stash and per-head integer semaphores that every call leaves at zero.
    Give concurrent streams their own.
    """
    batch, heads, dim = q.shape
    pos_axis = 1 if kv_layout == "NHD" else 2
    n_keys = k_cache.shape[pos_axis] * (block_table.shape[1] if block_table is not None else 1)
    nbytes = workspace_bytes(batch, heads, dim, n_keys, check_budget(budget), kernel)
    return torch.zeros(nbytes, dtype=torch.uint8, device=q.device)


_STAGES: dict | None = None  # set by santa.bench.kernels to capture a validated call instead of launching
_WORKSPACE_CACHE: dict[tuple, torch.Tensor] = {}
_WORKSPACE_CACHE_SIZE = 8


def _cached_workspace(layout, device: torch.device, nbytes: int) -> torch.Tensor:
    """One zeroed workspace per (layout, device), kept for eager calls that pass none."""
    key = (layout, str(device))
    ws = _WORKSPACE_CACHE.pop(key, None)
    if ws is None:
        ws = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        while len(_WORKSPACE_CACHE) >= _WORKSPACE_CACHE_SIZE:
            _WORKSPACE_CACHE.pop(next(iter(_WORKSPACE_CACHE)))
    _WORKSPACE_CACHE[key] = ws  # most recently used last
    return ws


def decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    budget: int,
    *,
    kernel: str = "auto",
    seq_lens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    kv_layout: str = "NHD",
    scale: float | None = None,
    seed: int = 0,
    offset: int | torch.Tensor = 0,
    out: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    return_counts: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sampled attention for one new token per sequence: ``ô = (1/S) Σ_j c_j v_j`` (prop).

    q: ``[B, H, d]`` float16/bfloat16/float32.
    k_cache, v_cache: contiguous ``[B, L_max, H_kv, d]`` (``kv_layout="NHD"``; ``"HND"``:
        ``[B, H_kv, L_max, d]``), or paged ``[pages, page_size, H_kv, d]`` (HND:
        ``[pages, H_kv, page_size, d]``) with ``block_table`` int32 ``[B, max_pages]``: key j of
        sequence b is row ``j % page_size`` of page ``block_table[b, j // page_size]``
        (FlashInfer's convention). Same dtype as q; H must be a multiple of H_kv (GQA).
    budget: S ≥ 1 samples per head (S > n is legal: counts repeat).
    kernel: ``"prop"`` (exact global systematic sampling: S²ANTA-sys over the whole sequence, two
        launches), ``"flash"`` (``⌈S/T⌉`` systematic samples per tile of 128 keys, 64 for d > 128,
        then a FlashDecoding merge), ``"auto"`` (prop).
    seq_lens: int32 ``[B]``, keys visible per sequence (required when paged; default L_max).
        A sequence of length 0 gets a zero output.
    scale: score scale (default ``1/√d``).
    seed, offset: Philox key and counter (ints ≥ 0; offset may be a one-element int64 tensor on
        the device, read inside the kernel, so a captured CUDA graph can advance it per step).
        Uniforms are keyed on (seed, offset, sequence, head, tile): same inputs, seed and offset
        give bitwise-equal outputs; another offset gives fresh samples.
    out: optional ``[B, H, d]`` output in q's dtype. workspace: optional buffer from
        :func:`make_workspace`; with both given, the call allocates nothing, syncs nothing, and
        can be captured in a CUDA graph (return_counts=False).
    return_counts: also return per-key sample counts ``[B, H, n_max]`` int32 (tests, diagnostics).
        For prop, ``out = (1/S) Σ_j c_j v_j`` over them; for flash they are the per-tile counts.
    Returns out, or ``(out, counts)``.
    """
    q, k_cache, v_cache, budget, n_keys, kv_heads = _validate(
        q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, seed, offset, out, return_counts
    )
    kernel = "prop" if kernel == "auto" else kernel
    batch, heads, dim = q.shape
    if not use_triton(q.device):
        return _decode_reference(
            q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, seed, offset, out, return_counts
        )
    from santa.kernels.flash import launch_flash
    from santa.kernels.prop import launch_prop

    block_n = prop_tile(dim) if kernel == "prop" else flash_tile(dim)
    layout = _workspace_layout(kernel, batch, heads, dim, n_keys, budget, block_n)
    nbytes = _layout_bytes(layout)
    if workspace is None:
        workspace = _cached_workspace(layout, q.device, nbytes)
    elif not isinstance(workspace, torch.Tensor) or workspace.dtype != torch.uint8 or workspace.dim() != 1 or workspace.device != q.device:
        raise ValueError("workspace must be a 1-D uint8 tensor on q's device, from santa.kernels.make_workspace")
    elif workspace.numel() < nbytes:
        raise ValueError(f"workspace holds {workspace.numel()} bytes but this call needs {nbytes}: make it with make_workspace")
    ws = _carve(workspace, layout)
    if out is None:
        out = torch.empty_like(q)
    counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device=q.device) if return_counts else q
    if isinstance(offset, torch.Tensor):
        offset_ptr, offset_value = offset, 0
    else:
        offset_ptr, offset_value = q, int(offset)
    paged = block_table is not None
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    call = _Call(
        q=q, k=k_cache, v=v_cache,
        seq_lens=seq_lens if seq_lens is not None else q,
        block_table=block_table if paged else q,
        batch=batch, heads=heads, kv_heads=kv_heads, group=heads // kv_heads, dim=dim,
        n_keys=n_keys, paged=paged,
        page_size=(k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]) if paged else 1,
        has_seq_lens=seq_lens is not None,
        stride_bt=block_table.stride(0) if paged else 0,
        k_strides=_cache_strides(k_cache, kv_layout), v_strides=_cache_strides(v_cache, kv_layout),
        qk_scale=scale * LOG2E, ieee_dot=q.dtype == torch.float32 or q.device.type != "cuda",  # the interpreter's bf16 dot rounds
        block_g=max(16, _next_pow2(heads // kv_heads)), block_n=block_n, block_d=max(16, _next_pow2(dim)),
        warps_pass1=(kernel == "prop" and PROP_TUNING["warps_pass1"]) or (8 if dim > 128 else 4),
        stages_pass1=(kernel == "prop" and PROP_TUNING["stages_pass1"]) or 1,
        # 8 warps up to 256 tiles (32k: 31.2 vs 34.5 µs), 4 beyond (128k: 95.1 with 8 vs 86.7 with 4; H200, 2026-11-29)
        warps_pass2=PROP_TUNING["warps_pass2"] or (8 if _cdiv(n_keys, block_n) <= 256 else 4),
        pdl=q.device.type == "cuda" and torch.cuda.get_device_capability(q.device)[0] >= 9 and PROP_TUNING["pdl"] is not False,
        pdl_trigger=PROP_TUNING["pdl_trigger"] is True,  # measured slower at 32k (34.2 vs 31.2 µs): opt-in
        fused=PROP_TUNING["fused"] is True,  # measured slower everywhere (32k 40.3 vs 31.2 µs): opt-in
        warps_fused=PROP_TUNING["warps_fused"] or (8 if dim > 128 else 4),
        return_counts=return_counts,
    )
    if _STAGES is not None:  # the benchmark times the passes one by one
        _STAGES.update(call=call, ws=ws, out=out, counts=counts, offset_ptr=offset_ptr, offset=offset_value)
        return out
    launch = launch_prop if kernel == "prop" else launch_flash
    launch(call, budget, out, ws, counts, seed=int(seed), offset=offset_value, offset_ptr=offset_ptr)
    return (out, counts) if return_counts else out


def _decode_reference(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, seed, offset, out, return_counts):
    if isinstance(offset, torch.Tensor):
        offset = int(offset.item())
    kwargs = dict(seq_lens=seq_lens, block_table=block_table, kv_layout=kv_layout, scale=scale, seed=int(seed), offset=int(offset))
    if kernel == "prop":
        result, counts = reference.prop_reference(q, k_cache, v_cache, budget, **kwargs)
    else:
        result, counts = reference.flash_reference(q, k_cache, v_cache, budget, tile=flash_tile(q.shape[-1]), **kwargs)
    if out is not None:
        out.copy_(result)
        result = out
    return (result, counts.to(torch.int32)) if return_counts else result
