"""Plan once, run per step: :func:`plan_decode` validates and freezes a decode call's shapes, layout,
budget and launch parameters and owns its typed :class:`Workspace`; :meth:`DecodePlan.run` checks the call's host
metadata and launches (no value read, no allocation, no host synchronisation: CUDA-graph capturable).

``run`` checks its tensors' kinds, dtypes, shapes and devices against the plan (:meth:`DecodePlan.check_call`:
host metadata, no values read, so nothing a CUDA graph replays) and the types and ranges of ``seed`` and
``offset``: a tensor of another shape never reaches a launch. Against bad *values* the kernels guard memory
on their own: a ``seq_lens`` entry outside ``[0, n_keys]`` is clamped for every read and the
sequence's output is NaN; a ``block_table`` page id outside ``[0, pages)`` is never followed and
the heads that would have read it get NaN.

On an sm_90 GPU a prop plan of bf16 (or fp16) q and bf16, fp16 or fp8 caches (contiguous NHD or HND, or paged NHD or HND)
runs in one cooperative CUDA launch (:mod:`santa.kernels.one_launch`, chosen when the plan is made:
:attr:`DecodePlan.one_launch`, None where the plan runs the Triton prop) wherever the call needs nothing it lacks (strides it cannot read, a workspace
without its buffers: :meth:`DecodePlan._one_launch_call`); other calls, and ``Tuning(one_launch=False)``, run the two
Triton launches. The two draw the same samples up to float32 CDF rounding. :meth:`DecodePlan.stages` lists the Triton
launches. A plan made while a CUDA graph is being captured runs the Triton prop (the one launch's buffers are made
outside captures).

Devices: a CUDA device (the compiled kernels) or the CPU. A CPU plan runs what :func:`santa.decode`
runs for CPU tensors: the kernels in Triton's interpreter under ``TRITON_INTERPRET=1``, else the
torch reference of the same estimator (same Philox uniforms), which checks the tables' values
(no synchronisation to save on the CPU) and raises ValueError naming a bad entry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import math
import numbers
import os
import sys
from dataclasses import dataclass, field

import torch

from santa.checks import integer
from santa.checks import scale as check_scale
from santa.error_target import DEFAULT_PILOT, check_error_target, check_pilot
from santa.kernels import _launch, one_launch, reference
from santa.kernels.layout import (
    ELEMENT_SIZE,
    TILE_SEARCHES,
    Tuning,
    WorkspaceKey,
    cdiv,
    flash_tile,
    next_pow2,
    prop_k_evict_first,
    workspace_nbytes,
    workspace_regions,
    workspace_strides,
)
from santa.kernels.reference import MAX_BUDGET, check_budget_for_kernels  # noqa: F401 (MAX_BUDGET: re-exported)
from santa.rng import MAX_COUNTER, MAX_SEED, check_seed

KERNELS = ("prop", "flash", "auto")
KV_LAYOUTS = ("NHD", "HND")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8 = torch.float8_e4m3fn  # the fp8 KV-cache dtype the kernels read (vLLM's "fp8" / "fp8_e4m3"), with scales
LOG2E = 1.4426950408889634
# triton is imported only when a kernel runs, so that importing santa never fixes Triton's mode
# (TRITON_INTERPRET is read when the kernels are defined)
HAVE_TRITON = importlib.util.find_spec("triton") is not None
# a jit function of each module the kernels use: Triton defines it for the interpreter or for the GPU
# when the module is imported (triton.language's own, e.g. tl.max, when triton is)
_KERNEL_FUNCTIONS = {"triton.language.standard": "max", "santa.kernels._common": "tile_scores",
                     "santa.kernels.prop": "_prop_scores_kernel", "santa.kernels.flash": "_flash_partial_kernel",
                     "santa.kernels.exact": "_exact_covered_kernel"}


@dataclass(frozen=True, eq=False)
class Workspace:
    """Scratch of one decode shape (``key``): a zeroed uint8 ``buffer`` and its typed ``views``.

    It serves one call at a time (it holds the stash and per-head semaphores that every call
    leaves at zero): give concurrent streams their own. It is refused for any other shape or kernel.
    ``one_launch``: the one-launch prop's exchange buffers where the workspace carries them
    (:meth:`within`); a call with a workspace without them runs the Triton prop.
    """

    key: WorkspaceKey
    buffer: torch.Tensor
    views: dict = field(repr=False)
    pointers: dict = field(repr=False)  # the kernels' argument names ("stash_ptr", …) → the regions' data_ptr()
    one_launch: one_launch.Buffers | None = field(default=None, repr=False)

    @classmethod
    def zeros(cls, key: WorkspaceKey) -> Workspace:
        return cls._over(key, torch.zeros(workspace_nbytes(key), dtype=torch.uint8, device=key.device))

    @classmethod
    def scratch(cls, key: WorkspaceKey, *, one_launch_buffers: one_launch.Buffers | None = None) -> Workspace:
        """A workspace for one call: uninitialised memory but the semaphores (zeroed), the one region a
        call reads before it writes. The custom op takes one per call (CUDA-graph trees refuse allocations
        that outlive a captured call); ``one_launch_buffers``: a kept plan's, lent to the call (:mod:`santa.kernels.ops`)."""
        workspace = cls._over(key, torch.empty(workspace_nbytes(key), dtype=torch.uint8, device=key.device))
        if "sem" in workspace.views:
            workspace.views["sem"].zero_()
        if one_launch_buffers is not None:
            workspace = dataclasses.replace(workspace, one_launch=one_launch_buffers)
        return workspace

    @classmethod
    def within(cls, key: WorkspaceKey, *, scratch: torch.Tensor, semaphores: torch.Tensor,
               one_launch_buffers: one_launch.Buffers | None = None) -> Workspace:
        """A workspace of views into buffers that several workspaces share: ``scratch`` (uint8, at least
        :func:`workspace_nbytes` bytes) and ``semaphores`` (int32, zeroed, at least B·H of them). A call
        leaves the semaphores at zero and reads nothing else it did not write in that call, so workspaces
        of several batch sizes (a serving engine's CUDA graphs, one per batch size) can share one scratch
        buffer sized for the largest, as long as their calls run one at a time (one stream). ``one_launch_buffers``
        (:class:`santa.kernels.one_launch.Buffers`, shareable the same way) let the one-launch prop serve its calls."""
        if not isinstance(scratch, torch.Tensor) or scratch.dtype != torch.uint8 or scratch.dim() != 1:
            raise TypeError("scratch must be a 1-D uint8 tensor")
        if not isinstance(semaphores, torch.Tensor) or semaphores.dtype != torch.int32 or semaphores.dim() != 1:
            raise TypeError("semaphores must be a 1-D int32 tensor (zeroed)")
        need = workspace_nbytes(key)
        if scratch.numel() < need or scratch.device != torch.device(key.device):
            raise ValueError(f"scratch must hold ≥ {need} bytes on {key.device} for {key.describe()}, got {scratch.numel()} on {scratch.device}")
        if scratch.data_ptr() % 16:  # the kernels are specialised on 16-byte aligned workspace pointers
            raise ValueError("scratch must start on a 16-byte boundary")
        workspace = cls._over(key, scratch[:need])
        if "sem" in workspace.views:
            rows = workspace.views["sem"].numel()
            if semaphores.numel() < rows or semaphores.device != scratch.device:
                raise ValueError(f"semaphores must hold ≥ {rows} int32 on {key.device}, got {semaphores.numel()} on {semaphores.device}")
            workspace.views["sem"] = semaphores[:rows]
            workspace.pointers["sem_ptr"] = semaphores.data_ptr()
        if one_launch_buffers is not None:
            if not isinstance(one_launch_buffers, one_launch.Buffers):
                raise TypeError(f"one_launch_buffers must be santa.kernels.one_launch.Buffers, got {type(one_launch_buffers).__name__}")
            workspace = dataclasses.replace(workspace, one_launch=one_launch_buffers)
        return workspace

    @classmethod
    def _over(cls, key: WorkspaceKey, buffer: torch.Tensor) -> Workspace:
        views = {}
        for name, dtype, shape, start in workspace_regions(key):
            nbytes = math.prod(shape) * ELEMENT_SIZE[dtype]
            views[name] = buffer[start : start + nbytes].view(dtype).view(shape)
        pointers = {f"{name}_ptr": view.data_ptr() for name, view in views.items()}
        return cls(key=key, buffer=buffer, views=views, pointers=pointers)

    def tensors(self) -> dict:
        """The regions by kernel argument name (``"stash_ptr"`` → the stash view)."""
        return {f"{name}_ptr": view for name, view in self.views.items()}

    @property
    def nbytes(self) -> int:
        return self.buffer.numel()


@dataclass(frozen=True)
class DecodeShape:
    """The frozen shape of a decode call (validated by :func:`plan_decode`)."""

    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    n_keys: int  # keys addressable per sequence: L_max, or max_pages · page_size
    page_size: int | None  # paged cache when set
    kv_layout: str
    dtype: torch.dtype  # q's and out's
    device: str
    kv_dtype: torch.dtype  # the caches': ``dtype``, or float8_e4m3fn (dequantised with k_scale / v_scale)


def _positive_int(name: str, value: object) -> int:
    return integer(name, value, low=1)


def resolve_device(device: object) -> torch.device:
    """``device`` as a torch.device the decode path supports (the CPU or an existing CUDA device), its
    CUDA index made explicit (``"cuda"`` → the current device) so that keys compare equal; else a
    ValueError (TypeError for neither a str nor a torch.device) naming ``device``."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device ('cpu', 'cuda', 'cuda:1'), got {type(device).__name__} {device!r}")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must be 'cpu' or a CUDA device ('cuda', 'cuda:1'), got {device!r}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise ValueError(f"device must be 'cpu' or a CUDA device, got {str(device)!r}: "
                         "the decode kernels run on CUDA, and on the CPU in torch (or Triton's interpreter)")
    if not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} but CUDA is not available (torch.cuda.is_available() is False): "
                         "use device='cpu' (the torch fallback, or the kernels under TRITON_INTERPRET=1)")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ValueError(f"device={str(device)!r} but this machine has {count} CUDA device(s): cuda:0 … cuda:{count - 1}")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def kernels_on_cpu() -> bool:
    """Whether the Triton kernels run for CPU tensors: under ``TRITON_INTERPRET=1``, unless triton or a
    kernel module was already imported without it (Triton reads the variable when it defines a jit
    function, so those are defined for the GPU); then, as without the variable, the torch reference
    of the same estimator runs."""
    if not HAVE_TRITON or os.environ.get("TRITON_INTERPRET") != "1":
        return False
    for module_name, function in _KERNEL_FUNCTIONS.items():
        module = sys.modules.get(module_name)
        kernel = getattr(module, function, None)
        if kernel is not None and type(kernel).__name__ != "InterpretedFunction":
            return False
    return True


def check_seed_and_offset(seed: object, offset: object) -> None:
    """The per-call Philox scalars: ints (numpy ints too) in ``[0, 2**63)``; seed may also be a tensor
    (per-sequence keys) and offset a tensor (whose dtype, size and device the caller checks). Wrong
    type: TypeError; out of range: ValueError."""
    if type(seed) is int and type(offset) is int and 0 <= seed < MAX_SEED and 0 <= offset < MAX_COUNTER:
        return  # the common case, without the slower ABC checks below
    if not isinstance(seed, torch.Tensor):
        check_seed(seed)  # santa.rng's one seed range
    if not isinstance(offset, torch.Tensor):
        if isinstance(offset, bool) or not isinstance(offset, numbers.Integral):
            raise TypeError(f"offset must be an int in [0, 2**63) or a one-element int64 tensor, got {type(offset).__name__} {offset!r}")
        integer("offset", offset, low=0, high=MAX_COUNTER)


MAX_HEAD_INDEX = 2**31  # the counter's head word: head_offset + h stays below it (a 32-bit kernel scalar)


def check_head_offset(head_offset: object, *, heads: int, positional: bool) -> int:
    """``head_offset`` as a Python int: the global index of the call's first query head (tensor parallelism:
    ``rank × H`` for a rank holding H of the model's heads; 0, the default, for a call with all of them). An int
    (numpy ints too) with ``0 ≤ head_offset`` and ``head_offset + H ≤ 2**31`` (TypeError for another type,
    ValueError for a bad value, naming it); a nonzero offset needs ``positional`` (request-keyed draws, counter
    ``(position, head_offset + h, stream)``): the batch-row counter ``(offset, b·H + h, stream)`` counts the call's
    own heads, so no offset makes it the model's (ValueError)."""
    if type(head_offset) is int and head_offset == 0:
        return 0  # the common case, without the slower checks below
    value = integer("head_offset", head_offset, low=0, high=MAX_HEAD_INDEX - heads + 1)
    if value and not positional:
        raise ValueError(f"head_offset={value} needs positions (request-keyed draws, counter (position, head_offset + h, "
                         "stream)): the batch-row counter (offset, b·H + h, stream) has no global head")
    return value


def check_tables(seq_lens, block_table, *, n_keys: int, page_size: int, n_pages: int) -> None:
    """Host checks of the values in seq_lens and block_table (they read the tensors: a sync on CUDA).

    Only the pages a sequence uses (``j < ⌈seq_len / page_size⌉``) must be ids in ``[0, n_pages)``;
    entries past them are never read and may hold anything (e.g. −1 padding).
    """
    if seq_lens is not None:
        lens = seq_lens.long()
        bad = (lens < 0) | (lens > n_keys)
        if bad.any():
            b = int(bad.nonzero()[0, 0])
            raise ValueError(f"seq_lens[{b}] = {int(lens[b])} must lie in [0, {n_keys}] (the keys the cache can address)")
    if block_table is not None and seq_lens is not None:
        used_pages = -(-lens // page_size)  # [B]
        used = torch.arange(block_table.shape[1], device=block_table.device) < used_pages.unsqueeze(1)
        ids = block_table.long()
        bad = used & ((ids < 0) | (ids >= n_pages))
        if bad.any():
            b, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"block_table[{b}, {j}] = {int(ids[b, j])} must be a page id in [0, {n_pages}) "
                             f"(sequence {b} uses its first {int(used_pages[b])} pages)")


def check_key_values(*, seed, positions, starts, seq_lens, n_keys: int) -> None:
    """Host checks of the per-sequence values of a call (they read the tensors: a sync on CUDA): a seed tensor's keys
    and the positions ≥ 0, each start in ``[0, seq_len]`` (``n_keys`` where seq_lens is None). ValueError naming the
    first bad entry."""
    for name, tensor in (("seed", seed), ("positions", positions)):
        if isinstance(tensor, torch.Tensor) and bool((tensor < 0).any()):
            b = int((tensor < 0).nonzero()[0, 0])
            raise ValueError(f"{name}[{b}] = {int(tensor[b])} must be ≥ 0" + (" (a key in [0, 2**63))" if name == "seed" else ""))
    if starts is not None:
        ends = torch.full_like(starts, n_keys) if seq_lens is None else seq_lens
        bad = (starts < 0) | (starts > ends)
        if bool(bad.any()):
            b = int(bad.nonzero()[0, 0])
            raise ValueError(f"starts[{b}] = {int(starts[b])} must lie in [0, {int(ends[b])}] (sequence {b}'s length)")


def checked_scale(name: str, value, *, fp8: bool, check_values: bool):
    """An fp8 cache's dequantisation scale as the kernels take it: a finite real > 0 (a float), or a float32 tensor
    ``[H_kv]`` (its type, shape and device checked by the caller) whose values are read only when ``check_values``;
    another cache's scale must be 1 (it has none: the kernels and the torch fallback would disagree on any other).
    TypeError / ValueError naming ``name``."""
    if isinstance(value, torch.Tensor):
        if not fp8:
            raise ValueError(f"{name} dequantises a float8_e4m3fn cache; this call's caches are not fp8: leave {name} at 1.0")
        if check_values and not bool(((value > 0) & value.isfinite()).all()):
            raise ValueError(f"{name} must hold finite scales > 0, got {value.tolist()}")
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float or a float32 tensor [H_kv], got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite scale > 0, got {value!r}")
    if not fp8 and value != 1:
        raise ValueError(f"{name} dequantises a float8_e4m3fn cache; this call's caches are not fp8: leave {name} at 1.0")
    return float(value)


def dequantised(cache: torch.Tensor, scale, kv_layout: str) -> torch.Tensor:
    """An fp8 cache as float32 values ``cache.float() * scale`` (scale: a float or a per-KV-head tensor);
    any other cache as it is."""
    if cache.dtype != FP8:
        return cache
    if isinstance(scale, torch.Tensor):
        head_axis = 2 if kv_layout == "NHD" else 1
        shape = [1, 1, 1, 1]
        shape[head_axis] = -1
        return cache.float() * scale.to(cache.device, torch.float32).reshape(shape)
    return cache.float() * float(scale)


def torch_decode(kernel: str, q, k_cache, v_cache, budget: int, *, seq_lens, block_table, kv_layout: str, scale,
                 seed, offset, k_scale=1.0, v_scale=1.0, positions=None, starts=None,
                 head_offset: int = 0, error_target: float | None = None,
                 pilot: int = DEFAULT_PILOT) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch fallback of a decode call: what the kernels compute, as ``(out in q's dtype, counts int32)``
    (fp8 caches dequantised first, as the kernels dequantise what they read). head_offset: checked by the caller
    (:func:`check_head_offset`). error_target, pilot: prop's budgets from an error target (``budget`` the cap)."""
    if isinstance(offset, torch.Tensor):
        offset = int(offset.item())
    k_cache, v_cache = dequantised(k_cache, k_scale, kv_layout), dequantised(v_cache, v_scale, kv_layout)
    seed = seed if isinstance(seed, torch.Tensor) else int(seed)
    kwargs = dict(seq_lens=seq_lens, block_table=block_table, kv_layout=kv_layout, scale=scale, seed=seed, offset=int(offset),
                  positions=positions, head_offset=head_offset)
    if kernel == "prop":
        result, counts = reference.prop_reference(q, k_cache, v_cache, budget, starts=starts, error_target=error_target,
                                                  pilot=pilot, **kwargs)
    else:
        result, counts = reference.flash_reference(q, k_cache, v_cache, budget, tile=flash_tile(q.shape[-1]), **kwargs)
    return result, counts.to(torch.int32)


# Keywords of FlashInfer's decode plan/run for features santa's decode does not implement: refused by name (a
# caller porting FlashInfer code learns what is missing, not that a keyword is unexpected). Passing one at its
# "off" value (None, False, 0, "NONE", -1 for window_left) is accepted: it asks for nothing santa lacks.
UNSUPPORTED_KEYWORDS = {
    "logits_soft_cap": "attention-logit soft-capping",
    "return_lse": "returning the log-sum-exp of the scores",
    "pos_encoding_mode": "positional encoding applied inside the kernel (apply RoPE to q and K before the call)",
    "rope_scale": "positional encoding applied inside the kernel",
    "rope_theta": "positional encoding applied inside the kernel",
    "window_left": "a sliding window (pass starts, a run of keys per sequence, with kernel='prop')",
    "sinks": "attention sinks",
}


def checked_error_target(error_target, pilot, kernel: str) -> tuple[float | None, int]:
    """``(ε or None, pilot)`` checked: ε a finite real > 0, pilot an int ≥ 2, and kernel prop (flash's
    per-tile budgets have no global pilot): TypeError / ValueError naming the argument."""
    if error_target is None:
        check_pilot(pilot, targeted=False)  # a pilot without a target would size nothing: refused, not ignored
        return None, DEFAULT_PILOT
    error_target, pilot = check_error_target(error_target), check_pilot(pilot)
    if kernel != "prop":
        raise ValueError(f"error_target is implemented by kernel='prop' (its pilot reads the global CDF), got kernel={kernel!r}")
    return error_target, pilot


def refuse_unsupported(where: str, keywords: dict) -> None:
    """Raise for any keyword in ``keywords``: ValueError naming the feature for :data:`UNSUPPORTED_KEYWORDS` set to
    something other than its off value, TypeError (as Python's own) for any other keyword."""
    for name, value in keywords.items():
        if name not in UNSUPPORTED_KEYWORDS:
            raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")
        if value is None or value is False or (name == "window_left" and value == -1) or value == 0 or value == "NONE":
            continue
        raise ValueError(f"santa's decode does not implement {UNSUPPORTED_KEYWORDS[name]}: {where}() got {name}={value!r}")


def checked_tuning(tuning: object) -> Tuning:
    """``tuning`` with its integer fields as Python ints, or raise naming the field (TypeError for a wrong
    type, ValueError for a bad value)."""
    tuning = Tuning() if tuning is None else tuning
    if not isinstance(tuning, Tuning):
        raise TypeError(f"tuning must be a santa.kernels.Tuning, got {type(tuning).__name__}")
    ints = {}
    for name, low, high in (("block_n", 16, 512), ("warps_pass1", 1, 16), ("warps_pass2", 1, 16),
                            ("samples_per_program", 1, 1024), ("pass1_programs", 1, 1 << 30)):
        value = getattr(tuning, name)
        if value is None:
            continue
        expected = f"Tuning.{name} must be None or a power of two in [{low}, {high}]"
        try:
            ints[name] = integer(f"Tuning.{name}", value, low=low, high=high + 1)
        except TypeError:
            raise TypeError(f"{expected}, got {type(value).__name__} {value!r}") from None
        except ValueError:
            raise ValueError(f"{expected}, got {int(value)}") from None
        if ints[name] & (ints[name] - 1):
            raise ValueError(f"{expected}, got {ints[name]}")
    if tuning.stages_pass1 is not None:
        try:
            ints["stages_pass1"] = integer("Tuning.stages_pass1", tuning.stages_pass1, low=1, high=5)
        except TypeError:
            raise TypeError(f"Tuning.stages_pass1 must be None or an int in [1, 4], got {tuning.stages_pass1!r}") from None
        except ValueError:
            raise ValueError(f"Tuning.stages_pass1 must be None or an int in [1, 4], got {int(tuning.stages_pass1)}") from None
    if tuning.tile_search not in (None, *TILE_SEARCHES):
        raise ValueError(f"Tuning.tile_search must be None or one of {TILE_SEARCHES}, got {tuning.tile_search!r}")
    for name in ("pdl", "k_evict_first", "discard_stash", "one_launch"):
        if getattr(tuning, name) is not None and not isinstance(getattr(tuning, name), bool):
            raise TypeError(f"Tuning.{name} must be None or a bool, got {getattr(tuning, name)!r}")
    return dataclasses.replace(tuning, **ints) if ints else tuning


def plan_decode(
    *,
    batch: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    n_keys: int,
    budget: int,
    dtype: torch.dtype,
    device: torch.device | str,
    kv_dtype: torch.dtype | None = None,
    kernel: str = "prop",
    kv_layout: str = "NHD",
    page_size: int | None = None,
    scale: float | None = None,
    tuning: Tuning | None = None,
    workspace: Workspace | None = None,
    error_target: float | None = None,
    pilot: int = DEFAULT_PILOT,
    **unsupported,
) -> DecodePlan:
    """Validate a decode shape once and freeze its launches.

    batch, heads, kv_heads, head_dim: ``q [B, H, d]``, caches with ``H_kv`` heads (H % H_kv == 0).
    n_keys: keys addressable per sequence: ``L_max`` of a contiguous cache, or
        ``max_pages · page_size`` of a paged one (``page_size`` set; ``n_keys`` a multiple of it).
    budget: S samples per head, 1 ≤ S ≤ 2**20. kernel: ``"prop"``, ``"flash"`` or ``"auto"`` (prop).
    kv_layout: ``"NHD"`` or ``"HND"``. scale: score scale (default ``1/√d``).
    dtype: q's (and the output's) dtype. kv_dtype: the caches' dtype: ``dtype`` (the default) or
        ``torch.float8_e4m3fn``, whose values ``run`` dequantises as ``cache.float() * scale`` with its
        ``k_scale`` / ``v_scale`` (scores and sampling in fp32 from the dequantised K; V rows scaled as
        they are gathered).
    device: ``"cpu"`` or a CUDA device (``"cuda"``, ``"cuda:1"``, a torch.device) of this machine. On the
        CPU, ``run`` does what :func:`santa.decode` does for CPU tensors (see the module docstring).
    tuning: prop's launch parameters. workspace: reuse one made for exactly this shape.
    error_target: a relative error ε > 0 (prop only): each (sequence, head) draws the samples its own
        distribution needs, ``S_r = min(budget, max(S₀, ⌈T̂ / (ε² N̂)⌉))`` from a pilot of ``pilot`` draws (int ≥ 2,
        default 16; :mod:`santa.error_target`), ``budget`` being the cap S_max that sizes the launches (a CUDA
        graph's launch never depends on S_r). Such a plan runs the Triton prop (not the one launch).
    Integer arguments take Python or numpy ints: a wrong type is a TypeError, a bad value (or an
    unsupported or absent device) a ValueError, each naming the argument.
    """
    refuse_unsupported("plan_decode", unsupported)
    batch, heads, kv_heads, head_dim, n_keys = (
        _positive_int(name, value)
        for name, value in (("batch", batch), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim), ("n_keys", n_keys))
    )
    if heads % kv_heads:
        raise ValueError(f"heads H={heads} must be a multiple of kv_heads H_kv={kv_heads}")
    budget = check_budget_for_kernels(budget)
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    kernel = "prop" if kernel == "auto" else kernel
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    if kv_dtype not in (dtype, FP8):
        raise TypeError(f"kv_dtype must be q's dtype ({dtype}) or torch.float8_e4m3fn, got {kv_dtype}"
                        + (" (float8_e5m2 caches are not supported: store K/V as float8_e4m3fn)" if kv_dtype == torch.float8_e5m2 else ""))
    if page_size is not None:
        page_size = _positive_int("page_size", page_size)
        if n_keys % page_size:
            raise ValueError(f"n_keys={n_keys} must be max_pages · page_size, a multiple of page_size={page_size}")
    check_scale(scale)
    error_target, pilot = checked_error_target(error_target, pilot, kernel)
    tuning = checked_tuning(tuning)
    device = resolve_device(device)
    shape = DecodeShape(batch, heads, kv_heads, head_dim, n_keys, page_size, kv_layout, dtype, str(device), kv_dtype)
    key = WorkspaceKey.of(kernel=kernel, batch=batch, heads=heads, head_dim=head_dim, n_keys=n_keys, budget=budget,
                          device=str(device), tuning=tuning)
    if workspace is not None:
        check_workspace(workspace, key)
    return DecodePlan(shape=shape, kernel=kernel, budget=budget, scale=1.0 / math.sqrt(head_dim) if scale is None else float(scale),
                      tuning=tuning, workspace_key=key, workspace=workspace, error_target=error_target, pilot=pilot)


def check_workspace(workspace: object, key: WorkspaceKey) -> Workspace:
    if not isinstance(workspace, Workspace):
        raise TypeError(f"workspace must be a santa.kernels.Workspace from make_workspace, got {type(workspace).__name__}")
    if workspace.key != key:
        raise ValueError(f"workspace was made for {workspace.key.describe()}; this call needs {key.describe()}: "
                         "make one with make_workspace for it")
    return workspace


class DecodePlan:
    """A validated decode shape with frozen launches; :meth:`run` checks seed and offset and launches the
    kernels (a CPU plan without the interpreter: the torch fallback).

    Tensor parallelism: a rank's plan is for its own heads (H/TP query and H_kv/TP KV heads); ``run``'s
    ``head_offset`` (``rank × H/TP``, a runtime scalar: one plan, one compiled kernel and one CUDA graph per rank,
    never respecialised) keys the draws on the model's global head, in the one-launch kernel as in the Triton ones."""

    def __init__(self, *, shape: DecodeShape, kernel: str, budget: int, scale: float, tuning: Tuning,
                 workspace_key: WorkspaceKey, workspace: Workspace | None, error_target: float | None = None,
                 pilot: int = DEFAULT_PILOT):
        self.shape, self.kernel, self.budget, self.scale = shape, kernel, budget, scale
        self.error_target, self.pilot = error_target, pilot  # budget is the cap when error_target is set
        self.tuning, self.workspace_key, self._workspace = tuning, workspace_key, workspace
        s = shape
        self.block_n = workspace_key.block_n  # keys per tile: the workspace is laid out for it
        self.group = s.heads // s.kv_heads
        self.tiles = cdiv(s.n_keys, self.block_n)
        self.block_d = max(16, next_pow2(s.head_dim))
        self.block_g = max(16, next_pow2(self.group))
        device = torch.device(s.device)
        # fp32 dots: fp32 inputs, the interpreter (its bf16 dot rounds), and flash budgets whose per-key
        # counts could pass 65535 (flash splits counts into bytes: the high byte is exact in bf16 up to 256)
        self.ieee_dot = s.dtype == torch.float32 or device.type != "cuda" or (kernel == "flash" and budget > 65535)
        # an fp8 K tile with a bf16 q: the score dot in float16 (e4m3 → f16 is one conversion per pair of elements,
        # → bf16 three more per element on the slow conversion path; q scaled by a power of two into f16, exactly).
        # The same scores; H200, 2026-12-02: prop fp8 32k 28.2 → 25.8 µs, B=32 × 32k 490.7 → 428.1 (RESULTS.md).
        # An f16 q reads K as f16 already; an fp32 q takes the fp32 dot.
        self.k_f16 = s.kv_dtype == FP8 and s.dtype == torch.bfloat16
        major = torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else 0  # 0: CPU / interpreter
        self.pdl = major >= 9 and tuning.pdl is not False
        self.cuda_index = device.index if device.type == "cuda" else None  # launches go to this device's current stream
        self.on_cpu = device.type == "cpu"  # run: the kernels in the interpreter, or the torch fallback (kernels_on_cpu)
        self.k_evict_first = False
        if kernel == "prop":  # the stash's size as the workspace lays it out: B·H rows of stride_stash fp32
            l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else None
            stash_bytes = s.batch * s.heads * workspace_strides(workspace_key)[0] * 4
            self.k_evict_first = prop_k_evict_first(stash_bytes, l2_bytes, tuning)
        # discard.global.L2 needs sm_80; the interpreter has no PTX
        self.discard_stash = kernel == "prop" and major >= 8 and tuning.discard_stash is not False
        self._launchers: dict[tuple, tuple] = {}
        self.one_launch = self._plan_one_launch(device)

    def _plan_one_launch(self, device: torch.device):
        """The one-launch CUDA prop for this plan (:mod:`santa.kernels.one_launch`: Hopper, bf16 or fp16, contiguous NHD or HND
        or paged NHD/HND), made now (its module and schedule, outside any CUDA graph), or None: the Triton prop serves every call
        (so also for a plan made during a capture, where its schedule cannot be copied to the device). Host-built
        rounds, except rounds that cut a group in at most 2 slices, a paged plan whose rounds pass one wave, and a plan
        none fits: the live schedule (below)."""
        s = self.shape
        if self.error_target is not None:
            return None  # the one launch draws a fixed budget; the Triton prop runs the pilot
        if self.tuning.one_launch is False or device.type != "cuda" or torch.cuda.is_current_stream_capturing() or not one_launch.eligible(
                device=device, kernel=self.kernel, dtype=s.dtype, kv_dtype=s.kv_dtype, kv_layout=s.kv_layout,
                page_size=s.page_size, head_dim=s.head_dim, group_size=self.group):
            return None
        launch = functools.partial(one_launch.OneLaunch, batch=s.batch, heads=s.heads, kv_heads=s.kv_heads,
                                   head_dim=s.head_dim, n_keys=s.n_keys, budget=self.budget, scale=self.scale,
                                   device=device, page_size=s.page_size, fp8=s.kv_dtype == FP8,
                                   f16=s.kv_dtype == torch.float16)
        try:
            host = launch()
        except ValueError:  # no plan fits shared memory (a large budget), or the module did not load (warned once)
            host = None
        if host is not None and host.plan.slots > 2 and (s.page_size is None or len(host.plan.rounds) == 1):
            return host
        # a paged plan's capacity is a server's max_model_len, its sequences mostly far shorter. Host-built rounds in
        # one wave already follow the live keys (each slice is a share of its sequence's length: Llama 1 × 8k 19.7 µs
        # against the live schedule's 23.7); rounds beyond one wave are sized by the capacity, so there the live
        # schedule (issue 39), which derives each launch's work from seq_lens, serves (H100, Llama 64 × 2k: 164 µs on
        # a 2k or a 128k plan, where the Triton prop takes 231 / 433; benchmarks/results/kernels.md). One wave of at most
        # 2 slices a group leaves each CTA half a group's output vectors or more, which the live kernel gathers from rows
        # it resolves once and sums in registers, and host-built rounds with three dependent loads per vector and sample
        # (Qwen 64 × 512 to 4k, C2: live 0.82-0.87× the rounds' time; with 8 slices or more the rounds are 1.16-1.47×
        # faster: paged_ab.py --rounds, H100, 2026-12-06, 27th session). A contiguous
        # plan (a static cache, its length often the prompt's plus the new tokens': tight) keeps host-built rounds of
        # more than 2 slices a group (on full sequences 5-9 % faster than the live schedule; on a cache 16× the live
        # keys 1.4-2.1× slower: contiguous_ab.py, H100), takes the live schedule where rounds cut a group in at most 2
        # slices, for the same reason as a paged plan (Qwen 64 / 256 × 512-4k: contiguous C2 or C1 rounds 1.09-1.83×
        # the paged live launch's time on the same keys, and the contiguous live launch 0.57-0.89× the rounds' (that
        # run's live schedule in staggered halves, since reverted): paged_ab.py, H100, 38th session), and where none
        # fits, instead of the Triton prop (Llama 64 × 2k: 163 against 220 µs)
        try:
            live = launch(live=True)
        except ValueError:  # more sequences or keys than a live launch takes: host-built rounds where they fit
            return host
        # a contiguous plan over 16k keys whose slices leave one CTA per SM: the live launch does not pay there, so its
        # host-built rounds where they fit (kept before the rule above moved 1-2-slice plans here), else the Triton prop
        pays = one_launch.live_pays(paged=s.page_size is not None, per_sm=live.per_sm, n=s.n_keys)
        return live if pays else host

    def _one_launch_call(self, q, k_cache, v_cache, seq_lens, out, counts, workspace, k_scale, v_scale, starts):
        """``(buffers, strides)`` of this call's one launch: the buffers it exchanges its words through (the workspace's,
        or the plan's own) and :func:`~santa.kernels.one_launch.cache_strides` of its caches; or None where the Triton
        prop runs it: the plan has no one launch, every sequence is covered statically, or the call
        needs what the one launch lacks (non-contiguous per-head scales, cache strides
        it cannot read, non-contiguous q, out,
        counts or unpaged caches, a workspace without one-launch buffers, or the plan's own buffers first needed inside a capture)."""
        # scales as floats or contiguous float32 [H_kv] (check_call checked them: 1.0 for a cache that is not fp8)
        scales_read = all(not isinstance(x, torch.Tensor) or x.is_contiguous() for x in (k_scale, v_scale))
        if (self.one_launch is None or not scales_read or not q.is_contiguous()
                or (out is not None and not out.is_contiguous()) or (counts is not None and not counts.is_contiguous())
                or (self.shape.page_size is None and not (k_cache.is_contiguous() and v_cache.is_contiguous()))
                or self._all_covered(seq_lens is not None, starts is not None)):
            return None
        strides = one_launch.cache_strides(k_cache, v_cache, self.shape.kv_layout)
        if strides is None:
            return None
        if workspace is None:
            buffers = self.one_launch.own_buffers()
        else:
            buffers = workspace.one_launch
            buffers = buffers if buffers is not None and self.one_launch.fits(buffers) else None
        return None if buffers is None else (buffers, strides)

    def check_call(self, q, k_cache, v_cache, *, seq_lens, block_table, out, counts, workspace, k_scale, v_scale, positions,
                   starts, seed, offset, head_offset, reads=None, enabled=None) -> int:
        """The checked ``head_offset`` of a call, after raising TypeError/ValueError naming the first argument that
        differs from what the plan's launches address: seed and offset (:func:`check_seed_and_offset`), head_offset
        (:func:`check_head_offset`), and every tensor's kind, dtype, shape and device. Host metadata only (no values
        read, no sync; nothing a CUDA graph replays). Tables (seq_lens, block_table, …) may be views into larger
        buffers (more rows or pages than the plan reads); q, out, counts and contiguous caches have exactly the
        plan's shape."""
        check_seed_and_offset(seed, offset)
        head_offset = check_head_offset(head_offset, heads=self.shape.heads, positional=positions is not None)
        s, device = self.shape, torch.device(self.shape.device)
        batch, heads, dim = s.batch, s.heads, s.head_dim

        def tensor(name: str, x: object, dtypes: tuple, doc: str) -> torch.Tensor:
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor {doc}, got {type(x).__name__}")
            if x.dtype not in dtypes:
                allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
                raise TypeError(f"{name} must be {allowed} {doc} for this plan, got {x.dtype}")
            if x.device != device:
                raise ValueError(f"{name} is on {x.device} but the plan is for {device}")
            return x

        doc = f"[B={batch}, H={heads}, d={dim}]"
        tensor("q", q, (s.dtype,), doc)
        if tuple(q.shape) != (batch, heads, dim) or q.stride(-1) != 1:
            raise ValueError(f"q must have the plan's shape {doc}, contiguous in d, got {tuple(q.shape)} strides {q.stride()}")
        if out is not None:
            tensor("out", out, (s.dtype,), doc)
            if tuple(out.shape) != (batch, heads, dim) or out.stride(-1) != 1:
                raise ValueError(f"out must have the plan's shape {doc}, contiguous in d, got {tuple(out.shape)}")
        paged = s.page_size is not None
        nhd = s.kv_layout == "NHD"
        if paged:
            doc = f"[pages, page_size={s.page_size}, H_kv={s.kv_heads}, d={dim}]" if nhd else \
                f"[pages, H_kv={s.kv_heads}, page_size={s.page_size}, d={dim}]"
        else:
            doc = f"[B={batch}, L={s.n_keys}, H_kv={s.kv_heads}, d={dim}]" if nhd else \
                f"[B={batch}, H_kv={s.kv_heads}, L={s.n_keys}, d={dim}]"
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            tensor(name, cache, (s.kv_dtype,), doc)
            shape = tuple(cache.shape)
            if len(shape) == 4:
                rows, positions_, heads_ = (shape[0], shape[1], shape[2]) if nhd else (shape[0], shape[2], shape[1])
                fits = heads_ == s.kv_heads and shape[3] == dim and (
                    rows >= 1 and positions_ == s.page_size if paged else rows == batch and positions_ == s.n_keys)
            else:
                fits = False
            if not fits or cache.stride(-1) != 1:
                raise ValueError(f"{name} must have shape {doc} ({s.kv_layout}, contiguous in d) for this plan, got {shape}")
        if paged:
            pages = s.n_keys // s.page_size
            if block_table is None:
                raise ValueError(f"block_table is required: the plan is for a paged cache (page_size={s.page_size})")
            tensor("block_table", block_table, (torch.int32,), f"[B={batch}, max_pages ≥ {pages}]")
            if block_table.dim() != 2 or block_table.shape[0] < batch or block_table.shape[1] < pages or block_table.stride(1) != 1:
                raise ValueError(f"block_table must be int32 [B ≥ {batch}, max_pages ≥ {pages}], contiguous along its pages, "
                                 f"got {tuple(block_table.shape)} strides {block_table.stride()}")
        elif block_table is not None:
            raise ValueError("block_table was given but the plan is for a contiguous cache: plan with page_size for a paged one")
        for name, x, dtypes in (("seq_lens", seq_lens, (torch.int32,)), ("starts", starts, (torch.int32,)),
                                ("positions", positions, (torch.int32, torch.int64)),
                                ("seed", seed if isinstance(seed, torch.Tensor) else None, (torch.int64,))):
            if x is not None:
                tensor(name, x, dtypes, f"[B={batch}]")
                if x.dim() != 1 or x.shape[0] < batch or (batch > 1 and x.stride(0) != 1):
                    raise ValueError(f"{name} must be a contiguous tensor of B ≥ {batch} entries, got {tuple(x.shape)}")
        if isinstance(offset, torch.Tensor):
            tensor("offset", offset, (torch.int64,), "[1]")
            if offset.numel() != 1:
                raise ValueError(f"offset as a tensor must hold one int64 element, got shape {tuple(offset.shape)}")
            if offset.device.type == "cpu" and not 0 <= int(offset.item()) < MAX_COUNTER:  # no sync to save on the CPU
                raise ValueError(f"offset must lie in [0, 2**63), got {int(offset.item())}")
        if counts is not None:
            tensor("counts", counts, (torch.int32,), f"[B={batch}, H={heads}, {s.n_keys}]")
            if tuple(counts.shape) != (batch, heads, s.n_keys) or counts.stride(-1) != 1 or counts.stride(0) != heads * counts.stride(1):
                raise ValueError(f"counts must be int32 [B={batch}, H={heads}, n_keys={s.n_keys}] with rows b·H + h, "
                                 f"got {tuple(counts.shape)} strides {counts.stride()}")
        if enabled is not None:
            tensor("enabled", enabled, (torch.int32,), "[1] (0: the call does nothing)")
            if enabled.numel() != 1:
                raise ValueError(f"enabled must hold one int32 element, got shape {tuple(enabled.shape)}")
            if self.kernel != "prop":
                raise ValueError(f"enabled gates prop's launches; this plan's kernel is {self.kernel!r} (plan with kernel='prop')")
            if out is None:
                raise ValueError("enabled needs out: a call whose gate is closed writes nothing, so it returns out as it was")
        if reads is not None:
            tensor("reads", reads, (torch.int32, torch.int64), f"[B={batch}, H={heads}]")
            if tuple(reads.shape) != (batch, heads):
                raise ValueError(f"reads must be int32 or int64 [B={batch}, H={heads}], got {tuple(reads.shape)}")
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if isinstance(scale, torch.Tensor):
                tensor(name, scale, (torch.float32,), f"[H_kv={s.kv_heads}]")
                if tuple(scale.shape) != (s.kv_heads,):
                    raise ValueError(f"{name} must be float32 [H_kv={s.kv_heads}], got {tuple(scale.shape)}")
            checked_scale(name, scale, fp8=s.kv_dtype == FP8, check_values=False)
        if workspace is not None:
            check_workspace(workspace, self.workspace_key)
        return head_offset

    @property
    def implementation(self) -> str:
        """Which kernels serve this plan's calls, chosen when it was made: ``"one launch, live schedule"`` (paged caches
        on sm_90), ``"one launch, host rounds C<slices>[s]"``, or ``"triton"`` (the portable path, and every call the
        one launch cannot take: :meth:`_one_launch_call`); ``"torch"`` for a CPU plan outside the interpreter."""
        if self.one_launch is not None:
            name = self.one_launch.plan.name
            return "one launch, live schedule" if name == "live" else f"one launch, host rounds {name}"
        return "triton" if not self.on_cpu or kernels_on_cpu() else "torch"

    @property
    def workspace(self) -> Workspace:
        """The plan's own workspace (made on first use unless one was given to :func:`plan_decode`)."""
        if self._workspace is None:
            self._workspace = Workspace.zeros(self.workspace_key)
        return self._workspace

    def _stage_launchers(self, *, has_seq_lens: bool, offset_in_memory: bool, return_counts: bool, k_scale_per_head: bool,
                         v_scale_per_head: bool, seed_per_sequence: bool, positional: bool, has_starts: bool,
                         gated: bool = False) -> tuple:
        flags = (has_seq_lens, offset_in_memory, return_counts, k_scale_per_head, v_scale_per_head, seed_per_sequence, positional,
                 has_starts, gated)
        stages = self._launchers.get(flags)
        if stages is None:
            stages = []
            if not self._all_covered(has_seq_lens, has_starts):
                if self.kernel == "prop":
                    from santa.kernels.prop import prop_launchers as make
                else:
                    from santa.kernels.flash import flash_launchers as make
                gate = dict(gated=True) if gated else {}  # check_call: only prop's plans take a gate
                stages = make(self, has_seq_lens=has_seq_lens, offset_in_memory=offset_in_memory, return_counts=return_counts,
                              k_scale_per_head=k_scale_per_head, v_scale_per_head=v_scale_per_head,
                              seed_per_sequence=seed_per_sequence, positional=positional, has_starts=has_starts, **gate)
            if self._some_covered(has_seq_lens, has_starts):
                if self.kernel == "flash" and has_starts:
                    raise ValueError("starts (keys visible from a later first key: left padding, windows) need kernel='prop': "
                                     "flash's per-tile budgets count the tiles from key 0")
                stages = [*stages, ("exact", self._exact_launcher(has_seq_lens=has_seq_lens, return_counts=return_counts,
                                                                    k_scale_per_head=k_scale_per_head,
                                                                    v_scale_per_head=v_scale_per_head, has_starts=has_starts,
                                                                    gated=gated))]
            self._launchers[flags] = stages
        return stages

    def _all_covered(self, has_seq_lens: bool, has_starts: bool) -> bool:
        """Every sequence of the call has all n_keys keys and the budget covers them: no sampled launch at all."""
        return not has_seq_lens and not has_starts and self.shape.n_keys <= self.budget

    def _some_covered(self, has_seq_lens: bool, has_starts: bool) -> bool:
        """Some sequence of the call may have ≤ S live keys (known only on the device): the Triton launches are followed
        by the covered-sequence launch (:mod:`santa.kernels.exact`), which also runs alone where S covers every
        sequence's n_keys; the one launch computes such a sequence itself. (The rule folded into prop's pass 2 measured
        8–33 % slower on batched shapes, H200 2026-12-04: a second launch costs ~2 µs instead.)"""
        return has_seq_lens or has_starts or self.shape.n_keys <= self.budget

    def _exact_launcher(self, **flags):
        from santa.kernels.exact import exact_launcher

        return exact_launcher(self, **flags)

    def _launchers_for(self, seq_lens, offset, counts, k_scale, v_scale, seed, positions, starts, enabled=None) -> tuple:
        return self._stage_launchers(
            has_seq_lens=seq_lens is not None, offset_in_memory=isinstance(offset, torch.Tensor), return_counts=counts is not None,
            k_scale_per_head=isinstance(k_scale, torch.Tensor), v_scale_per_head=isinstance(v_scale, torch.Tensor),
            seed_per_sequence=isinstance(seed, torch.Tensor), positional=positions is not None, has_starts=starts is not None,
            gated=enabled is not None,
        )

    def stages(self, q, k_cache, v_cache, *, seq_lens=None, block_table=None, seed: int = 0, offset=0, out=None,
               counts=None, workspace: Workspace | None = None, k_scale=1.0, v_scale=1.0, positions=None, starts=None,
               head_offset: int = 0) -> list:
        """The call's launches as ``[(name, zero-argument callable)]`` in order (benchmarks time them one by one).
        A CPU plan has launches only under Triton's interpreter (:func:`kernels_on_cpu`), else a ValueError."""
        if self.on_cpu and not kernels_on_cpu():
            raise ValueError("stages() times the Triton kernels: this CPU plan runs the torch fallback "
                             "(plan for a CUDA device, or set TRITON_INTERPRET=1 before the kernels are imported)")
        head_offset = self.check_call(q, k_cache, v_cache, seq_lens=seq_lens, block_table=block_table, out=out, counts=counts,
                                      workspace=workspace, k_scale=k_scale, v_scale=v_scale, positions=positions, starts=starts,
                                      seed=seed, offset=offset, head_offset=head_offset)
        out = torch.empty_like(q) if out is None else out
        launchers = self._launchers_for(seq_lens, offset, counts, k_scale, v_scale, seed, positions, starts)
        key, args, tensors = self._arguments(q, k_cache, v_cache, seq_lens, block_table, seed, offset, out, counts, workspace,
                                             k_scale, v_scale, positions, starts, head_offset)

        def launch(launcher):
            with _on_device(self.cuda_index):
                launcher(key, args, tensors, _launch.current_stream(self.cuda_index))

        return [(name, lambda launcher=launcher: launch(launcher)) for name, launcher in launchers]

    def _arguments(self, q, k_cache, v_cache, seq_lens, block_table, seed, offset, out, counts, workspace, k_scale,
                   v_scale, positions=None, starts=None, head_offset: int = 0, enabled=None) -> tuple:
        """(key, args, tensors) of one call: the launches' varying arguments by kernel name, pointers
        as ints (one dict for every launch of the plan); ``key``, everything Triton's specialisation
        of them can depend on that may change between calls of one plan (pointer alignment, strides,
        the pool size, 32- or 64-bit Philox words; the workspace is 256-byte aligned, its strides
        fixed by its key); ``tensors()``, the pointer arguments as tensors, for the JIT's first call.
        A scale is a float (passed as the scalar) or a per-KV-head float32 tensor (passed as a pointer);
        so is the seed (an int, or an int64 tensor ``[B]`` of per-sequence keys); positions, a tensor or None;
        head_offset, a plain int scalar like seed (not in the key: the kernels take it unspecialised, so every
        tensor-parallel rank runs one compiled kernel, and a captured graph holds its rank's value)."""
        ws = self.workspace if workspace is None else workspace
        q_ptr, k_ptr, v_ptr, out_ptr = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr()
        q_strides, out_strides, k_strides, v_strides = q.stride(), out.stride(), k_cache.stride(), v_cache.stride()
        seq_lens_ptr = q_ptr if seq_lens is None else seq_lens.data_ptr()
        bt_ptr, stride_bt = (q_ptr, 0) if block_table is None else (block_table.data_ptr(), block_table.stride(0))
        counts_ptr, stride_counts = (q_ptr, 0) if counts is None else (counts.data_ptr(), counts.stride(1))
        offset_tensor = offset if isinstance(offset, torch.Tensor) else None
        offset_ptr, offset = (q_ptr, int(offset)) if offset_tensor is None else (offset_tensor.data_ptr(), 0)
        k_scale_tensor = k_scale if isinstance(k_scale, torch.Tensor) else None
        v_scale_tensor = v_scale if isinstance(v_scale, torch.Tensor) else None
        k_scale_ptr, k_scale = (q_ptr, float(k_scale)) if k_scale_tensor is None else (k_scale_tensor.data_ptr(), 1.0)
        v_scale_ptr, v_scale = (q_ptr, float(v_scale)) if v_scale_tensor is None else (v_scale_tensor.data_ptr(), 1.0)
        seeds_tensor = seed if isinstance(seed, torch.Tensor) else None
        seeds_ptr, seed = (q_ptr, int(seed)) if seeds_tensor is None else (seeds_tensor.data_ptr(), 0)
        positions_ptr = q_ptr if positions is None else positions.data_ptr()
        starts_ptr = q_ptr if starts is None else starts.data_ptr()
        row_budgets = self._row_budgets(ws)
        budgets_ptr = q_ptr if row_budgets is None else row_budgets.data_ptr()
        enabled_ptr = q_ptr if enabled is None else enabled.data_ptr()
        n_pages = k_cache.shape[0]
        kb, kn, kh = (k_strides[0], k_strides[1], k_strides[2]) if self.shape.kv_layout == "NHD" else (k_strides[0], k_strides[2], k_strides[1])
        vb, vn, vh = (v_strides[0], v_strides[1], v_strides[2]) if self.shape.kv_layout == "NHD" else (v_strides[0], v_strides[2], v_strides[1])
        key = (
            q_ptr & 15, k_ptr & 15, v_ptr & 15, out_ptr & 15, seq_lens_ptr & 15, bt_ptr & 15, counts_ptr & 15, offset_ptr & 15,
            k_scale_ptr & 15, v_scale_ptr & 15, seeds_ptr & 15, positions_ptr & 15, starts_ptr & 15, enabled_ptr & 15,
            None if positions is None else positions.dtype, q_strides, out_strides, k_strides, v_strides, stride_bt, stride_counts, n_pages,
            seed < 2**31, offset < 2**31,
        )
        args = dict(
            ws.pointers, q_ptr=q_ptr, k_ptr=k_ptr, v_ptr=v_ptr, out_ptr=out_ptr, seq_lens_ptr=seq_lens_ptr, bt_ptr=bt_ptr,
            counts_ptr=counts_ptr, offset_ptr=offset_ptr, k_scale_ptr=k_scale_ptr, v_scale_ptr=v_scale_ptr,
            seeds_ptr=seeds_ptr, positions_ptr=positions_ptr, starts_ptr=starts_ptr, budgets_ptr=budgets_ptr,
            enabled_ptr=enabled_ptr, seed=seed,
            offset=offset, head_offset=head_offset, n_pages=n_pages, k_scale=k_scale, v_scale=v_scale,
            stride_qb=q_strides[0], stride_qh=q_strides[1], stride_ob=out_strides[0], stride_oh=out_strides[1],
            stride_kb=kb, stride_kn=kn, stride_kh=kh, stride_vb=vb, stride_vn=vn, stride_vh=vh,
            stride_bt=stride_bt, stride_counts=stride_counts,
        )

        def tensors() -> dict:
            given = dict(q_ptr=q, k_ptr=k_cache, v_ptr=v_cache, out_ptr=out, seq_lens_ptr=seq_lens, bt_ptr=block_table,
                         counts_ptr=counts, offset_ptr=offset_tensor, k_scale_ptr=k_scale_tensor, v_scale_ptr=v_scale_tensor,
                         seeds_ptr=seeds_tensor, positions_ptr=positions, starts_ptr=starts, budgets_ptr=row_budgets,
                         enabled_ptr=enabled)
            return {**ws.tensors(), **{name: (q if x is None else x) for name, x in given.items()}}

        return key, args, tensors

    def run(self, q, k_cache, v_cache, *, seq_lens=None, block_table=None, seed: int = 0, offset=0, out=None, counts=None,
            workspace: Workspace | None = None, k_scale=1.0, v_scale=1.0, positions=None, starts=None,
            head_offset: int = 0, reads=None, enabled=None) -> torch.Tensor:
        """One decode step: ``out [B, H, d]`` (allocated when not given; pass it for graph capture).

        q ``[B, H, d]``; caches in the planned layout and ``kv_dtype`` (paged: ``block_table`` int32
        ``[B, max_pages]``); seq_lens int32 ``[B]`` (default: every sequence holds n_keys keys); seed,
        offset: Philox key and counter (offset may be a one-element int64 device tensor); counts: an
        int32 ``[B, H, n_keys]`` zero tensor to receive per-key sample counts; workspace: one made for
        this plan's shape (default: the plan's own); k_scale, v_scale: an fp8 cache's dequantisation
        scales, each a float or a float32 tensor ``[H_kv]`` on the device (1.0 for other caches);
        seed may also be an int64 tensor ``[B]`` (one Philox key per sequence) and ``positions`` an
        int32/int64 tensor ``[B]``, each query's position in its own sequence, which then replaces the
        offset and the batch row in the counter (request-keyed draws: :mod:`santa.rng`); ``starts``
        (int32 ``[B]``, prop only): sequence b's keys are ``[starts[b], seq_lens[b])`` (left padding,
        a window); ``head_offset`` (an int ≥ 0, with positions only; default 0): the global index of q's first head
        when the call holds a slice of the model's heads (a tensor-parallel rank: ``rank × H``), added to the
        counter's head, so that every split draws what one call with all the heads draws (:func:`check_head_offset`;
        the one launch and the Triton prop both take it); ``reads`` (an int32/int64 ``[B, H]`` tensor on the device): each
        (sequence, head)'s value rows this call reads are added to it — its live keys where the budget covers them (each
        read once), else S, or with an error target the pilot's draws plus the row's own budget S_r, at most its live
        keys — on the device, so a captured graph keeps counting (santa.model sums them over layers and steps); ``enabled``
        (prop plans; an int32 ``[1]`` tensor on the device, read by the kernels, with ``out`` given): a gate — where it holds
        0 the call does nothing (out, counts, reads and the workspace are left as they were, no K or V row is read), so
        an engine can capture santa beside a dense kernel in one CUDA graph and pick one of them per replay by writing
        the int (santa.vllm: short steps run FlashAttention). Every tensor's kind, dtype, shape and device is checked against the plan
        (:meth:`check_call`), seed and offset's types and ranges too (TypeError for a wrong type, ValueError
        for a bad shape, device or range); tensor values are not read. A sequence whose live keys the budget
        covers (``seq_lens[b] − starts[b] ≤ S``) is computed exactly, its live V rows read once
        (:mod:`santa.kernels.exact`). The kernels run on the plan's device (its current stream), whichever device
        is current. A CPU plan runs the torch fallback unless :func:`kernels_on_cpu`
        (TRITON_INTERPRET=1): as :func:`santa.decode` on the CPU, it then checks seq_lens and
        block_table (ValueError naming a bad entry).
        """
        head_offset = self.check_call(q, k_cache, v_cache, seq_lens=seq_lens, block_table=block_table, out=out, counts=counts,
                                      workspace=workspace, k_scale=k_scale, v_scale=v_scale, positions=positions, starts=starts,
                                      seed=seed, offset=offset, head_offset=head_offset, reads=reads, enabled=enabled)
        return self.run_checked(q, k_cache, v_cache, seq_lens=seq_lens, block_table=block_table, seed=seed, offset=offset,
                                out=out, counts=counts, workspace=workspace, k_scale=k_scale, v_scale=v_scale,
                                positions=positions, starts=starts, head_offset=head_offset, reads=reads, enabled=enabled)

    def run_checked(self, q, k_cache, v_cache, *, seq_lens, block_table, seed, offset, out, counts, workspace, k_scale,
                    v_scale, positions, starts, head_offset: int, reads=None, enabled=None) -> torch.Tensor:
        """:meth:`run` without its checks, for a caller that has validated the call against this plan's shape
        (:func:`santa.decode`, whose validation is cached per call signature): no check is done twice per step."""
        if self.on_cpu and not kernels_on_cpu():
            if enabled is not None and int(enabled.item()) == 0:  # the CPU: nothing to save by not reading it
                return out
            return self._run_torch(q, k_cache, v_cache, seq_lens, block_table, seed, offset, out, counts, k_scale, v_scale,
                                   positions, starts, head_offset, reads)
        index = self.cuda_index
        if index is not None and torch.cuda.current_device() != index:
            with torch.cuda.device(index):
                return self.run_checked(q, k_cache, v_cache, seq_lens=seq_lens, block_table=block_table, seed=seed,
                                        offset=offset, out=out, counts=counts, workspace=workspace, k_scale=k_scale,
                                        v_scale=v_scale, positions=positions, starts=starts, head_offset=head_offset,
                                        reads=reads, enabled=enabled)
        if out is None:
            out = torch.empty_like(q)
        one_launch_call = self._one_launch_call(q, k_cache, v_cache, seq_lens, out, counts, workspace, k_scale, v_scale, starts)
        if one_launch_call is not None:
            buffers, strides = one_launch_call
            # the one launch computes the sequences the budget covers exactly itself (one_launch.cu)
            out = self.one_launch.run(q, k_cache, v_cache, out=out, strides=strides, seq_lens=seq_lens, starts=starts,
                                      block_table=block_table, seed=seed, offset=offset,
                                      positions=positions, head_offset=head_offset, counts=counts, buffers=buffers,
                                      k_scale=k_scale, v_scale=v_scale, enabled=enabled)
        else:
            launchers = self._launchers_for(seq_lens, offset, counts, k_scale, v_scale, seed, positions, starts, enabled)
            key, args, tensors = self._arguments(q, k_cache, v_cache, seq_lens, block_table, seed, offset, out, counts, workspace,
                                                 k_scale, v_scale, positions, starts, head_offset, enabled)
            stream = _launch.current_stream(index)
            for _, launcher in launchers:
                launcher(key, args, tensors, stream)
        if reads is not None:
            self._add_reads(reads, seq_lens, starts, self._row_budgets(workspace), enabled)
        return out

    def _row_budgets(self, workspace: Workspace | None) -> torch.Tensor | None:
        """An error target's budgets S_r, int32 ``[B·H]``, in the call's workspace (the plan's own where the call brings
        none): pass 2 writes them, the call's reads counts from them. None without an error target."""
        if self.error_target is None or self.kernel != "prop":
            return None
        return (self.workspace if workspace is None else workspace).views["budgets"]

    def _add_reads(self, reads: torch.Tensor, seq_lens, starts, row_budgets: torch.Tensor | None, enabled=None) -> None:
        """``reads [B, H] +=`` each row's value rows read by the call just made (device ops, no host sync): its live keys
        ``n_live = seq_lens[b] − starts[b]`` (clamped to [0, n_keys]) where the budget covers them, else its draws — S,
        or with an error target ``pilot + S_r`` (``row_budgets``: S_r per row ``b·H + h``) — but never more than
        ``n_live`` (draws past them repeat rows); none where the call's gate (``enabled``) was closed."""
        s = self.shape
        live = (torch.full((s.batch,), s.n_keys, dtype=torch.int64, device=reads.device) if seq_lens is None
                else seq_lens[: s.batch].long())
        if starts is not None:
            live = live - starts[: s.batch].long()
        live = live.clamp(0, s.n_keys)[:, None]  # [B, 1]
        if row_budgets is None:  # min(S, n_live): a covered sequence's live keys, else S
            read = live.clamp(max=self.budget)
        else:
            drawn = row_budgets.view(s.batch, s.heads).long() + self.pilot
            read = torch.where(live <= self.budget, live, torch.minimum(drawn, live))
        if enabled is not None:
            read = read * (enabled != 0)
        reads.add_(read.to(reads.dtype))

    def _run_torch(self, q, k_cache, v_cache, seq_lens, block_table, seed, offset, out, counts, k_scale, v_scale,
                   positions, starts, head_offset: int = 0, reads=None) -> torch.Tensor:
        """The CPU fallback: the torch reference of the plan's kernel, written into ``out`` (and ``counts``, ``reads``),
        after checking the values the kernels guard on the device (seq_lens, pages, starts, keys, positions, scales: on
        the CPU a check costs no sync). Tables with more rows than the plan's B are read in their first B."""
        batch = self.shape.batch
        seq_lens, block_table, positions, starts = (None if x is None else x[:batch] for x in (seq_lens, block_table, positions, starts))
        seed = seed[:batch] if isinstance(seed, torch.Tensor) else seed
        if block_table is not None and seq_lens is None:  # every sequence holds n_keys keys: every page is read
            seq_lens = torch.full((batch,), self.shape.n_keys, dtype=torch.int32)
        check_tables(seq_lens, block_table, n_keys=self.shape.n_keys, page_size=self.shape.page_size or 1,
                     n_pages=k_cache.shape[0])
        check_key_values(seed=seed, positions=positions, starts=starts, seq_lens=seq_lens, n_keys=self.shape.n_keys)
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            checked_scale(name, scale, fp8=self.shape.kv_dtype == FP8, check_values=True)
        result, sampled = torch_decode(self.kernel, q, k_cache, v_cache, self.budget, seq_lens=seq_lens,
                                       block_table=block_table, kv_layout=self.shape.kv_layout, scale=self.scale,
                                       seed=seed, offset=offset, k_scale=k_scale, v_scale=v_scale, positions=positions,
                                       starts=starts, head_offset=head_offset, error_target=self.error_target,
                                       pilot=self.pilot)
        if counts is not None:
            counts.copy_(sampled)
        if reads is not None:  # an error target's S_r: its draw's counts (the pilot's are not among them)
            self._add_reads(reads, seq_lens, starts, None if self.error_target is None else sampled.sum(-1).flatten())
        if out is None:
            return result
        return out.copy_(result)


def _on_device(index: int | None):
    """A context that makes CUDA device ``index`` current (nothing for None)."""
    return contextlib.nullcontext() if index is None else torch.cuda.device(index)
