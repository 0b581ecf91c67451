"""The one-launch prop's plans to compare (benchmark code, issue 24): every candidate slice count and schedule for a
shape, where santa itself runs one fixed rule (``santa.kernels.one_launch.choose_plan``), and ``stream.cu``'s module
(santa's ``one_launch.cu`` plus the phase kernels ``prop1s1_*`` and ``prop1s2_*``) built with nvcc and loaded.
``cuda_one_launch_check.py`` checks and times every candidate against santa's two-launch prop and the rule's choice.
"""

from __future__ import annotations

from pathlib import Path

import torch
from benchmarks.kernels.cuda_stream_check import Kernels, build_module

from santa.kernels.one_launch import SHARED_LIMIT, Plan, kernel_name, make_plan, slice_shared

MODULE = Path("/tmp/santa_one_launch.cubin")  # where nvcc's build of stream.cu goes (and is reused while the source is older)


def load(module: Path = MODULE) -> Kernels:
    """``stream.cu`` built (nvcc, once per source change) and loaded into torch's CUDA context."""
    build_module(module)
    torch.cuda.current_stream().synchronize()  # the primary context the module loads into
    return Kernels(module)


def phase_names(kernel: str) -> tuple[str, str, str]:
    """The kernel and its two phase kernels: prop1_d128_g4 → (…, prop1s1_d128_g4, prop1s2_d128_g4)."""
    prefix, shape = kernel.split("_", 1)
    return kernel, f"{prefix}s1_{shape}", f"{prefix}s2_{shape}"


def slice_plans(kernels: Kernels, kernel: str, *, groups: int, n: int, group_size: int, dim: int,
                budget: int) -> list[tuple[int, int]]:
    """(C, grid) to time. Where every group fits one wave: the most slices per group that keep all CTAs resident, a half
    and a quarter as many. Past one wave (rounds): C = 16, 8, 4, 2, 1 (the first four) where the slice fits shared
    memory, the grid every CTA that stays resident (the schedule keeps a group's slices in one round)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shape = dict(group_size=group_size, dim=dim, budget=budget)
    plans = []
    for slices in range(max(1, 2 * sms // groups), 0, -1):
        shared = slice_shared(slices=slices, slice_len=-(-n // slices), **shape)
        if shared > SHARED_LIMIT:
            break
        if groups * slices <= kernels.resident_per_sm(kernel, shared) * sms:
            if not plans or slices <= plans[-1][0] // 2:
                plans.append((slices, groups * slices))
            if len(plans) == 3:
                return plans
    if len(plans) > 1:
        return plans
    for slices in (16, 8, 4, 2, 1):  # rounds (also where one wave allows only one slice count)
        if plans and slices == plans[0][0]:
            continue
        resident = kernels.resident_per_sm(kernel, slice_shared(slices=slices, slice_len=-(-n // slices), **shape)) * sms
        if resident >= slices:
            plans.append((slices, resident))
    if not plans:
        raise ValueError(f"{kernel}: no slice count fits {n} keys per group in shared memory")
    return plans[:4]


def plan_candidates(kernels: Kernels, *, batch: int, heads: int, kv_heads: int, dim: int, n: int, budget: int) -> list[Plan]:
    """Every plan of :func:`slice_plans` on each schedule kind (staggered only where there are rounds to stagger)."""
    group_size, groups = heads // kv_heads, batch * kv_heads
    kernel = kernel_name(dim, group_size)
    out = []
    for slices, grid in slice_plans(kernels, kernel, groups=groups, n=n, group_size=group_size, dim=dim, budget=budget):
        shape = dict(slices=slices, grid=grid, groups=groups, n=n, group_size=group_size, dim=dim)
        in_step = make_plan(**shape, staggered=False)
        out.append(in_step)
        if len(in_step.rounds) > 1 and grid // 2 >= 2 * slices:  # one wave: nothing to stagger
            out.append(make_plan(**shape, staggered=True))
    return out
