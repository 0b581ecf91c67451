"""prop in one cooperative CUDA launch (``stream.cu``'s ``prop1_*``) as a decode attention: plans, buffers and the launch.

Benchmark code, not the library (issue 24): ``cuda_one_launch_check.py`` checks and times it against santa's
two-launch prop, and ``santa bench e2e --backends cuda-prop1`` plugs :meth:`OneLaunchProp.attention` into
santa.model's decode step. What it handles: contiguous NHD bf16 caches ``[B, n, H_kv, d]`` (d = 128 with G = 4, d = 64
with G = 7 or 3), per-sequence lengths read on the device (``seq_lens``, so a captured graph follows them), and
santa's positional Philox draw (a key per sequence and its position: the same uniforms as santa's kernels, hence
the same samples up to float32 CDF rounding), or uniforms given. Not handled (the Triton kernel does them): paged
caches, NaN rows and out-of-range lengths (clamped here, NaN there), fp16/fp32/fp8, other (d, G).

A plan is C slices per group (sequence, KV head) on a schedule of rounds (``schedule.py``); :func:`plan_candidates`
lists the ones worth timing and :func:`fastest` times them (CUDA-graph replay, clean cold L2) on the caller's inputs.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from benchmarks.bench.timing import Flusher, time_fn
from benchmarks.kernels.cuda_stream.schedule import SCHEDULES, build_schedule, schedule_table
from benchmarks.kernels.cuda_stream_check import Kernels, build_module, kept_bytes

MODULE = Path("/tmp/santa_one_launch.cubin")  # where nvcc's build of stream.cu goes (and is reused while the source is older)
SHARED_LIMIT = 227 * 1024  # dynamic shared memory one CTA may take on sm_90
SHAPES = {(128, 4), (64, 7), (64, 3)}  # (head dim, G) with a prop1_* kernel


def load(module: Path = MODULE) -> Kernels:
    """``stream.cu`` built (nvcc, once per source change) and loaded into torch's CUDA context."""
    build_module(module)
    torch.cuda.init()  # the primary context the module loads into
    torch.cuda.current_stream().synchronize()
    return Kernels(module)


def kernel_name(dim: int, group_size: int) -> str:
    if (dim, group_size) not in SHAPES:
        raise ValueError(f"prop1_* has kernels for (head dim, query heads per KV head) in {sorted(SHAPES)}, got ({dim}, {group_size})")
    return f"prop1_d{dim}_g{group_size}"


def phase_names(kernel: str) -> tuple[str, str, str]:
    """The kernel and its two phase kernels: prop1_d128_g4 → (…, prop1s1_d128_g4, prop1s2_d128_g4)."""
    prefix, shape = kernel.split("_", 1)
    return kernel, f"{prefix}s1_{shape}", f"{prefix}s2_{shape}"


def slice_shared(*, slices: int, slice_len: int, group_size: int, dim: int, budget: int) -> int:
    """Dynamic shared memory of one CTA working on a slice of a group cut in ``slices``: the kept scores and subtiles
    plus the group's stats, or the gather's rows [vectors][S][8] float32 where those take more."""
    vectors_per_cta = -(-group_size * dim // 8 // slices)
    return max(kept_bytes(group_size, slice_len) + 4 * group_size * slices * 2, 4 * 8 * budget * vectors_per_cta)


def allow_plan_shared(kernels: Kernels, kernel: str, shared: int) -> None:
    """Let the kernel and its phase kernels take ``shared`` bytes, where that is past 48 KB and within the limit."""
    if 48 * 1024 < shared <= SHARED_LIMIT:
        for name in phase_names(kernel):
            kernels.allow_shared(name, shared)


def slice_plans(kernels: Kernels, kernel: str, *, groups: int, n: int, group_size: int, dim: int,
                budget: int) -> list[tuple[int, int, int, int]]:
    """(C, slice_len, shared bytes, grid) to time. Where every group fits one wave: the most slices per group that
    keep all CTAs resident, a half and a quarter as many. Past one wave (rounds): C = 16, 8, 4, 2, 1 (the first four) where the slice
    fits shared memory, the grid every CTA that stays resident (the schedule, ``schedule.py``, keeps a
    group's slices in one round)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shape = dict(group_size=group_size, dim=dim, budget=budget)
    plans = []
    for slices in range(max(1, 2 * sms // groups), 0, -1):
        slice_len = -(-n // slices)
        shared = slice_shared(slices=slices, slice_len=slice_len, **shape)
        if shared > SHARED_LIMIT:
            break
        allow_plan_shared(kernels, kernel, shared)
        if groups * slices <= kernels.resident_per_sm(kernel, shared) * sms:
            if not plans or slices <= plans[-1][0] // 2:
                plans.append((slices, slice_len, shared, groups * slices))
            if len(plans) == 3:
                return plans
    if len(plans) > 1:
        return plans
    for slices in (16, 8, 4, 2, 1):  # rounds (also where one wave allows only one slice count)
        if plans and slices == plans[0][0]:
            continue
        slice_len = -(-n // slices)
        shared = slice_shared(slices=slices, slice_len=slice_len, **shape)
        allow_plan_shared(kernels, kernel, shared)
        resident = kernels.resident_per_sm(kernel, shared) * sms if shared <= SHARED_LIMIT else 0
        if resident >= slices:
            plans.append((slices, slice_len, shared, resident))
    if not plans:
        raise ValueError(f"{kernel}: no slice count fits {n} keys per group in shared memory")
    return plans[:4]


@dataclass(frozen=True)
class Plan:
    """One schedule of one kernel: ``name`` C<slices>[s] (s: staggered halves), ``rounds`` from ``schedule.py``."""

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

    def shared(self, *, group_size: int, dim: int, budget: int) -> int:
        return max(slice_shared(slices=w.slices, slice_len=w.slice_len, group_size=group_size, dim=dim, budget=budget)
                   for w in self.works)


def plan_candidates(kernels: Kernels, *, batch: int, heads: int, kv_heads: int, dim: int, n: int, budget: int) -> list[Plan]:
    """Every plan of :func:`slice_plans` on each schedule kind (staggered only where there are rounds to stagger)."""
    group_size, groups = heads // kv_heads, batch * kv_heads
    kernel = kernel_name(dim, group_size)
    out = []
    for slices, _, _, grid in slice_plans(kernels, kernel, groups=groups, n=n, group_size=group_size, dim=dim, budget=budget):
        for kind in SCHEDULES:
            rounds = build_schedule(groups=groups, n=n, slices=slices, grid=grid, kind="rounds")
            if kind == "staggered":
                if len(rounds) == 1 or grid // 2 < 2 * slices:
                    continue  # one wave: nothing to stagger
                rounds = build_schedule(groups=groups, n=n, slices=slices, grid=grid, kind=kind)
            out.append(Plan(f"C{slices}" + ("s" if kind == "staggered" else ""), kernel, rounds, kind == "staggered"))
    return out


class OneLaunchProp:
    """One plan's launch and its buffers, for q ``[B, H, d]`` over K, V ``[B, n, H_kv, d]`` (bf16, contiguous) at
    ``budget`` samples per head. ``kernel`` (default the plan's) may name one of its phase kernels (timing).

    The buffers (tagged slice statistics, tagged sampled keys, the groups' epochs, the arrivals per SM) carry no
    state a launch must reset: successive launches on one stream may share them (every layer of a decode step does).
    """

    def __init__(self, kernels: Kernels, plan: Plan, *, batch: int, heads: int, kv_heads: int, dim: int, n: int,
                 budget: int, kernel: str | None = None):
        self.kernels, self.plan, self.kernel = kernels, plan, kernel or plan.kernel
        self.batch, self.heads, self.kv_heads, self.dim, self.n, self.budget = batch, heads, kv_heads, dim, n, budget
        group_size = heads // kv_heads
        self.shared = plan.shared(group_size=group_size, dim=dim, budget=budget)
        if self.shared > SHARED_LIMIT:
            raise ValueError(f"plan {plan.name}: {self.shared} bytes of shared memory per CTA, past {SHARED_LIMIT}")
        allow_plan_shared(kernels, plan.kernel, self.shared)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.per_sm = kernels.resident_per_sm(self.kernel, self.shared)
        if self.per_sm * sms < plan.grid:
            raise ValueError(f"plan {plan.name}: {self.per_sm * sms} CTAs resident, the schedule needs {plan.grid}")
        # staggered: each SM must hold one CTA of each half, which the kernel arranges by counting arrivals per SM
        self.paired = plan.staggered and self.per_sm == 2 and plan.grid == 2 * sms
        self.table = torch.tensor(schedule_table(plan.rounds), dtype=torch.int32, device="cuda")
        self.stats = torch.zeros(batch * kv_heads, group_size, plan.slots, 2, dtype=torch.int64, device="cuda")
        self.sampled = torch.zeros(batch, heads, budget, dtype=torch.int64, device="cuda")
        self.epoch = torch.zeros(batch * kv_heads, dtype=torch.int32, device="cuda")
        self.arrivals = torch.zeros(1026, dtype=torch.int32, device="cuda")  # per SM, then per half
        self.scale = math.log2(math.e) / math.sqrt(dim)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, out: torch.Tensor, seq_lens: torch.Tensor | None = None,
            seeds: torch.Tensor | None = None, positions: torch.Tensor | None = None, uniforms: torch.Tensor | None = None,
            counts: torch.Tensor | None = None, marks: torch.Tensor | None = None) -> torch.Tensor:
        """Launch on torch's current stream (graph-capturable: no host sync, no allocation). Uniforms: ``uniforms``
        (float32 ``[B, H]``) or santa's positional draw from ``seeds`` and ``positions`` (int64 ``[B]``). ``seq_lens``
        (int32 ``[B]``, None: every sequence n keys); ``counts`` (int32 ``[B, H, n]``, zeroed by the caller) gets
        the samples per key; ``marks`` the phase clocks (``cuda_one_launch_check.py``). Returns ``out``."""
        if uniforms is None and (seeds is None or positions is None):
            raise ValueError("give uniforms, or seeds and positions (santa's positional draw)")

        def ptr(t: torch.Tensor | None) -> ctypes.c_void_p:
            return ctypes.c_void_p(t.data_ptr() if t is not None else 0)

        values = [ptr(t) for t in (q, k, v, uniforms, seeds, positions, seq_lens, out, counts, self.stats, self.sampled,
                                    self.epoch, marks, self.table)]
        values += [ptr(self.arrivals if self.paired else None), ctypes.c_int(len(self.plan.rounds)),
                   ctypes.c_int(self.plan.slots), ctypes.c_int(self.n), ctypes.c_int(self.kv_heads),
                   ctypes.c_float(self.scale), ctypes.c_int(self.budget)]
        self.kernels.launch_values(self.kernel, (self.plan.grid, 1, 1), values, shared_bytes=self.shared, cooperative=True)
        return out

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx, layer: int) -> torch.Tensor:
        """santa.model's plugged-in attention (``make_context(attention=…)``): the layer's positional draw, as the
        ``santa-prop`` backend draws it (key ``ctx.layer_keys[layer]``, counter ``ctx.positions``)."""
        if ctx.budget_of(layer) != self.budget:
            raise ValueError(f"layer {layer} samples {ctx.budget_of(layer)} per head; this plan was made for {self.budget}")
        return self.run(q, k_cache, v_cache, out=torch.empty_like(q), seq_lens=ctx.seq_lens, seeds=ctx.layer_keys[layer],
                        positions=ctx.positions)


def fastest(kernels: Kernels, *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, budget: int,
            seq_lens: torch.Tensor | None = None) -> tuple[OneLaunchProp, dict]:
    """The plan of :func:`plan_candidates` that runs fastest on these inputs (CUDA-graph replay, clean cold L2,
    medians), and every candidate's µs (or why it could not run)."""
    batch, heads, dim = q.shape
    n, kv_heads = k.shape[1], k.shape[2]
    shape = dict(batch=batch, heads=heads, kv_heads=kv_heads, dim=dim, n=n, budget=budget)
    uniforms = torch.rand(batch, heads, device=q.device)
    out = torch.empty_like(q)
    flusher = Flusher(q.device)
    timed, best = {}, None
    for plan in plan_candidates(kernels, **shape):
        try:
            prop = OneLaunchProp(kernels, plan, **shape)
            us = time_fn(lambda prop=prop: prop.run(q, k, v, out=out, seq_lens=seq_lens, uniforms=uniforms),
                         flusher.read, warmup=5, iters=20, graph=True)["median_us"]
        except (RuntimeError, ValueError) as exc:
            timed[plan.name] = str(exc)
            continue
        timed[plan.name] = us
        if best is None or us < best[0]:
            best = (us, prop)
    del flusher
    if best is None:
        raise RuntimeError(f"no one-launch plan ran: {timed}")
    return best[1], timed
