"""The decode kernels as torch custom ops, so that ``torch.compile(fullgraph=True)`` traces a model
that calls :func:`santa.decode` (and ``mode="reduce-overhead"`` captures it in a CUDA graph).

- ``torch.ops.santa.decode(q, k_cache, v_cache, seq_lens, block_table, offset_tensor, seeds,
  positions, starts, budget, kernel, kv_layout, scale, seed, offset, k_scale=None, v_scale=None,
  k_scale_tensor=None, v_scale_tensor=None, head_offset=0, error_target=None, pilot=16, batch_invariant=False) -> out``:
  one decode step, a new ``[B, H, d]`` tensor in q's dtype (contiguous).
- ``torch.ops.santa.decode_counts(...)`` (same arguments) ``-> (out, counts)``: also the per-key
  sample counts, int32 ``[B, H, n_keys]`` (statistics, tests).

The arguments are those of :func:`santa.decode`, tensors first: ``seq_lens``, ``block_table`` and
``offset_tensor`` may be None; ``offset_tensor``, a one-element int64 tensor on q's device, replaces
``offset`` when given (read inside the kernel, so a captured CUDA graph advances it per step; an int
offset that changes per step makes dynamo recompile once, then trace it as a SymInt, and CUDA graphs
record one graph per value); ``seeds`` (int64 ``[B]``, per-sequence keys) replaces ``seed`` when
given, ``positions`` (``[B]``) keys the draws on each query's position and ``starts`` (``[B]``)
gives each sequence's first key (:func:`santa.decode`);
``scale`` None means ``1/√d`` (else a finite float: NaN or ±inf is a ValueError naming it); seed and
offset are ints in ``[0, 2**63)`` (they fit the schema's int64). The caches may be float8_e4m3fn (as in
:func:`santa.decode`): their dequantisation scales are ``k_scale`` / ``v_scale`` (floats) or
``k_scale_tensor`` / ``v_scale_tensor`` (float32 ``[H_kv]`` on q's device), one of each pair at most,
1.0 when neither is given; other caches take none (ValueError). ``head_offset`` (default 0) is
:func:`santa.decode`'s (the global index of q's first head under tensor parallelism, with positions);
``error_target`` and ``pilot`` too (budgets from an error target, ``budget`` the cap; prop only), and
``batch_invariant`` (the Triton prop on every call: the same samples alone or batched).

The implementation is the eager :func:`santa.decode` at execution time: on CUDA (and on the CPU
under ``TRITON_INTERPRET=1``) a :class:`santa.kernels.DecodePlan`, cached per call signature
(shape, dtype, device, kernel, layout, budget, scale) with its own workspace, then ``plan.run``;
on the CPU otherwise the torch fallback (:func:`santa.kernels.plan.torch_decode`), which checks the
tables' values. The plan cache is consulted when the op *runs*, never while it is traced. Each run
takes a scratch workspace of its own (:meth:`Workspace.scratch`: uninitialised but its semaphores):
under CUDA graphs (``mode="reduce-overhead"``, whose cudagraph trees refuse an allocation that outlives
a captured call) the workspace and the output live in the graph's pool.

On Hopper the one-launch prop also serves the op. Its plan's schedule, arrival counters and exchange
buffers persist between calls, so the op makes a new plan on a helper thread (cudagraph trees route
the allocations of the thread that warms a graph up into their private pool, torch ≥ 2.8, not
another thread's) and keeps it for the process (:data:`_LENT`, at most :data:`_LENT_MAX` shapes: a
captured graph replays that state, and the trees drop graphs without telling the op); its calls lend
the plan's buffers to their scratch. Past :data:`_LENT_MAX` shapes, or for a plan first made inside
a capture, calls take the Triton prop, whose state is all in the scratch; so does a ``batch_invariant``
call, whose plan has no one launch and is not kept. The fake implementation
checks the call's shapes, dtypes and devices (what needs no tensor values) and returns the output's
metadata.
"""

import contextlib
import threading
from collections.abc import Callable

import torch
from torch import Tensor

from santa.attention import check_flag
from santa.error_target import DEFAULT_PILOT
from santa.kernels import eager as _decode
from santa.kernels.layout import BATCH_INVARIANT
from santa.kernels.plan import DecodePlan, Workspace, plan_decode

__all__ = ["decode", "decode_counts"]


def _cache_scales(k_scale, v_scale, k_scale_tensor, v_scale_tensor) -> tuple:
    """The ``k_scale`` and ``v_scale`` of :func:`santa.decode` (a float, a tensor or None) from the op's
    float and tensor arguments, of which one per cache at most."""
    scales = []
    for name, number, tensor in (("k_scale", k_scale, k_scale_tensor), ("v_scale", v_scale, v_scale_tensor)):
        if number is not None and tensor is not None:
            raise ValueError(f"pass {name} (one float) or {name}_tensor (float32 [H_kv]), not both")
        scales.append(number if tensor is None else tensor)
    return tuple(scales)


_LENT: dict[tuple, DecodePlan] = {}  # plan key → a plan whose one launch the op's calls run: kept for the process
_LENT_MAX = 8  # shapes at most (a plan's one-launch buffers: B·H·(16·slots + 8·S) bytes, 1 MB at Llama B = 16); past it: Triton


def _made_outside_graph_pools(make: Callable[[], object], device: torch.device) -> object:
    """``make()`` run on a helper thread, its device work finished before it returns: cudagraph trees route the
    allocations of the thread that warms a graph up into their private pool (torch ≥ 2.8), not another thread's.
    An exception ``make`` raises is raised here."""
    box = {}

    def work() -> None:
        try:
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                box["made"] = make()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)  # its zeroed buffers, before any stream of the caller reads them
        except BaseException as error:  # re-raised on the caller's thread
            box["error"] = error

    thread = threading.Thread(target=work, name="santa-plan")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["made"]


def _op_plan(key: tuple, shape: dict) -> DecodePlan:
    """A new plan for the op's call shape (:func:`santa.kernels.eager._plan_for`'s ``make_plan``): the one
    :data:`_LENT` keeps for it; else, on CUDA outside a capture while fewer than :data:`_LENT_MAX` are kept and its tuning
    allows a one launch, one made with its one launch's buffers on a helper thread (:func:`_made_outside_graph_pools`)
    and kept where it has a one launch; else :func:`plan_decode`'s, never kept and without a one launch (a
    ``batch_invariant`` call's plan, and past :data:`_LENT_MAX` one planned as ``BATCH_INVARIANT``: the Triton prop, its
    state all in the call's scratch)."""
    held = _LENT.get(key)
    if held is not None:
        return held
    device = torch.device(shape["device"])
    tuning = shape.get("tuning")
    if device.type != "cuda" or (tuning is not None and tuning.one_launch is False):
        return plan_decode(**shape)  # no one launch: the CPU, or a batch_invariant call
    if len(_LENT) >= _LENT_MAX:  # a one launch made on this thread during a graph's warm-up would leave its schedule and
        # counters in the graph's pool (main at 07db016): the Triton prop, its state all in the call's scratch
        return plan_decode(**dict(shape, tuning=BATCH_INVARIANT))
    if torch.cuda.is_current_stream_capturing():
        return plan_decode(**shape)  # plan_decode makes no one launch inside a capture

    def make() -> DecodePlan:
        plan = plan_decode(**shape)
        if plan.one_launch is not None:
            plan.one_launch.own_buffers()
        return plan

    plan = _made_outside_graph_pools(make, device)
    if plan.one_launch is not None:
        _LENT[key] = plan
    return plan


def _eager(q, k_cache, v_cache, seq_lens, block_table, offset_tensor, seeds, positions, starts, budget, kernel, kv_layout,
           scale, seed, offset, k_scale, v_scale, k_scale_tensor, v_scale_tensor, return_counts, head_offset=0,
           error_target=None, pilot=DEFAULT_PILOT, batch_invariant=False):
    """Both ops' implementation: the eager :func:`santa.decode` into a new contiguous output."""
    k_scale, v_scale = _cache_scales(k_scale, v_scale, k_scale_tensor, v_scale_tensor)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous whatever q's strides: as the fake
    offset = offset if offset_tensor is None else offset_tensor
    check_flag("batch_invariant", batch_invariant)
    call = _decode._validated_call(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout, scale, offset, out,
                                   return_counts, error_target, pilot, batch_invariant, make_plan=_op_plan)
    # this call's own scratch; a kept plan's one-launch buffers (made outside any graph pool) lent to it
    lent = call.plan is not None and _LENT.get(call.plan_key) is call.plan
    workspace = None if call.plan is None else Workspace.scratch(
        call.workspace_key, one_launch_buffers=call.plan.one_launch.own_buffers() if lent else None)
    return _decode.decode(q, k_cache, v_cache, budget, kernel=kernel, seq_lens=seq_lens, block_table=block_table,
                          kv_layout=kv_layout, scale=scale, seed=seed if seeds is None else seeds, offset=offset, out=out,
                          return_counts=return_counts, positions=positions, starts=starts, workspace=workspace,
                          k_scale=k_scale, v_scale=v_scale, head_offset=head_offset, error_target=error_target, pilot=pilot,
                          batch_invariant=batch_invariant)


def _fake(q, k_cache, v_cache, seq_lens, block_table, offset_tensor, budget, kernel, kv_layout, scale, offset,
          k_scale, v_scale, k_scale_tensor, v_scale_tensor, error_target=None, pilot=DEFAULT_PILOT):
    """The metadata checks of :func:`santa.decode` on fake tensors; returns n_keys."""
    k_scale, v_scale = _cache_scales(k_scale, v_scale, k_scale_tensor, v_scale_tensor)
    _decode.checked_error_target(error_target, pilot, "prop" if kernel == "auto" else kernel)
    _, k_cache, _, _, n_keys, kv_heads = _decode._validate(q, k_cache, v_cache, budget, kernel, seq_lens, block_table, kv_layout,
                                                           scale, offset if offset_tensor is None else offset_tensor, None, False)
    _decode.checked_cache_scales(k_scale, v_scale, kv_dtype=k_cache.dtype, kv_heads=kv_heads, device=q.device,
                                 check_values=False)
    return n_keys


@torch.library.custom_op("santa::decode", mutates_args=())
def decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    seq_lens: Tensor | None,
    block_table: Tensor | None,
    offset_tensor: Tensor | None,
    seeds: Tensor | None,
    positions: Tensor | None,
    starts: Tensor | None,
    budget: int,
    kernel: str,
    kv_layout: str,
    scale: float | None,
    seed: int,
    offset: int,
    k_scale: float | None = None,
    v_scale: float | None = None,
    k_scale_tensor: Tensor | None = None,
    v_scale_tensor: Tensor | None = None,
    head_offset: int = 0,
    error_target: float | None = None,
    pilot: int = DEFAULT_PILOT,
    batch_invariant: bool = False,
) -> Tensor:
    """One sampled-attention decode step (see :func:`santa.decode`): ``out [B, H, d]``."""
    return _eager(q, k_cache, v_cache, seq_lens, block_table, offset_tensor, seeds, positions, starts, budget, kernel,
                  kv_layout, scale, seed, offset, k_scale, v_scale, k_scale_tensor, v_scale_tensor, False, head_offset,
                  error_target, pilot, batch_invariant)


@decode.register_fake
def _decode_fake(q, k_cache, v_cache, seq_lens, block_table, offset_tensor, seeds, positions, starts, budget, kernel, kv_layout,
                 scale, seed, offset, k_scale=None, v_scale=None, k_scale_tensor=None, v_scale_tensor=None, head_offset=0,
                 error_target=None, pilot=DEFAULT_PILOT, batch_invariant=False):
    _fake(q, k_cache, v_cache, seq_lens, block_table, offset_tensor, budget, kernel, kv_layout, scale, offset, k_scale, v_scale,
          k_scale_tensor, v_scale_tensor, error_target, pilot)
    return q.new_empty(q.shape)


@torch.library.custom_op("santa::decode_counts", mutates_args=())
def decode_counts(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    seq_lens: Tensor | None,
    block_table: Tensor | None,
    offset_tensor: Tensor | None,
    seeds: Tensor | None,
    positions: Tensor | None,
    starts: Tensor | None,
    budget: int,
    kernel: str,
    kv_layout: str,
    scale: float | None,
    seed: int,
    offset: int,
    k_scale: float | None = None,
    v_scale: float | None = None,
    k_scale_tensor: Tensor | None = None,
    v_scale_tensor: Tensor | None = None,
    head_offset: int = 0,
    error_target: float | None = None,
    pilot: int = DEFAULT_PILOT,
    batch_invariant: bool = False,
) -> tuple[Tensor, Tensor]:
    """:func:`decode` and the per-key sample counts: ``(out [B, H, d], counts int32 [B, H, n_keys])``."""
    return _eager(q, k_cache, v_cache, seq_lens, block_table, offset_tensor, seeds, positions, starts, budget, kernel,
                  kv_layout, scale, seed, offset, k_scale, v_scale, k_scale_tensor, v_scale_tensor, True, head_offset,
                  error_target, pilot, batch_invariant)


@decode_counts.register_fake
def _decode_counts_fake(q, k_cache, v_cache, seq_lens, block_table, offset_tensor, seeds, positions, starts, budget, kernel,
                        kv_layout, scale, seed, offset, k_scale=None, v_scale=None, k_scale_tensor=None, v_scale_tensor=None,
                        head_offset=0, error_target=None, pilot=DEFAULT_PILOT, batch_invariant=False):
    n_keys = _fake(q, k_cache, v_cache, seq_lens, block_table, offset_tensor, budget, kernel, kv_layout, scale, offset, k_scale,
                   v_scale, k_scale_tensor, v_scale_tensor, error_target, pilot)
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[1], n_keys), dtype=torch.int32)
