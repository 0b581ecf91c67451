"""prop in one cooperative CUDA launch on Hopper (issue 24): ``one_launch.cu``'s ``prop1_*`` kernels, their plan and launch.

The same estimator as the Triton prop (:mod:`santa.kernels.prop`, exact global systematic sampling: the same samples for
the same uniforms, up to float32 CDF rounding), in one launch instead of two: a persistent grid of two CTAs per SM,
each streaming one slice of one group's keys (group = sequence, KV head) with its scores kept in shared memory (no
stash), the group's slices exchanging their statistics and sampled keys through tagged words, each placing the comb
points that fall in its slice and gathering the V rows of the output vectors it owns. Measured on the H200 against the
two-launch prop in the same call: 1.02–1.15× faster kernels, 1.02–1.06× faster decode steps (benchmarks/RESULTS.md).

What it serves (:func:`eligible`): sm_90 devices, bf16 q with bf16 or fp8 (e4m3, with per-tensor or per-KV-head scales)
caches or fp16 q with fp16 caches, contiguous caches in NHD or HND (transformers' static cache) or paged ones in NHD or HND
(pages of a power of two keys; any page, row and head strides that are multiples of 8 elements: santa's own pages and
vLLM's packed K|V rows, :func:`cache_strides`), (head dim, query heads per KV head) in :data:`SHAPES`, where a plan fits shared
memory. Per-sequence lengths, first keys (``starts``: left padding, windows) and block tables are read
on the device (graph-safe); a length outside ``[0, n_keys]`` or a first key outside ``[0, length]`` is clamped and gives
NaN, as do NaN or +inf scores and a page id outside the pool (never followed); every seed, offset, positions and head-offset form of the Triton kernels
is drawn the same way. The slices a sequence is
cut into follow the plan (batch size, cache length), and so does the float32 order of its CDF: a comb point within
rounding of a CDF step may land on the other key when they change (the Triton prop's tiles do not depend on them).

The kernels ship compiled (``one_launch.fatbin``: sm_90a SASS, the code the benchmarks time, compressed: 1.1 MB for 96
kernels against 8.8 MB uncompressed, the driver inflating it when it loads the module; no PTX, which only an sm_90 device
could run and there the SASS loads), built from
``one_launch.cu`` by :func:`build_module` where nvcc is installed (``python -c "from santa.kernels.one_launch import
build_module; build_module()"``); ``one_launch.build`` records the source's SHA-256, which a CPU test checks. So no
compiler is needed on the user's machine, and nothing is compiled at run time (the PTX alone, compiled by the driver,
measured 3–4 µs slower on Qwen2.5-0.5B's B = 16 × 32k shape). A driver that cannot load the module (one older than
CUDA 13, which built it) makes every plan take the Triton prop, with one warning.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import math
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from santa.kernels.one_launch_schedule import build_schedule, schedule_table

SOURCE = Path(__file__).with_name("one_launch.cu")
MODULE = Path(__file__).with_name("one_launch.fatbin")
BUILD_RECORD = Path(__file__).with_name("one_launch.build")
NVCC_FLAGS = ("-O3", "-fatbin", "-gencode", "arch=compute_90a,code=sm_90a", "-Xfatbin", "-compress-all")
THREADS = 256
FP8 = torch.float8_e4m3fn  # the fp8 cache dtype (santa.kernels.plan.FP8)
SHARED_LIMIT = 227 * 1024  # dynamic shared memory one CTA may take on sm_90
# (head dim, G) with prop1_* kernels: d = 64 and 128 at G = 1 to 8 (one_launch.cu names the models)
SHAPES = {(dim, g) for dim in (64, 128) for g in range(1, 9)}
MAX_ONE_WAVE_SLICES = 66  # more slices per group than this measured slower (Qwen 32k: 132 slices 17.8 µs, 66 15.9)
ROUNDS_SLICE_KEYS = {128: 4096, 64: 2048}  # keys per slice where groups run in rounds (the measured best, see choose_plan)
# at d = 128 a group in rounds takes at most 8 slices; up to this many keys it takes 8 slices of more than 4,096 keys rather
# than the two launches (a server's max_model_len past 32k: 32k prompts + 256 output tokens = 33,024; see choose_plan)
EIGHT_SLICES_UP_TO = 8 * 4608


def source_digest(source: Path = SOURCE) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def build_record(digest: str) -> str:
    return f"one_launch.fatbin from one_launch.cu sha256 {digest}\nnvcc {' '.join(NVCC_FLAGS)}\n"


def build_module(nvcc: str = "nvcc") -> Path:
    """Rebuild ``one_launch.fatbin`` from ``one_launch.cu`` (nvcc 13) and record the source's hash in ``one_launch.build``."""
    subprocess.run([nvcc, *NVCC_FLAGS, "-o", str(MODULE), str(SOURCE)], check=True)
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    BUILD_RECORD.write_text(build_record(source_digest()) + f"{version}\n")
    return MODULE


def kernel_name(dim: int, group_size: int, *, paged: bool = False, fp8: bool = False, f16: bool = False,
                live: bool = False) -> str:
    """A kernel's name in the module: ``prop1`` + ``l`` (live schedule) + ``p`` (paged) + ``f`` (e4m3 caches) or ``h``
    (fp16 q, out and caches) + ``_d{dim}_g{group_size}``."""
    if fp8 and f16:
        raise ValueError("fp8 and f16: e4m3 caches take bf16 q (no kernel reads them with fp16 q)")
    return f"prop1{'l' if live else ''}{'p' if paged else ''}{'f' if fp8 else ''}{'h' if f16 else ''}_d{dim}_g{group_size}"


def kept_bytes(heads: int, slice_len: int) -> int:
    """Shared memory of a slice's kept scores (one_launch.cu's kept_floats): rows padded to other banks, one float per
    8-key subtile."""
    stride = -(-slice_len // 32) * 32 + 8
    return 4 * heads * (stride + -(-slice_len // 8))


def gather_bytes(*, slices: int, group_size: int, dim: int, budget: int) -> int:
    """Shared memory of one CTA's gather: its rows [vectors][S][8] float32, the group's ``group_size · dim / 8`` output
    vectors shared out over its ``slices`` CTAs."""
    return 4 * 8 * budget * -(-group_size * dim // 8 // slices)


def resolved_bytes(*, group_size: int, budget: int) -> int:
    """Shared memory of a live CTA's resolved rows (one_launch.cu's gather): one int32 pool row per head and sample."""
    return 4 * group_size * budget


def slice_shared(*, slices: int, slice_len: int, group_size: int, dim: int, budget: int, page_size: int | None = None) -> int:
    """Dynamic shared memory of one CTA working on a slice of a group cut in ``slices``: the kept scores and subtiles
    plus the group's stats (and, paged, the page ids of the slice: ⌈slice_len / page_size⌉ + 1 at most), or the
    gather's rows (:func:`gather_bytes`) where those take more."""
    pages = 0 if page_size is None else -(-slice_len // page_size) + 1
    return max(kept_bytes(group_size, slice_len) + 4 * group_size * slices * 2 + 4 * pages,
               gather_bytes(slices=slices, group_size=group_size, dim=dim, budget=budget))


LIVE_MAX_SLICES = 64  # the live schedule's slots per group: the largest power of two within MAX_ONE_WAVE_SLICES
LIVE_MAX_BATCH = 1024  # sequences a live launch takes (one_launch.cu's kLiveMaxBatch)


@dataclass(frozen=True)
class LiveLimits:
    """What issue 39's live-key schedule (:func:`santa.kernels.one_launch_schedule.live_schedule`) takes from a kernel
    shape: slices of at most ``slice_cap`` keys, ``min_slices`` to ``max_slices`` a group, ``ctas`` resident CTAs of
    ``shared`` bytes of dynamic shared memory each. The plan's capacity picks only the slices' length
    (:func:`live_limits`): plans of one length give a request the same bits whatever their capacity and batch; plans
    of two lengths, the same samples up to the float32 CDF rounding (its order follows the slices)."""

    slice_cap: int
    min_slices: int
    max_slices: int
    ctas: int
    shared: int


def live_limits(*, group_size: int, dim: int, budget: int, sms: int, per_sm, n: int, page_size: int | None = None,
                slice_cap: int | None = None) -> LiveLimits | None:
    """The live schedule's limits for a kernel shape and a plan of ``n`` keys per sequence (benchmarks/KERNEL_NOTES.md):
    slices of :data:`ROUNDS_SLICE_KEYS` keys, whose kept scores, every slot's stats and (paged) page ids set the CTA's
    shared memory; ``min_slices`` 1 (a live CTA sums its sampled rows in registers and stages a covered sequence's rows
    in chunks of as many vectors as that memory holds, so no slice count is too few); ``ctas`` = ``per_sm(shared) · sms``.

    Where those slices leave one CTA per SM and slices of half their length leave two, and :data:`LIVE_MAX_SLICES` of
    them still hold ``n`` keys, the slices are halved (d = 128 at G = 7 and 8, plans of up to 128k keys): on vLLM's
    pages half-length slices took 0.74–0.94× the full ones' time (bf16) and 0.63–0.93× (fp8) in every case measured,
    16 × 32k, 8 × 8k, 64 × 2k, 1 × 32k and 4 × 128k at Qwen2.5-7B's and Llama-3.1-70B's shapes (H100,
    ``paged_ab.py --half-slices [--fp8]``, 2026-12-06, 32nd session).

    None where the shape has no kernel, one vector's S rows beside every sample's resolved row
    (:func:`resolved_bytes`) do not fit (since the register gather a CTA needs only one of the two at a time, so this
    bound is stricter than needed; a looser one is not measured), or the grid cannot hold one group's
    :data:`LIVE_MAX_SLICES` slices. ``slice_cap`` (benchmarks: a multiple of 256 keys up to
    :data:`ROUNDS_SLICE_KEYS`) sets the slices' length instead."""
    if (dim, group_size) not in SHAPES:
        return None
    if slice_cap is not None and not (isinstance(slice_cap, int) and 0 < slice_cap <= ROUNDS_SLICE_KEYS[dim]
                                      and slice_cap % 256 == 0):
        raise ValueError(f"slice_cap must be a multiple of 256 keys up to {ROUNDS_SLICE_KEYS[dim]}, got {slice_cap!r}")

    def limits(length: int) -> LiveLimits | None:
        pages = 0 if page_size is None else -(-length // page_size) + 1
        shared = kept_bytes(group_size, length) + 4 * group_size * LIVE_MAX_SLICES * 2 + 4 * pages
        ctas = per_sm(shared) * sms if shared <= SHARED_LIMIT else 0
        one_vector = gather_bytes(slices=group_size * dim // 8, group_size=group_size, dim=dim, budget=budget)  # its S rows
        if one_vector + resolved_bytes(group_size=group_size, budget=budget) > shared or ctas < LIVE_MAX_SLICES:
            return None
        return LiveLimits(slice_cap=length, min_slices=1, max_slices=LIVE_MAX_SLICES, ctas=ctas, shared=shared)

    if slice_cap is not None:
        return limits(slice_cap)
    full = limits(ROUNDS_SLICE_KEYS[dim])
    half_length = ROUNDS_SLICE_KEYS[dim] // 2
    if full is not None and full.ctas < 2 * sms and n <= LIVE_MAX_SLICES * half_length:
        half = limits(half_length)
        if half is not None and half.ctas >= 2 * sms:
            return half
    return full


LIVE_ONE_CTA_KEYS = 16384  # a contiguous cache's keys past which a shape whose full slices fit one CTA per SM takes the Triton prop


def live_pays(*, paged: bool, per_sm: int, n: int) -> bool:
    """Whether a live launch (``per_sm`` CTAs resident on each SM) serves a plan of ``n`` keys per sequence rather than
    the Triton prop: not on a contiguous cache of more than :data:`LIVE_ONE_CTA_KEYS` keys where one CTA fits an SM
    (d = 128 at G = 7 and 8 on full slices: plans over 128k keys, where :func:`live_limits` keeps them). There the live
    launch took 1.05–1.08× the Triton prop's time at B = 16 × 32k (fp8 1.13–1.17×; H100, ``paged_ab.py --shapes``, 31st
    session). On halved slices (two CTAs per SM) the contiguous live launch takes 0.915–0.943× the contiguous Triton
    prop's time at 16 × 32k and 0.987–0.997× at 4 × 128k (``paged_ab.py --half-slices``, H100, 33rd session), so it
    serves. A paged plan's capacity says nothing of its live keys (vLLM's ``max_model_len``), so paged plans keep the
    live launch: on halved slices it takes 0.86–0.94× the paged Triton prop's time at 16 × 32k, 0.40–0.80× at 8 × 8k
    and 64 × 2k, and 1.04–1.07× at 4 × 128k (the loss left there)."""
    return paged or n <= LIVE_ONE_CTA_KEYS or per_sm >= 2


@dataclass(frozen=True)
class Plan:
    """One schedule of one kernel: ``name`` C<slices>[s] (s: staggered halves), ``rounds`` from :mod:`santa.kernels.one_launch_schedule`."""

    name: str
    kernel: str
    rounds: list = field(repr=False)
    staggered: bool

    @property
    def works(self) -> list:
        return [w for row in self.rounds for w in row if w is not None]

    @property
    def grid(self) -> int:
        return len(self.rounds[0])

    @property
    def slots(self) -> int:  # stats slots per (group, head): the largest slice count
        return max(w.slices for w in self.works)

    def shared(self, *, group_size: int, dim: int, budget: int, page_size: int | None = None) -> int:
        return max(slice_shared(slices=w.slices, slice_len=w.slice_len, group_size=group_size, dim=dim, budget=budget,
                                page_size=page_size) for w in self.works)


@dataclass(frozen=True)
class LivePlan:
    """The live schedule's stand-in for :class:`Plan` (issue 39): each launch derives its work from ``seq_lens`` on
    ``grid`` CTAs (:func:`live_limits`), a group in up to ``slots`` slices, no host-built rounds."""

    kernel: str
    grid: int
    slots: int
    limits: LiveLimits
    name: str = "live"
    staggered: bool = False
    rounds: tuple = ()


def make_plan(*, slices: int, grid: int, groups: int, n: int, group_size: int, dim: int, staggered: bool,
              page_size: int | None = None, fp8: bool = False, f16: bool = False) -> Plan:
    rounds = build_schedule(groups=groups, n=n, slices=slices, grid=grid, kind="staggered" if staggered else "rounds")
    return Plan(f"C{slices}" + ("s" if staggered else ""),
                kernel_name(dim, group_size, paged=page_size is not None, fp8=fp8, f16=f16), rounds, staggered)


def choose_plan(*, batch: int, kv_heads: int, group_size: int, dim: int, n: int, budget: int, sms: int, per_sm,
                page_size: int | None = None, fp8: bool = False, f16: bool = False) -> Plan | None:
    """The plan santa runs for this shape (a fixed rule, so that a shape always draws the same samples), or None where
    none fits shared memory. ``per_sm(shared bytes)``: CTAs of the kernel resident on one SM.

    The rule, from the H200 tables of issue 24 (benchmarks/RESULTS.md, 2026-12-03): where every group's slices fit one
    wave with at least min(8, ⌈n / slice keys⌉) slices each, one wave with the most slices up to 66 (halved past it:
    Llama 8k–128k 33, Llama B = 4 × 32k 8, Qwen 32k 66, SmolLM2 8k 44, SmolLM2 B = 16 × 8k 5). Otherwise rounds of
    slices of :data:`ROUNDS_SLICE_KEYS` keys (4096 at d = 128, 2048 at d = 64; at most 16 slices, more where the
    gather's rows need them), on the staggered schedule where a group has at most 4 query heads (Llama B = 6–32 ×
    32k: C8s, 1–4 % faster than every CTA in step; SmolLM2 B = 64 × 8k: C4s, 4 % faster than C4 at S = 128) and in step
    with 7 (Qwen B = 16 × 32k: C16, 5 % faster than C16s): a longer sampling phase per group is not hidden by the other
    half's stream. Not at all where SmolLM2's shape (d = 64, G ≤ 4) needs rounds at S ≤ 64: there the two-launch prop
    is faster (B = 64 × 8k, S = 64: 78.7 µs against the best plan's 83.4; at S = 128 87.4 against 98.0); the same
    shapes at other (d, G) are not measured. At d = 128 (Llama's shape) rounds only where two CTAs fit each SM and a
    group has at most 8 slices (Llama B = 8–64 planned for 32k keys, C8s: 1.02–1.55× faster than the two launches on
    vLLM's pages, live lengths 2k to 32k); not where the gather's rows leave one CTA per SM (n ≤ 8k, C2s: Llama
    B = 16–256 × 512–4k, 1.19–1.38× slower) nor with 16 slices (a 128k plan: B = 64 × 2k live keys, 31 rounds of
    128-key slices, 629 µs against 427; H200, benchmarks/kernels/paged_ab.py, 2026-12-04). Up to
    :data:`EIGHT_SLICES_UP_TO` keys (36,864) Llama's shape keeps 8 slices (of up to 4,608 keys) where ⌈n / 4096⌉ would be
    9: a server's ``max_model_len`` of 33,024 (32k prompts and their output) took the two launches before, and C8s
    measured 0.79–0.88× their time on vLLM's pages (B = 16 × 16k, 64 × 16k, 16 × 32k live keys: 224.3 / 826.2 / 406.0
    against 267.3 / 1040.4 / 461.6 µs) and 5.3 µs against 30.5–58.7 with the gate closed (H100, paged_ab.py --gate --full,
    2026-12-05). At d = 64 the rule gives the two launches where 16 slices of 2,048 keys cannot cover n and the longer
    slices' kept scores (not the gather's rows of a large S) leave one CTA per SM: Qwen's shape planned for 128k keys
    (C19 on vLLM's pages: 314.5 against 284.2 µs on B = 16 × 128k, H100, and 1.04–1.35× on short sequences, H200,
    2026-12-05); Qwen's from about 57k keys and SmolLM2's (G = 3) from about 134k take the same branch, not timed. A paged
    cache (``page_size``) takes the same rule, its slices' page ids counted in shared memory, and so does an fp8 cache
    (``fp8``: its own kernels; not measured apart) and an fp16 one (``f16``: the same bytes as bf16)."""
    if (dim, group_size) not in SHAPES:
        return None
    groups = batch * kv_heads
    shape = dict(group_size=group_size, dim=dim, budget=budget, page_size=page_size)
    target = min(16, max(1, -(-n // ROUNDS_SLICE_KEYS[dim])))
    if dim == 128 and target == 9 and n <= EIGHT_SLICES_UP_TO:
        target = 8  # slices of up to 4,608 keys: the one launch keeps a 33,024-key plan (the docstring)
    for slices in range(max(1, 2 * sms // groups), 0, -1):  # the most slices that keep one wave resident
        shared = slice_shared(slices=slices, slice_len=-(-n // slices), **shape)
        if shared > SHARED_LIMIT:
            break
        if groups * slices <= per_sm(shared) * sms:
            if slices < min(8, target):
                break
            while slices > MAX_ONE_WAVE_SLICES:
                slices //= 2
            return make_plan(slices=slices, grid=groups * slices, groups=groups, n=n, group_size=group_size, dim=dim,
                             staggered=False, page_size=page_size, fp8=fp8, f16=f16)
    if dim == 64 and group_size <= 4 and budget <= 64:
        return None  # rounds at SmolLM2's shape and S ≤ 64: the two launches are faster (B = 64 × 8k: 78.7 µs against 83.4)
    for slices in range(target, 257):  # rounds: more slices only where one slice's shared memory needs them
        shared = slice_shared(slices=slices, slice_len=-(-n // slices), **shape)
        grid = per_sm(shared) * sms if shared <= SHARED_LIMIT else 0
        if grid >= slices:
            if dim == 128 and (grid < 2 * sms or slices > 8):
                return None  # Llama's shape: the two launches are faster (paged_ab.py, H200 2026-12-04; see the docstring)
            gather = gather_bytes(slices=slices, group_size=group_size, dim=dim, budget=budget)
            long_slices = kept_bytes(group_size, -(-n // slices)) >= gather  # not the gather's rows of a large S
            if dim == 64 and grid < 2 * sms and n > 16 * ROUNDS_SLICE_KEYS[dim] and long_slices:
                return None  # long slices' kept scores leave one CTA per SM (Qwen 128k): the two launches are faster
            staggered = group_size <= 4 and grid // 2 >= 2 * slices and groups * slices > grid
            return make_plan(slices=slices, grid=grid, groups=groups, n=n, group_size=group_size, dim=dim, staggered=staggered,
                             page_size=page_size, fp8=fp8, f16=f16)
    return None


class CudaModule:
    """A CUDA module loaded into the current context through the driver API (ctypes): its functions, their shared-memory
    limits and occupancy, and launches on torch's current stream. ``image``: a fatbin, a cubin, or PTX (compiled by the
    driver)."""

    def __init__(self, image: bytes):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.module = ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(image)  # NUL-terminated, as cuModuleLoadData wants PTX text
        self._check(self.cuda.cuModuleLoadData(ctypes.byref(self.module), self._image), "cuModuleLoadData")
        self.functions: dict[str, ctypes.c_void_p] = {}
        self.shared_allowed: dict[str, int] = {}  # per function: the dynamic shared memory it may take (allow_shared)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with CUresult {status}")

    def function(self, name: str) -> ctypes.c_void_p:
        if name not in self.functions:
            fn = ctypes.c_void_p()
            self._check(self.cuda.cuModuleGetFunction(ctypes.byref(fn), self.module, name.encode()), f"cuModuleGetFunction({name})")
            self.functions[name] = fn
        return self.functions[name]

    def allow_shared(self, name: str, shared_bytes: int) -> None:
        """Let ``name`` take ``shared_bytes`` of dynamic shared memory (past the default 48 KB). The limit belongs to the
        function, not to a plan, so it only ever rises: a plan probed or made after another must not lower it under
        the other's launches (and its captured graphs' replays), or those fail with CUresult 720 (a cooperative grid
        none of whose CTAs fit: vLLM's engine, 2026-12-05, a batch-4 plan launched after larger batches' plans had
        probed smaller slices). The carveout stays the driver's: preferring all of it for shared memory made every
        two-CTA plan 3–6 % slower (less L1 for the K loads; measured 2026-12-03, KERNEL_NOTES run 16)."""
        if name not in self.shared_allowed:  # the driver's default: 48 KB with the function's static shared memory
            self.shared_allowed[name] = 48 * 1024 - self.static_shared(name)
        if shared_bytes > self.shared_allowed[name]:
            self._check(self.cuda.cuFuncSetAttribute(self.function(name), 8, shared_bytes), "cuFuncSetAttribute")  # 8: MAX_DYNAMIC_SHARED
            self.shared_allowed[name] = shared_bytes

    def static_shared(self, name: str) -> int:
        """Bytes of ``name``'s static shared memory (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES): a CTA's dynamic shared memory
        may take the device's 227 KB (and by default 48 KB) less this."""
        value = ctypes.c_int()
        self._check(self.cuda.cuFuncGetAttribute(ctypes.byref(value), 1, self.function(name)), "cuFuncGetAttribute")  # 1: SHARED_SIZE
        return value.value

    def resident_per_sm(self, name: str, shared_bytes: int) -> int:
        """CTAs of ``name`` (THREADS threads, ``shared_bytes`` dynamic shared memory) that fit on one SM at once: 0 where
        one CTA's static and dynamic shared memory together pass :data:`SHARED_LIMIT` (the attribute would be refused)."""
        if shared_bytes + self.static_shared(name) > SHARED_LIMIT:
            return 0
        self.allow_shared(name, shared_bytes)
        blocks = ctypes.c_int()
        self._check(self.cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), self.function(name), THREADS,
                                                                         ctypes.c_size_t(shared_bytes)), "cuOccupancy")
        return blocks.value

    def launch_values(self, name: str, grid: tuple[int, int, int], values: list, *, shared_bytes: int = 0,
                      cooperative: bool = False) -> None:
        """Launch ``name`` with the ctypes ``values`` as its arguments, on torch's current stream; ``cooperative``:
        every CTA resident at once (cuLaunchCooperativeKernel, or the launch fails)."""
        args = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        fn = self.function(name)
        if cooperative:
            self._check(self.cuda.cuLaunchCooperativeKernel(fn, *grid, THREADS, 1, 1, shared_bytes, stream, args),
                        "cuLaunchCooperativeKernel")
        else:
            self._check(self.cuda.cuLaunchKernel(fn, *grid, THREADS, 1, 1, shared_bytes, stream, args, None), "cuLaunchKernel")


_MODULES: dict[int, CudaModule | None] = {}


def loaded_module(device_index: int) -> CudaModule | None:
    """``one_launch.fatbin`` loaded on CUDA device ``device_index`` (once per process), or None, with one warning, where
    the driver cannot load it."""
    if device_index not in _MODULES:
        try:
            with torch.cuda.device(device_index):
                if not torch.cuda.is_current_stream_capturing():  # (a sync would break a capture)
                    torch.cuda.current_stream().synchronize()  # the device's primary context, current on this thread
                _MODULES[device_index] = CudaModule(MODULE.read_bytes())
        except (OSError, RuntimeError) as exc:
            warnings.warn(f"santa: the one-launch prop could not be loaded on cuda:{device_index} ({exc}); "
                          "its plans run the two-launch Triton prop", RuntimeWarning, stacklevel=2)
            _MODULES[device_index] = None
    return _MODULES[device_index]


def eligible(*, device: torch.device, kernel: str, dtype: torch.dtype, kv_dtype: torch.dtype, kv_layout: str,
             page_size: int | None, head_dim: int, group_size: int) -> bool:
    """Whether a plan of this kind may run the one-launch prop (then :class:`OneLaunch` decides whether one fits)."""
    paged = page_size is not None
    kinds = (dtype == torch.bfloat16 and kv_dtype in (torch.bfloat16, FP8)) or (dtype == kv_dtype == torch.float16)
    return (device.type == "cuda" and kernel == "prop" and kinds
            and kv_layout in ("NHD", "HND") and (not paged or page_size & (page_size - 1) == 0)
            and (head_dim, group_size) in SHAPES
            and torch.cuda.get_device_capability(device) == (9, 0))


def cache_strides(k: torch.Tensor, v: torch.Tensor, kv_layout: str) -> tuple[int, int, int] | None:
    """(page or sequence, row, head) strides in elements that address both caches, ``[X, rows, H_kv, D]`` (NHD) or
    ``[X, H_kv, rows, D]`` (HND), X pages or sequences (a contiguous cache must be contiguous: the kernels take its
    sequence stride as ``rows · H_kv · D``, its row and head strides from here, so transformers' static cache
    ``[B, H_kv, L, D]`` is read in place); None where the one launch cannot read them: K and V strided
    differently, a feature stride other than 1, a stride not a multiple of 8 elements or a base not 16-byte aligned
    (its loads are 16 bytes). vLLM's packed cache (K and V halves of one row) passes."""
    if k.stride() != v.stride() or k.stride(-1) != 1 or k.data_ptr() % 16 or v.data_ptr() % 16:
        return None
    page, row, head = (k.stride(0), k.stride(1), k.stride(2)) if kv_layout == "NHD" else (k.stride(0), k.stride(2), k.stride(1))
    return (page, row, head) if page % 8 == 0 and row % 8 == 0 and head % 8 == 0 else None


@dataclass(frozen=True)
class Buffers:
    """What the one launches of a plan exchange through global memory: tagged slice statistics ``[B·H_kv][G][slots][2]``,
    tagged sampled keys ``[B, H, S]`` and the groups' epochs ``[B·H_kv]``. One set may serve several plans of one model
    (:meth:`santa.vllm.decode.PagedDecoder.allocate`: every batch size's plan): every word of a group's region is written
    under that group's next epoch, which every launch holding the group advances, so a launch never reads another's
    word, whichever plan wrote it; they serve one call at a time (one stream). ``slots``: the most slices a plan
    sharing them may cut a group in."""

    stats: torch.Tensor
    sampled: torch.Tensor
    epoch: torch.Tensor

    @property
    def slots(self) -> int:
        return self.stats.shape[2]

    @classmethod
    def allocate(cls, *, batch: int, heads: int, kv_heads: int, budget: int, slots: int, device: torch.device) -> Buffers:
        return cls(stats=torch.zeros(batch * kv_heads, heads // kv_heads, slots, 2, dtype=torch.int64, device=device),
                   sampled=torch.zeros(batch, heads, budget, dtype=torch.int64, device=device),
                   epoch=torch.zeros(batch * kv_heads, dtype=torch.int32, device=device))

    def fits(self, *, batch: int, heads: int, kv_heads: int, budget: int, slots: int) -> bool:
        rows, group, own_slots, _ = self.stats.shape
        return (rows >= batch * kv_heads and group == heads // kv_heads and own_slots >= slots
                and self.sampled.shape[0] >= batch and tuple(self.sampled.shape[1:]) == (heads, budget))


def scale_values(k_scale: float | torch.Tensor, v_scale: float | torch.Tensor) -> list:
    """The kernels' scale arguments: per-KV-head pointers (0: none), then the scalars (used where the pointer is 0)."""
    pointers = [ctypes.c_void_p(s.data_ptr() if isinstance(s, torch.Tensor) else 0) for s in (k_scale, v_scale)]
    scalars = [ctypes.c_float(1.0 if isinstance(s, torch.Tensor) else float(s)) for s in (k_scale, v_scale)]
    return pointers + scalars


class OneLaunch:
    """A plan's one-launch prop: its schedule, the arrivals per SM, and the :class:`Buffers` its launches exchange words
    through: a caller's (a :class:`~santa.kernels.Workspace` carrying them, shared by the plans of one model) or its
    own, allocated on the first call that brings none (:meth:`own_buffers`). A launch leaves nothing to reset, so
    successive launches on one stream share them; like a :class:`~santa.kernels.Workspace`, they serve one call at a time.

    ``page_size``: the cache's keys per page (a power of two) where it is paged (then :meth:`run` takes a block table).
    ``fp8``: e4m3 caches (then :meth:`run` takes their scales); ``f16``: fp16 q, out and caches. The layout reaches the kernel as :meth:`run`'s strides. ``module`` (default: ``one_launch.fatbin`` on ``device``) and ``plan`` (default:
    :func:`choose_plan`) are the benchmarks' hooks. Raises ValueError where no plan fits.
    """

    def __init__(self, *, batch: int, heads: int, kv_heads: int, head_dim: int, n_keys: int, budget: int, scale: float,
                 device: torch.device, page_size: int | None = None, fp8: bool = False, f16: bool = False,
                 module: CudaModule | None = None, plan: Plan | None = None, kernel: str | None = None,
                 live: bool = False, min_slices: int | None = None, slice_cap: int | None = None):
        self.module = module if module is not None else loaded_module(device.index)
        if self.module is None:
            raise ValueError("the one-launch module is not loaded on this device")
        group_size = heads // kv_heads
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        name = kernel_name(head_dim, group_size, paged=page_size is not None, fp8=fp8, f16=f16, live=live)
        self.live_values = [ctypes.c_int(0)] * 4  # the live schedule's arguments: B, L, log2 C_min, log2 C_cap (0: a host plan)
        if live:
            plan = self._live_plan(name=name, batch=batch, group_size=group_size, head_dim=head_dim, n_keys=n_keys,
                                   budget=budget, sms=sms, page_size=page_size, min_slices=min_slices, slice_cap=slice_cap)
        elif min_slices is not None or slice_cap is not None:
            raise ValueError("min_slices and slice_cap: a live schedule's (live=True)")
        if plan is None:
            plan = choose_plan(batch=batch, kv_heads=kv_heads, group_size=group_size, dim=head_dim, n=n_keys, budget=budget,
                               sms=sms, per_sm=lambda shared: self.module.resident_per_sm(name, shared), page_size=page_size,
                               fp8=fp8, f16=f16)
            if plan is None:
                raise ValueError(f"no one-launch plan fits {n_keys} keys at S = {budget} in shared memory")
        self.plan, self.kernel = plan, kernel or plan.kernel
        self.kv_heads, self.n_keys, self.budget, self.page_size = kv_heads, n_keys, budget, page_size
        self.shared = (plan.limits.shared if live else
                       plan.shared(group_size=group_size, dim=head_dim, budget=budget, page_size=page_size))
        self.per_sm = self.module.resident_per_sm(self.kernel, self.shared)
        if self.per_sm * sms < plan.grid:
            raise ValueError(f"plan {plan.name}: {self.per_sm * sms} CTAs resident, the schedule needs {plan.grid}")
        # staggered: each SM must hold one CTA of each half, which the kernel arranges by counting arrivals per SM
        self.paired = plan.staggered and self.per_sm == 2 and plan.grid == 2 * sms
        self.table = torch.tensor(schedule_table(plan.rounds), dtype=torch.int32, device=device) if not live else None
        self.shape = dict(batch=batch, heads=heads, kv_heads=kv_heads, budget=budget)
        self.device, self._own = device, None
        self.arrivals = torch.zeros(1026, dtype=torch.int32, device=device)  # per SM, then per half
        self.scale_log2 = scale * math.log2(math.e)

    def _live_plan(self, *, name: str, batch: int, group_size: int, head_dim: int, n_keys: int, budget: int, sms: int,
                   page_size: int | None, min_slices: int | None = None, slice_cap: int | None = None) -> LivePlan:
        """The live schedule's plan (ValueError where it cannot serve: more than :data:`LIVE_MAX_BATCH` sequences, no
        limits that fit, or more keys than ``max_slices`` slices hold); ``min_slices`` (a power of two up to
        ``max_slices``; benchmarks) replaces the limits' fewest slices a sequence takes, ``slice_cap`` (benchmarks,
        :func:`live_limits`) their slices' length."""
        if batch > LIVE_MAX_BATCH:
            raise ValueError(f"the live schedule takes at most {LIVE_MAX_BATCH} sequences, got batch {batch}")
        limits = live_limits(group_size=group_size, dim=head_dim, budget=budget, sms=sms, n=n_keys, page_size=page_size,
                             per_sm=lambda shared: self.module.resident_per_sm(name, shared), slice_cap=slice_cap)
        if limits is None:
            raise ValueError(f"no live schedule fits S = {budget} at d = {head_dim}, G = {group_size} in shared memory")
        if min_slices is not None:
            if not (isinstance(min_slices, int) and 1 <= min_slices <= limits.max_slices and min_slices & (min_slices - 1) == 0):
                raise ValueError(f"min_slices must be a power of two in [1, {limits.max_slices}], got {min_slices!r}")
            limits = dataclasses.replace(limits, min_slices=min_slices)
        if n_keys > limits.max_slices * limits.slice_cap:
            raise ValueError(f"the live schedule takes at most {limits.max_slices * limits.slice_cap} keys, got {n_keys}")
        self.live_values = [ctypes.c_int(batch), ctypes.c_int(limits.slice_cap),
                            ctypes.c_int(limits.min_slices.bit_length() - 1), ctypes.c_int(limits.max_slices.bit_length() - 1)]
        return LivePlan(kernel=name, grid=limits.ctas, slots=limits.max_slices, limits=limits)

    def marks_slots(self) -> int:
        """Slots a ``marks`` buffer needs (:meth:`run`; the kernel writes slot ``r · grid + CTA``): host rounds × grid, or
        for a live launch, whose rounds follow the lengths, the most any lengths can take: every sequence in
        ``max_slices`` slices over the fewest lanes (the grid rounded down to a multiple of ``max_slices``)."""
        grid = self.plan.grid
        if not isinstance(self.plan, LivePlan):
            return len(self.plan.rounds) * grid
        most = self.plan.limits.max_slices
        return grid * -(-self.kv_heads * self.shape["batch"] * most // (grid - grid % most))

    def fits(self, buffers: Buffers) -> bool:
        """Whether ``buffers`` hold this plan's words (its batch, heads, budget and slices)."""
        return buffers.fits(**self.shape, slots=self.plan.slots)

    def own_buffers(self) -> Buffers | None:
        """This plan's own buffers, allocated (zeroed) on first use; None while a CUDA graph is being captured and they
        do not exist yet (zeroing them inside the graph would zero them at every replay, and a replay would read the
        previous one's words as its own)."""
        if self._own is None and not torch.cuda.is_current_stream_capturing():
            self._own = Buffers.allocate(**self.shape, slots=self.plan.slots, device=self.device)
        return self._own

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, out: torch.Tensor, strides: tuple[int, int, int],
            seq_lens: torch.Tensor | None = None, starts: torch.Tensor | None = None,
            block_table: torch.Tensor | None = None, seed: int | torch.Tensor = 0, offset: int | torch.Tensor = 0,
            positions: torch.Tensor | None = None, head_offset: int = 0,
            counts: torch.Tensor | None = None, uniforms: torch.Tensor | None = None, marks: torch.Tensor | None = None,
            buffers: Buffers | None = None, k_scale: float | torch.Tensor = 1.0, v_scale: float | torch.Tensor = 1.0,
            enabled: torch.Tensor | None = None) -> torch.Tensor:
        """One launch on torch's current stream (no host sync; graph-capturable once :meth:`own_buffers` exist or
        ``buffers`` are given: they must :meth:`fits`). Arguments as :meth:`santa.kernels.DecodePlan.run`, ``strides``
        :func:`cache_strides` of k and v (q, out and counts contiguous; a paged plan's ``block_table`` int32
        ``[≥ B, pages per sequence]`` with unit stride along its pages; an fp8 plan's ``k_scale`` / ``v_scale``: floats or
        contiguous float32 ``[H_kv]``; ``starts`` int32 ``[≥ B]``, contiguous: sequence b's keys are ``[starts[b],
        seq_lens[b])``, its slices cut from ``starts[b]``);
        ``uniforms`` (float32 ``[B, H]``) replaces the draw and ``marks`` receives per-CTA phase clocks (benchmarks);
        ``enabled`` (int32 ``[1]`` on the device, read by the launch): 0 makes it return at once, writing nothing.
        Returns ``out``."""

        if marks is not None and (marks.dtype != torch.int64 or marks.dim() != 3 or tuple(marks.shape[1:]) != (9, 2)
                                  or not marks.is_contiguous() or marks.shape[0] < self.marks_slots()):
            raise ValueError(f"marks: a contiguous int64 [≥ {self.marks_slots()}, 9, 2] (one slot per round and CTA, "
                             f"marks_slots()), got {marks.dtype} {tuple(marks.shape)}")
        # the gather's int32 rows: a pool's page << page_shift | place (contiguous: the key, under 2**31 by the limits)
        if isinstance(self.plan, LivePlan) and self.page_size is not None and k.shape[0] * self.page_size >= 2**31:
            raise ValueError(f"k: a live launch takes pools of fewer than 2**31 rows, got {k.shape[0]} pages of "
                             f"{self.page_size} keys")

        def ptr(t: torch.Tensor | None) -> ctypes.c_void_p:
            return ctypes.c_void_p(t.data_ptr() if t is not None else 0)

        seeds, seed = (seed, 0) if isinstance(seed, torch.Tensor) else (None, int(seed))
        offset_ptr, offset = (offset, 0) if isinstance(offset, torch.Tensor) else (None, int(offset))
        paged = self.page_size is not None
        page_stride, row_stride, head_stride = strides
        buffers = buffers if buffers is not None else self.own_buffers()
        if buffers is None:
            raise RuntimeError("the one-launch prop's first call without buffers cannot be captured in a CUDA graph: "
                               "run it once before the capture")
        values = [ptr(q), ptr(k), ptr(v), ctypes.c_longlong(page_stride), ctypes.c_longlong(row_stride),
                  ctypes.c_longlong(head_stride), ptr(block_table if paged else None),
                  ctypes.c_int(block_table.stride(0) if paged else 0),
                  ctypes.c_int(self.page_size.bit_length() - 1 if paged else 0), ctypes.c_int(k.shape[0] if paged else 0),
                  *scale_values(k_scale, v_scale),
                  ptr(uniforms), ctypes.c_uint64(seed), ptr(seeds), ctypes.c_uint64(offset),
                  ptr(offset_ptr), ptr(positions), ctypes.c_int(positions is not None and positions.dtype == torch.int64),
                  ctypes.c_int(head_offset), ptr(seq_lens), ptr(starts), ptr(out), ptr(counts), ptr(buffers.stats), ptr(buffers.sampled),
                  ptr(buffers.epoch), ptr(marks), ptr(self.table), ptr(self.arrivals if self.paired else None),
                  ctypes.c_int(len(self.plan.rounds)), ctypes.c_int(buffers.slots), ctypes.c_int(self.n_keys),
                  ctypes.c_int(self.kv_heads), ctypes.c_float(self.scale_log2), ctypes.c_int(self.budget), ptr(enabled),
                  *self.live_values]
        self.module.launch_values(self.kernel, (self.plan.grid, 1, 1), values, shared_bytes=self.shared, cooperative=True)
        return out
