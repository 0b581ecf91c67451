"""The eager entry (``santa.kernels.eager``; ``santa.kernels.decode`` is its function): ``decode()``, one
sampled-attention decode step over a contiguous or paged KV cache.

Validates its inputs, then runs a cached :class:`santa.kernels.plan.DecodePlan` (the Triton kernels,
on CUDA, or on the CPU under ``TRITON_INTERPRET=1``) or, on the CPU otherwise, the torch reference of
the same estimator; both draw the same Philox uniforms, so they agree up to float rounding, and both
take any budget up to ``MAX_BUDGET`` per head. Tensors on other devices (meta, mps) are refused. For per-step calls without
validation or host work, plan once with :func:`santa.kernels.plan_decode` and call its ``run``.

Non-finite input: a NaN or +inf score (NaN/inf in q or in a visible key) makes the output of every
affected (sequence, head) NaN on every path; −inf scores get weight 0, as in a softmax. A V row is
read only where it is sampled: a NaN/inf value makes its element of the output non-finite for every
head that samples its row (flash: for every head of the KV group, where one of them samples it in
the tile, since a tile reads each row once for the group), and goes unseen otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from santa.attention import check_flag
from santa.checks import integer
from santa.checks import scale as check_scale
from santa.error_target import DEFAULT_PILOT
from santa.kernels.layout import BATCH_INVARIANT, Tuning, WorkspaceKey, workspace_nbytes
from santa.kernels.plan import (
    DTYPES,
    FP8,
    HAVE_TRITON,
    KERNELS,
    KV_LAYOUTS,
    DecodePlan,
    Workspace,
    check_budget_for_kernels,
    check_head_offset,
    check_key_values,
    check_seed_and_offset,
    check_tables,
    check_workspace,
    checked_error_target,
    checked_scale,
    kernels_on_cpu,
    plan_decode,
    refuse_unsupported,
    resolve_device,
    torch_decode,
)


def use_triton(device: torch.device) -> bool:
    """Whether decode() runs the Triton kernels for tensors on ``device``: on CUDA, and on the CPU
    under ``TRITON_INTERPRET=1`` (:func:`santa.kernels.plan.kernels_on_cpu`); elsewhere the torch
    reference of the same estimator runs."""
    if not HAVE_TRITON:
        return False
    return device.type == "cuda" or (device.type == "cpu" and kernels_on_cpu())


def _check_float_tensor(name: str, x: object, dims: int, shape_doc: str, dtypes: tuple = DTYPES) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {shape_doc}, got {type(x).__name__}")
    if x.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        fp8_hint = (": only e4m3 fp8 caches are supported (vLLM's kv_cache_dtype='fp8' / 'fp8_e4m3')"
                    if FP8 in dtypes and x.dtype.is_floating_point and x.dtype.itemsize == 1 else "")
        raise TypeError(f"{name} must be one of {allowed}, got {x.dtype}{fp8_hint}")
    if x.dim() != dims:
        raise ValueError(f"{name} must have shape {shape_doc} ({dims} dims), got {tuple(x.shape)}")
    if x.shape[-1] > 0 and x.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension, got strides {x.stride()}")
    return x


def _check_cache_tensor(name: str, x: object, dims: int, shape_doc: str) -> torch.Tensor:
    """A K or V cache: float16, bfloat16, float32 or float8_e4m3fn (other fp8 formats are refused by name)."""
    return _check_float_tensor(name, x, dims, shape_doc, dtypes=(*DTYPES, FP8))


def checked_cache_scales(k_scale, v_scale, *, kv_dtype: torch.dtype, kv_heads: int, device: torch.device,
                         check_values: bool) -> tuple:
    """``(k_scale, v_scale)`` as the kernels take them: floats, or float32 tensors ``[H_kv]`` on ``device``.
    An fp8 cache's scale defaults to 1.0; other caches take none (ValueError). A wrong type is a
    TypeError, a bad shape, device or value a ValueError, each naming the argument; tensor values
    (finite, > 0) are read only when ``check_values`` (a host sync on CUDA)."""
    result = []
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if kv_dtype != FP8:
            if value is not None:
                raise ValueError(f"{name} dequantises a float8_e4m3fn cache; these caches are {kv_dtype}: pass {name}=None")
            result.append(1.0)
            continue
        if value is None:
            result.append(1.0)
            continue
        if isinstance(value, torch.Tensor):
            if value.dtype != torch.float32 or value.shape != (kv_heads,):
                raise ValueError(f"{name} as a tensor must be float32 [H_kv={kv_heads}] (one scale per KV head), "
                                 f"got {value.dtype} {tuple(value.shape)}: pass a float for one scale")
            if value.device != device:
                raise ValueError(f"{name} is on {value.device} but the caches are on {device}")
            if kv_heads > 1 and value.stride(0) != 1:
                raise ValueError(f"{name} must be contiguous, got stride {value.stride(0)}")
        result.append(checked_scale(name, value, fp8=True, check_values=check_values))
    return tuple(result)


def _check_per_sequence(name: str, x: object, dtypes: tuple, *, batch: int, device: torch.device, expected: str) -> None:
    """One value per sequence: a tensor of one of ``dtypes``, shape ``[B]``, on ``device``, contiguous.
    TypeError ``"{name} {expected} [B=…], got …"`` for the wrong kind; ValueError for the device or strides."""
    if not isinstance(x, torch.Tensor) or x.dtype not in dtypes or x.shape != (batch,):
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{name} {expected} [B={batch}], got {got}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but q is on {device}")
    if batch > 1 and x.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (stride 1), got stride {x.stride(0)}: pass {name}.contiguous()")


def check_request_keys(seed, offset, positions, *, batch: int, device: torch.device, check_values: bool) -> None:
    """Per-sequence keys and positions (request-keyed draws): ``seed`` an int or an int64 tensor ``[B]``
    on ``device``, ``positions`` None or an int32/int64 tensor ``[B]`` on ``device`` (then ``offset``
    must be the int 0). Values (keys in ``[0, 2**63)``, positions ≥ 0) are read only when
    ``check_values`` (a host sync on CUDA). TypeError / ValueError naming the argument."""
    for name, tensor, dtypes in (("seed", seed, (torch.int64,)), ("positions", positions, (torch.int32, torch.int64))):
        if not isinstance(tensor, torch.Tensor):
            continue
        allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        _check_per_sequence(name, tensor, dtypes, batch=batch, device=device, expected=f"as a tensor must be {allowed}")
    if check_values:
        check_key_values(seed=seed, positions=positions, starts=None, seq_lens=None, n_keys=0)
    if positions is not None and (isinstance(offset, torch.Tensor) or offset != 0):
        raise ValueError("offset must be 0 when positions are given: each draw is keyed on (seed, position, head), "
                         "so the positions already advance with every decode step")


def check_starts(starts, seq_lens, *, kernel: str, batch: int, n_keys: int, device: torch.device, check_values: bool) -> None:
    """``starts``: an int32 tensor ``[B]`` on ``device``, with prop (flash's tile budgets count from key 0);
    values in ``[0, seq_len]`` read only when ``check_values``. TypeError / ValueError naming it."""
    _check_per_sequence("starts", starts, (torch.int32,), batch=batch, device=device, expected="must be an int32 tensor")
    if kernel != "prop":
        raise ValueError(f"starts need kernel='prop' (flash's per-tile budgets count the tiles from key 0), got kernel={kernel!r}")
    if check_values:
        check_key_values(seed=None, positions=None, starts=starts, seq_lens=seq_lens, n_keys=n_keys)


def _validate(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, offset, out, return_counts):
    """Everything but the values of seed, offset and the tables (:func:`check_seed_and_offset`, :func:`check_tables`)."""
    q = _check_float_tensor("q", q, 3, "[B, H, d]")
    paged = block_table is not None
    cache_doc = "[pages, page_size, H_kv, d]" if paged else "[B, L_max, H_kv, d]"
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if kv_layout == "HND":
        cache_doc = "[pages, H_kv, page_size, d]" if paged else "[B, H_kv, L_max, d]"
    k_cache = _check_cache_tensor("k_cache", k_cache, 4, cache_doc)
    v_cache = _check_cache_tensor("v_cache", v_cache, 4, cache_doc)
    budget = check_budget_for_kernels(budget)
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.dtype != v_cache.dtype or (k_cache.dtype != FP8 and q.dtype != k_cache.dtype):
        raise TypeError(f"q, k_cache and v_cache must share one dtype, or the caches both be float8_e4m3fn, "
                        f"got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    device = q.device
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"q, k_cache and v_cache must be on the CPU or a CUDA device, got {device}")
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
        other = k_cache.shape[pos_axis]  # the heads, were the cache in the other layout
        hint = "" if other < 1 or heads % other else (
            f" (kv_layout={kv_layout!r} reads k_cache {tuple(k_cache.shape)} as {cache_doc}: is it "
            f"{'HND' if kv_layout == 'NHD' else 'NHD'}?)")
        raise ValueError(f"q's heads H={heads} must be a multiple of k_cache's KV heads H_kv={kv_heads}{hint}")
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
        _check_per_sequence("seq_lens", seq_lens, (torch.int32,), batch=batch, device=device, expected="must be an int32 tensor")
    check_scale(scale)
    if isinstance(offset, torch.Tensor):
        if offset.dtype != torch.int64 or offset.numel() != 1 or offset.device != device:
            raise ValueError(f"offset as a tensor must be one int64 element on {device}, got {offset.dtype} {tuple(offset.shape)} on {offset.device}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != device:
            got = f"{out.dtype} {tuple(out.shape)} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"out must be a tensor like q ({q.dtype} {tuple(q.shape)} on {device}), got {got}")
        if out.stride(-1) != 1:
            raise ValueError("out must be contiguous in its last dimension")
    if not isinstance(return_counts, bool):
        raise TypeError(f"return_counts must be a bool, got {type(return_counts).__name__}")
    return q, k_cache, v_cache, budget, n_keys, kv_heads


def workspace_bytes(batch: int, heads: int, dim: int, n_keys: int, budget: int, kernel: str = "prop") -> int:
    """Bytes of workspace a decode call with these sizes needs (``n_keys``: L_max or max_pages·page_size)."""
    batch, heads, dim, n_keys = (integer(name, value, low=1) for name, value in
                                 (("batch", batch), ("heads", heads), ("dim", dim), ("n_keys", n_keys)))
    return workspace_nbytes(_workspace_key(kernel, batch, heads, dim, n_keys, budget, "cpu"))


def _workspace_key(kernel: str, batch: int, heads: int, dim: int, n_keys: int, budget: int, device,
                   tuning: Tuning | None = None) -> WorkspaceKey:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    kernel = "prop" if kernel == "auto" else kernel
    return WorkspaceKey.of(kernel=kernel, batch=batch, heads=heads, head_dim=dim, n_keys=n_keys,
                           budget=check_budget_for_kernels(budget), device=str(resolve_device(device)),
                           tuning=tuning or Tuning())


def make_workspace(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    budget: int,
    *,
    kernel: str = "auto",
    block_table: torch.Tensor | None = None,
    kv_layout: str = "NHD",
) -> Workspace:
    """A zeroed :class:`Workspace` for :func:`decode` calls with these shapes (reuse it across steps).

    A workspace belongs to one call shape (B, H, d, n_keys, budget, kernel) and serves one call at
    a time: it holds the stash and per-head integer semaphores that every call leaves at zero.
    Give concurrent streams their own. :func:`decode` refuses it for any other shape or kernel.
    """
    q = _check_float_tensor("q", q, 3, "[B, H, d]")
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    k_cache = _check_cache_tensor("k_cache", k_cache, 4, "[B or pages, L, H_kv, d]")
    if block_table is not None and (not isinstance(block_table, torch.Tensor) or block_table.dim() != 2):
        raise TypeError("block_table must be an int32 tensor [B, max_pages]")
    batch, heads, dim = q.shape
    pos_axis = 1 if kv_layout == "NHD" else 2
    n_keys = k_cache.shape[pos_axis] * (block_table.shape[1] if block_table is not None else 1)
    return Workspace.zeros(_workspace_key(kernel, batch, heads, dim, n_keys, budget, q.device))


@dataclass(frozen=True)
class _Call:
    """A validated call signature: what decode() needs besides the tensors."""

    budget: int
    kernel: str  # "prop" or "flash"
    n_keys: int
    kv_heads: int
    page_size: int  # 1 for a contiguous cache
    workspace_key: WorkspaceKey
    plan: DecodePlan | None  # None: the torch fallback
    plan_key: tuple | None  # what the plan depends on: calls of one shape with other signatures share it
    host_checks: bool  # check the tables' values on every call (CPU, the torch fallback)
    error_target: float | None  # budgets from an error target (budget is then the cap)
    pilot: int


_CALLS: dict[tuple, _Call] = {}  # the one cache: call signature → its validation and plan (cleared past _CALL_CACHE_SIZE)
_CALL_CACHE_SIZE = 256
# distinct plans the cache holds at most: each owns a workspace sized by its keys (Llama's B = 16 × 32k: 66 MB), and a
# cache that grows by a key per step (transformers' default DynamicCache under santa.hf) makes a plan per step
_PLANS_HELD = 8


def _plan_for(key: tuple, make_plan: Callable[[tuple, dict], DecodePlan] | None = None, **shape) -> DecodePlan:
    """The plan of a call shape: the one a cached call of that shape holds (another signature of it: other strides,
    an ``out``, an offset tensor), else a new one (its launches and, unless given, its workspace), for which the calls
    of the oldest plan are dropped where the cache holds :data:`_PLANS_HELD` plans already (their workspaces freed).
    ``make_plan(key, shape)`` makes the new one instead of :func:`plan_decode` (the custom op's: :mod:`santa.kernels.ops`)."""
    found = next((call.plan for call in _CALLS.values() if call.plan_key == key), None)
    if found is not None:
        return found
    held = list({call.plan_key: None for call in _CALLS.values() if call.plan is not None})  # in the order made
    for stale in held[: max(0, len(held) - _PLANS_HELD + 1)]:
        for sig in [sig for sig, call in _CALLS.items() if call.plan_key == stale]:
            del _CALLS[sig]
    return plan_decode(**shape) if make_plan is None else make_plan(key, shape)


def _signature(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, offset, out, return_counts,
               error_target=None, pilot=DEFAULT_PILOT, batch_invariant=False):
    """Everything :func:`_validate` and :func:`use_triton` read (types, shapes, strides, dtypes,
    devices, the non-tensor arguments with their types, ``TRITON_INTERPRET``; ``batch_invariant``, a bool checked
    before, which the plan depends on), or None when some argument is not of a kind it can key on (then
    the call is validated in full, which raises for it)."""
    try:
        tensors = (type(q), q.shape, q.stride(), q.dtype, q.device, type(k_cache), k_cache.shape, k_cache.stride(),
                   k_cache.dtype, k_cache.device, type(v_cache), v_cache.shape, v_cache.stride(), v_cache.dtype, v_cache.device)
        offset_tensor = offset if isinstance(offset, torch.Tensor) else None
        optional = (  # spelled out: a generator here costs more than the rest of the signature
            None if seq_lens is None else (type(seq_lens), seq_lens.shape, seq_lens.stride(), seq_lens.dtype, seq_lens.device),
            None if block_table is None else (type(block_table), block_table.shape, block_table.stride(), block_table.dtype,
                                              block_table.device),
            None if out is None else (type(out), out.shape, out.stride(), out.dtype, out.device),
            None if offset_tensor is None else (type(offset_tensor), offset_tensor.shape, offset_tensor.stride(),
                                                offset_tensor.dtype, offset_tensor.device),
        )
    except (AttributeError, TypeError):  # not tensors: _validate names the argument
        return None
    # on the CPU, TRITON_INTERPRET decides between the kernels and the torch fallback (use_triton); CUDA always runs them
    interpret = None if q.device.type == "cuda" else (os.environ.get("TRITON_INTERPRET"), kernels_on_cpu())
    return (tensors, optional, type(offset), type(budget), budget, type(kernel), kernel, type(kv_layout), kv_layout,
            type(scale), scale, type(return_counts), return_counts, interpret, type(error_target), error_target,
            type(pilot), pilot, batch_invariant)


def _validated_call(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, offset, out,
                    return_counts, error_target=None, pilot=DEFAULT_PILOT, batch_invariant=False, make_plan=None) -> _Call:
    """The call's validation: from the cache for a signature seen before, else :func:`_validate` in full (a new plan
    from ``make_plan``, :func:`_plan_for`'s; with ``tuning=BATCH_INVARIANT`` where ``batch_invariant``, a bool the caller
    checked)."""
    sig = _signature(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, offset, out, return_counts,
                     error_target, pilot, batch_invariant)
    try:
        call = None if sig is None else _CALLS.get(sig)
    except TypeError:  # an unhashable argument: _validate names it
        sig = call = None
    if call is not None:
        return call
    q, k_cache, v_cache, budget, n_keys, kv_heads = _validate(
        q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, offset, out, return_counts
    )
    kernel = "prop" if kernel == "auto" else kernel
    error_target, pilot = checked_error_target(error_target, pilot, kernel)
    paged = block_table is not None
    page_size = k_cache.shape[1 if kv_layout == "NHD" else 2] if paged else 1
    batch, heads, dim = q.shape
    plan = plan_key = None
    tuning = BATCH_INVARIANT if batch_invariant else None  # None: the plan's default (the one launch where it serves)
    if use_triton(q.device):
        shape = dict(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget, dtype=q.dtype,
                     device=q.device, kernel=kernel, kv_layout=kv_layout, page_size=page_size if paged else None,
                     scale=None if scale is None else float(scale), kv_dtype=k_cache.dtype, error_target=error_target,
                     pilot=pilot, tuning=tuning)
        plan_key = tuple(shape.values())  # with the tuning: a batch-invariant plan is never shared with a default one
        plan = _plan_for(plan_key, make_plan, **shape)
    call = _Call(budget=budget, kernel=kernel, n_keys=n_keys, kv_heads=kv_heads, page_size=page_size,
                 workspace_key=_workspace_key(kernel, batch, heads, dim, n_keys, budget, q.device, tuning), plan=plan,
                 plan_key=plan_key,
                 host_checks=plan is None or q.device.type == "cpu", error_target=error_target, pilot=pilot)
    if sig is not None:
        if len(_CALLS) >= _CALL_CACHE_SIZE:
            _CALLS.clear()
        _CALLS[sig] = call
    return call


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
    workspace: Workspace | None = None,
    return_counts: bool = False,
    check: bool | None = None,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
    head_offset: int = 0,
    error_target: float | None = None,
    pilot: int = DEFAULT_PILOT,
    batch_invariant: bool = False,
    **unsupported,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sampled attention for one new token per sequence: ``ô = (1/S) Σ_j c_j v_j`` (prop).

    q: ``[B, H, d]`` float16/bfloat16/float32.
    k_cache, v_cache: contiguous ``[B, L_max, H_kv, d]`` (``kv_layout="NHD"``; ``"HND"``:
        ``[B, H_kv, L_max, d]``), or paged ``[pages, page_size, H_kv, d]`` (HND:
        ``[pages, H_kv, page_size, d]``) with ``block_table`` int32 ``[B, max_pages]``: key j of
        sequence b is row ``j % page_size`` of page ``block_table[b, j // page_size]``
        (FlashInfer's convention). Same dtype as q, or both ``torch.float8_e4m3fn`` (fp8 caches, with
        k_scale / v_scale); H must be a multiple of H_kv (GQA).
    budget: S samples per head, 1 ≤ S ≤ 2**20. A sequence whose live keys S covers (``seq_lens[b] −
        starts[b] ≤ S``) is computed exactly, each live V row read once (count 1), as on every path
        (:mod:`santa.kernels.exact`).
    kernel: ``"prop"`` (exact global systematic sampling: S²ANTA-sys over the whole sequence, two
        launches), ``"flash"`` (``⌈S/T⌉`` systematic samples per tile of 128 keys, 64 for d > 128,
        then a FlashDecoding merge), ``"auto"`` (prop).
    seq_lens: int32 ``[B]``, keys visible per sequence (required when paged; default L_max).
        A sequence of length 0 gets a zero output.
    scale: score scale (default ``1/√d``).
    seed, offset: Philox key and counter (Python or numpy ints in [0, 2**63): a wrong type is a
        TypeError, out of range a ValueError; offset may be a one-element int64
        tensor on the device, read inside the kernel, so a captured CUDA graph can advance it per
        step). Uniforms are keyed on (seed, offset, sequence, head, tile): same inputs, seed and
        offset give bitwise-equal outputs; another offset gives fresh samples.
    out: optional ``[B, H, d]`` output in q's dtype. workspace: optional :class:`Workspace` from
        :func:`make_workspace` for exactly this shape and kernel; with both given, the call
        allocates nothing and can be captured in a CUDA graph (return_counts=False, check off).
    return_counts: also return per-key sample counts ``[B, H, n_max]`` int32 (tests, diagnostics).
        For prop, ``out = (1/S) Σ_j c_j v_j`` over them; for flash they are the per-tile counts.
    check: check the values of seq_lens and block_table on the host: always on CPU (it costs no
        synchronisation there) and in the torch fallback; on CUDA only with ``check=True``.
        Unchecked, the kernels still never read outside the cache for a bad value: a bad length or
        page id gives NaN for the sequences or heads it touches.
    k_scale, v_scale: an fp8 cache's dequantisation scales (its values are ``cache.float() * scale``),
        each a float or a float32 tensor ``[H_kv]`` (one per KV head) on the caches' device; default
        1.0, as vLLM's. Scores and sampling are computed in fp32 from the dequantised K, V rows are
        scaled as they are gathered: the counts are those of the same call on the dequantised caches,
        up to float32 rounding. Only for float8_e4m3fn caches (ValueError otherwise).
    head_offset: the global index of q's first head when q holds a slice of a model's heads (tensor
        parallelism: ``rank × H`` on a rank holding H heads and their H_kv KV heads), an int ≥ 0 (default 0),
        with ``positions`` only: the counter's head is ``head_offset + h``, so the ranks' slices draw exactly
        what one call with every head draws (:meth:`santa.kernels.DecodePlan.run`).
    error_target: a relative error ε > 0 (prop only; :mod:`santa.error_target`): each (sequence, head)
        draws ``S_r = min(budget, max(S₀, ⌈T̂ / (ε² N̂)⌉))`` samples, T̂ and ‖o‖² (N̂) estimated from a pilot of
        ``pilot`` systematic draws (int ≥ 2, default 16) on their own uniforms (stream 1); ``budget`` is
        the cap S_max (the launch's size, so graphs capture it). The counts then sum to each head's S_r.
    batch_invariant: a bool (default False). True: the same samples bit for bit alone or batched (a run shifted by
        ``starts`` keeps them too: the Triton prop cuts its tiles from each run's first key): the plan
        runs the Triton prop's two launches on every call (``tuning=santa.kernels.BATCH_INVARIANT``); on Hopper slower
        than the one launch it replaces, whose float32 CDF is summed in slices that follow the batch size and cache
        length. The torch fallback (the CPU without ``TRITON_INTERPRET=1``) is batch-invariant already: there it
        changes nothing.
    Returns out, or ``(out, counts)``. Non-finite input: see the module docstring.

    Under ``torch.compile`` the call is one custom op (:mod:`santa.kernels.ops`): see :func:`_decode_compiled`.
    """
    if unsupported:  # FlashInfer's soft-cap, LSE, RoPE modes …: refused by name (plan.UNSUPPORTED_KEYWORDS)
        refuse_unsupported("decode", unsupported)
    check_flag("batch_invariant", batch_invariant)
    if torch.compiler.is_compiling():
        return _decode_compiled(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, seed, offset,
                                out, workspace, return_counts, check, positions, starts, k_scale, v_scale, head_offset,
                                error_target, pilot, batch_invariant)
    check_seed_and_offset(seed, offset)
    call = _validated_call(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, offset, out,
                           return_counts, error_target, pilot, batch_invariant)
    head_offset = check_head_offset(head_offset, heads=q.shape[1], positional=positions is not None)
    if positions is not None or isinstance(seed, torch.Tensor):
        check_request_keys(seed, offset, positions, batch=q.shape[0], device=q.device,
                           check_values=bool(check or call.host_checks))
    if starts is not None:
        check_starts(starts, seq_lens, kernel=call.kernel, batch=q.shape[0], n_keys=call.n_keys, device=q.device,
                     check_values=bool(check or call.host_checks))
    if check is not None and not isinstance(check, bool):
        raise TypeError(f"check must be a bool or None, got {type(check).__name__}")
    # the torch fallback has no in-kernel guards, and on the CPU a check costs no synchronisation
    host_checks = bool(check or call.host_checks)
    if k_scale is None and v_scale is None and k_cache.dtype != FP8:
        k_scale = v_scale = 1.0
    else:
        k_scale, v_scale = checked_cache_scales(k_scale, v_scale, kv_dtype=k_cache.dtype, kv_heads=call.kv_heads,
                                                device=q.device, check_values=host_checks)
    if host_checks:
        check_tables(seq_lens, block_table, n_keys=call.n_keys, page_size=call.page_size, n_pages=k_cache.shape[0])
    if workspace is not None:
        check_workspace(workspace, call.workspace_key)
    if call.plan is None:
        return _decode_reference(q, k_cache, v_cache, call.budget, call.kernel, seq_lens, block_table, kv_layout, scale,
                                 seed, offset, out, return_counts, k_scale, v_scale, positions, starts, head_offset,
                                 call.error_target, call.pilot)
    counts = torch.zeros(q.shape[0], q.shape[1], call.n_keys, dtype=torch.int32, device=q.device) if return_counts else None
    out = call.plan.run_checked(q, k_cache, v_cache, seq_lens=seq_lens, block_table=block_table, seed=seed, offset=offset,
                                out=out, counts=counts, workspace=workspace, k_scale=k_scale, v_scale=v_scale,
                                positions=positions, starts=starts, head_offset=head_offset)  # validated above
    return (out, counts) if return_counts else out


def _decode_reference(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, seed, offset, out, return_counts,
                      k_scale, v_scale, positions, starts, head_offset=0, error_target=None, pilot=DEFAULT_PILOT):
    result, counts = torch_decode(kernel, q, k_cache, v_cache, budget, seq_lens=seq_lens, block_table=block_table,
                                  kv_layout=kv_layout, scale=scale, seed=seed, offset=offset, k_scale=k_scale, v_scale=v_scale,
                                  positions=positions, starts=starts, head_offset=head_offset, error_target=error_target,
                                  pilot=pilot)
    if out is not None:
        out.copy_(result)
        result = out
    return (result, counts) if return_counts else result


def _decode_compiled(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, seed, offset, out,
                     workspace, return_counts, check, positions, starts, k_scale, v_scale, head_offset=0,
                     error_target=None, pilot=DEFAULT_PILOT, batch_invariant=False):
    """:func:`decode` as torch.compile traces it: the checks that read no tensor values (the same
    errors as eager), then ``torch.ops.santa.decode`` (or ``decode_counts``), whose implementation is
    the eager call at execution time (its plan cached per call signature, with the plan's own
    workspace: a ``workspace`` given here is checked for its type only and not used). ``out`` is
    filled from the op's result. ``check=True`` (host reads of the tables) is refused: a compiled graph
    does not read tensor values on the host (on the CPU the op still checks them when it runs)."""
    check_seed_and_offset(seed, offset)
    _, k_cache, _, _, _, kv_heads = _validate(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale,
                                              offset, out, return_counts)
    head_offset = check_head_offset(head_offset, heads=q.shape[1], positional=positions is not None)
    k_scale, v_scale = checked_cache_scales(k_scale, v_scale, kv_dtype=k_cache.dtype, kv_heads=kv_heads, device=q.device,
                                            check_values=False)
    if positions is not None or isinstance(seed, torch.Tensor):
        check_request_keys(seed, offset, positions, batch=q.shape[0], device=q.device, check_values=False)
    if starts is not None:
        check_starts(starts, seq_lens, kernel="prop" if kernel == "auto" else kernel, batch=q.shape[0], n_keys=0, device=q.device,
                     check_values=False)
    if check is not None and not isinstance(check, bool):
        raise TypeError(f"check must be a bool or None, got {type(check).__name__}")
    if check:
        raise ValueError("check=True reads seq_lens and block_table on the host, which a compiled graph does not: "
                         "check them eagerly (the kernels never read outside the cache for a bad value)")
    if workspace is not None and not isinstance(workspace, Workspace):
        raise TypeError(f"workspace must be a santa.kernels.Workspace from make_workspace, got {type(workspace).__name__}")
    offset_tensor = offset if isinstance(offset, torch.Tensor) else None
    seeds = seed if isinstance(seed, torch.Tensor) else None
    args = (q, k_cache, v_cache, seq_lens, block_table, offset_tensor, seeds, positions, starts, int(budget), kernel, kv_layout,
            None if scale is None else float(scale), 0 if seeds is not None else int(seed),
            0 if offset_tensor is not None else int(offset))
    if k_cache.dtype == FP8:  # the scales as the op takes them: floats or float32 [H_kv] tensors
        args += tuple(None if isinstance(x, torch.Tensor) else x for x in (k_scale, v_scale))
        args += tuple(x if isinstance(x, torch.Tensor) else None for x in (k_scale, v_scale))
    error_target, pilot = checked_error_target(error_target, pilot, "prop" if kernel == "auto" else kernel)
    extra = dict(head_offset=head_offset) if head_offset else {}  # the ops' default: 0
    if error_target is not None:  # the ops' default: None (a fixed budget)
        extra.update(error_target=error_target, pilot=pilot)
    if batch_invariant:  # the ops' default: False (the plan's own choice of kernels)
        extra.update(batch_invariant=True)
    if return_counts:
        result, counts = torch.ops.santa.decode_counts(*args, **extra)
    else:
        result, counts = torch.ops.santa.decode(*args, **extra), None
    if out is not None:
        result = out.copy_(result)
    return (result, counts) if return_counts else result
