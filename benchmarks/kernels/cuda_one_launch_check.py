"""Issue 24: prop in one cooperative launch, in CUDA C++ (``cuda_stream/stream.cu``, ``prop1_*``), against santa's
two-launch Triton prop on the same inputs and the same uniforms. First run on the H200 on 2026-12-02 (the first
version: right, slower than santa's prop); KERNEL_NOTES runs 15 and 16 have every version since. Each plan (C slices per
group) runs on the schedules of ``cuda_stream/schedule.py``: ``rounds`` (every CTA in step) and, where there is more
than one round, ``staggered`` (plan name suffix ``s``: two halves of the grid half a round apart).

Per case (bf16, contiguous NHD, every sequence n keys, S = 128): the uniforms santa's kernels draw for (seed, offset)
(``santa.kernels.reference.philox_uniforms``) are handed to the CUDA kernel, so both place the same comb. Checked:
every head draws S samples; the counts against santa's (rows equal, samples moved: the two compute the float32 CDF
in different orders, so a point within rounding of a CDF step may move, as the spec tests allow); the outputs
against santa's; two CUDA runs bitwise equal. Then timed in the same process as santa's prop step (CUDA-graph
replay, clean cold L2, medians; benchmarks/bench/timing.py), with the phases alone (``prop1s1_*``: stream and
publish; ``prop1s2_*``: + the stats exchange and placement). C, the slices per group: the largest that keeps every CTA
resident (``cuOccupancyMaxActiveBlocksPerMultiprocessor`` with the slice's shared memory), a half and a quarter of it.

    python benchmarks/kernels/cuda_one_launch_check.py OUT.jsonl [COMMIT] [--only CASE ...] [--plans PLAN ...] [--ptx]

One JSON line per case, resumable and with one writer at a time, as ``cuda_stream_check.py`` (``run_cases``).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import math
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, ".")
from benchmarks.bench.timing import Flusher, time_fn  # noqa: E402
from benchmarks.kernels.cuda_stream.schedule import SCHEDULES, build_schedule, schedule_table  # noqa: E402
from benchmarks.kernels.cuda_stream_check import Kernels, kept_bytes, random_inputs, run_cases  # noqa: E402

BUDGET, SEED, OFFSET = 128, 3, 5
# (name, batch, keys, q heads, kv heads, head dim)
CASES = [("llama 8k", 1, 8192, 32, 8, 128), ("llama 32k", 1, 32768, 32, 8, 128), ("llama 128k", 1, 131072, 32, 8, 128),
         ("llama B=4 x 32k", 4, 32768, 32, 8, 128), ("qwen 32k", 1, 32768, 14, 2, 64), ("smollm2 8k", 1, 8192, 9, 3, 64),
         ("llama B=8 x 32k", 8, 32768, 32, 8, 128), ("llama B=32 x 32k", 32, 32768, 32, 8, 128),
         ("qwen B=16 x 32k", 16, 32768, 14, 2, 64), ("smollm2 B=64 x 8k", 64, 8192, 9, 3, 64)]
SHARED_LIMIT = 227 * 1024  # dynamic shared memory one CTA may take on sm_90


def slice_shared(*, slices: int, slice_len: int, group_size: int, dim: int) -> int:
    """Dynamic shared memory of one CTA working on a slice of a group cut in ``slices``: the kept scores and subtiles
    plus the group's stats, or the gather's rows [vectors][S][8] float32 where those take more."""
    vectors_per_cta = -(-group_size * dim // 8 // slices)
    return max(kept_bytes(group_size, slice_len) + 4 * group_size * slices * 2, 4 * 8 * BUDGET * vectors_per_cta)


def plan_shared(kernels: Kernels, kernel: str, *, slices: int, slice_len: int, group_size: int, dim: int) -> int:
    """:func:`slice_shared`, allowed past 48 KB for the kernel and its phase kernels."""
    shared = slice_shared(slices=slices, slice_len=slice_len, group_size=group_size, dim=dim)
    allow_plan_shared(kernels, kernel, shared)
    return shared


def allow_plan_shared(kernels: Kernels, kernel: str, shared: int) -> None:
    """Let the kernel and its phase kernels take ``shared`` bytes, where that is past 48 KB and within the limit."""
    if 48 * 1024 < shared <= SHARED_LIMIT:
        for name in phase_names(kernel):
            kernels.allow_shared(name, shared)


def phase_names(kernel: str) -> tuple[str, str, str]:
    """The kernel and its two phase kernels: prop1_d128_g4 → (…, prop1s1_d128_g4, prop1s2_d128_g4)."""
    prefix, shape = kernel.split("_", 1)
    return kernel, f"{prefix}s1_{shape}", f"{prefix}s2_{shape}"


def slice_plans(kernels: Kernels, kernel: str, *, groups: int, n: int, group_size: int, dim: int) -> list[tuple[int, int, int, int]]:
    """(C, slice_len, shared bytes, grid) to time. Where every group fits one wave: the most slices per group that
    keep all CTAs resident, a half and a quarter as many. Past one wave (rounds): C = 16, 8, 4, 2, 1 (the first four) where the slice
    fits shared memory, the grid every CTA that stays resident (the schedule, ``cuda_stream/schedule.py``, keeps a
    group's slices in one round)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plans = []
    for slices in range(max(1, 2 * sms // groups), 0, -1):
        slice_len = -(-n // slices)
        shared = plan_shared(kernels, kernel, slices=slices, slice_len=slice_len, group_size=group_size, dim=dim)
        if shared > SHARED_LIMIT:
            break
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
        shared = plan_shared(kernels, kernel, slices=slices, slice_len=slice_len, group_size=group_size, dim=dim)
        resident = kernels.resident_per_sm(kernel, shared) * sms if shared <= SHARED_LIMIT else 0
        if resident >= slices:
            plans.append((slices, slice_len, shared, resident))
    if not plans:
        raise ValueError(f"{kernel}: no slice count fits {n} keys per group in shared memory")
    return plans[:4]


def measure_case(kernels: Kernels, flusher: Flusher, *, batch: int, n: int, heads: int, kv_heads: int, dim: int,
                 plans: set[str] | None = None) -> dict:
    from santa.kernels import plan_decode
    from santa.kernels.reference import philox_uniforms

    q, k, v = random_inputs(batch=batch, n=n, heads=heads, kv_heads=kv_heads, dim=dim)
    group = heads // kv_heads
    uniforms = philox_uniforms(SEED, OFFSET, torch.arange(batch * heads).reshape(batch, heads)).float().cuda()

    plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n, budget=BUDGET,
                       dtype=q.dtype, device=q.device)
    santa_counts = torch.zeros(batch, heads, n, dtype=torch.int32, device="cuda")
    santa_out = plan.run(q, k, v, seed=SEED, offset=OFFSET, counts=santa_counts)
    case = {"batch": batch, "keys": n, "heads": heads, "kv_heads": kv_heads, "head_dim": dim, "plans": {}}
    scratch = torch.empty_like(santa_out)  # timed into its own buffer: santa_out stays the (SEED, OFFSET) draw
    case["santa_prop_us"] = time_fn(lambda: plan.run(q, k, v, out=scratch), flusher.read, graph=True)["median_us"]
    scale = math.log2(math.e) / math.sqrt(dim)
    out = torch.empty_like(q)
    counts = torch.zeros(batch, heads, n, dtype=torch.int32, device="cuda")
    best = None
    groups = batch * kv_heads
    kernel = f"prop1_d{dim}_g{group}"
    for slices, _, _, grid in slice_plans(kernels, kernel, groups=groups, n=n, group_size=group, dim=dim):
        for kind in SCHEDULES:
            name = f"C{slices}" + ("s" if kind == "staggered" else "")
            if plans is not None and name not in plans:
                continue
            rounds = build_schedule(groups=groups, n=n, slices=slices, grid=grid, kind="rounds")
            if kind == "staggered":
                if len(rounds) == 1 or grid // 2 < 2 * slices:
                    continue  # one wave: nothing to stagger
                rounds = build_schedule(groups=groups, n=n, slices=slices, grid=grid, kind=kind)
            row = run_schedule(kernels, flusher, kernel, rounds, staggered=kind == "staggered",
                               inputs=(q, k, v, uniforms, out, counts), santa=(santa_counts, santa_out), group=group,
                               dim=dim, scale=scale)
            case["plans"][name] = row
            if "us" in row and (best is None or row["us"] < best[0]):
                best = (row["us"], name)
    if best is not None:
        case["one_launch_us"], case["best_plan"] = best
    return case


def run_schedule(kernels: Kernels, flusher: Flusher, kernel: str, rounds: list, *, staggered: bool, inputs: tuple,
                 santa: tuple, group: int, dim: int, scale: float) -> dict:
    """One plan: the kernel on the schedule ``rounds`` (``cuda_stream/schedule.py``), checked against santa's counts and
    output and its own counts, timed with its phases, and its phase marks; a refused launch is the row's error."""
    q, k, v, uniforms, out, counts = inputs
    santa_counts, santa_out = santa
    batch, heads, n = counts.shape
    kv_heads = heads // group
    works = [w for row in rounds for w in row if w is not None]
    slots = max(w.slices for w in works)
    shared = max(slice_shared(slices=w.slices, slice_len=w.slice_len, group_size=group, dim=dim) for w in works)
    grid = len(rounds[0])
    row = {"slices": min(w.slices for w in works), "slice_len": max(w.slice_len for w in works), "shared_bytes": shared,
           "grid": grid, "rounds": len(rounds), "slice_counts": sorted({w.slices for w in works})}
    names = phase_names(kernel)
    if shared > SHARED_LIMIT:
        row["error"] = f"{shared} bytes of shared memory"
        return row
    try:
        allow_plan_shared(kernels, kernel, shared)
        per_sm = kernels.resident_per_sm(kernel, shared)
    except RuntimeError as exc:  # the context may already be broken by an earlier launch: this plan says so
        row["error"] = str(exc)
        return row
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if per_sm * sms < grid:
        row["error"] = f"{shared} bytes of shared memory: {per_sm * sms} CTAs resident, the schedule needs {grid}"
        return row
    # staggered: each SM must hold one CTA of each half, which the kernel arranges by counting arrivals per SM
    paired = staggered and per_sm == 2 and grid == 2 * sms
    row["sm_paired"] = paired
    table = torch.tensor(schedule_table(rounds), dtype=torch.int32, device="cuda")
    # per kernel (the full one and its phases): tagged stats and sampled keys, the groups' epochs
    buffers = {name: (torch.zeros(batch * kv_heads, group, slots, 2, dtype=torch.int64, device="cuda"),
                      torch.zeros(batch, heads, BUDGET, dtype=torch.int64, device="cuda"),
                      torch.zeros(batch * kv_heads, dtype=torch.int32, device="cuda")) for name in names}
    arrivals = {name: torch.zeros(1026, dtype=torch.int32, device="cuda") for name in names}  # per SM, then per half

    def launch(with_counts: bool, name: str = kernel, marks: torch.Tensor | None = None) -> None:
        values = [ctypes.c_void_p(t.data_ptr()) for t in (q, k, v, uniforms, out)]
        values.append(ctypes.c_void_p(counts.data_ptr() if with_counts else 0))
        values += [ctypes.c_void_p(t.data_ptr()) for t in buffers[name]]
        values.append(ctypes.c_void_p(marks.data_ptr() if marks is not None else 0))
        values += [ctypes.c_void_p(table.data_ptr()), ctypes.c_void_p(arrivals[name].data_ptr() if paired else 0),
                   ctypes.c_int(len(rounds)), ctypes.c_int(slots), ctypes.c_int(n), ctypes.c_int(kv_heads),
                   ctypes.c_float(scale), ctypes.c_int(BUDGET)]
        kernels.launch_values(name, (grid, 1, 1), values, shared_bytes=shared, cooperative=True)

    started = time.perf_counter()
    try:
        counts.zero_()
        clear_hang_report(kernels)
        launch(True)
        torch.cuda.synchronize()
        if hang := hang_report(kernels, buffers[kernel], group=group, slots=slots, budget=BUDGET):
            row["error"] = "a tagged-word wait gave up"
            row["hang"] = hang
            clear_hang_report(kernels)
            return row
        first = out.clone()
        launch(False)
        torch.cuda.synchronize()
        row["repeat_bitwise_equal"] = bool(torch.equal(first, out))
        row["epochs_count_launches"] = bool((buffers[kernel][2] == 2).all())
        row["every_head_draws_S"] = bool((counts.sum(-1) == BUDGET).all())
        row["rows_equal_to_santa"] = float((counts == santa_counts).all(-1).float().mean())
        row["samples_moved"] = int((counts - santa_counts).abs().sum()) // 2
        row["max_abs_out_diff"] = float((first.float() - santa_out.float()).abs().max())
        # the output against its own draw: Σ_j counts_j · v_j / S in float32 (the gather and its sum, exactly checked)
        own = torch.einsum("bkgn,bnkd->bkgd", counts.view(batch, kv_heads, group, n).float(), v.float()) / BUDGET
        row["max_abs_diff_to_own_counts"] = float((first.float() - own.reshape(batch, heads, dim)).abs().max())
        try:
            row["us"] = time_fn(lambda: launch(False), flusher.read, graph=True)["median_us"]
        except RuntimeError as exc:  # a cooperative launch that a graph cannot capture: say so, time it eagerly
            row["graph_error"] = str(exc)
            row["eager_us"] = time_fn(lambda: launch(False), flusher.read)["median_us"]
            return row
        for stage, name in zip(("prop1s1", "prop1s2"), names[1:], strict=True):  # stream + publish; + the stats exchange and placement
            try:
                row[f"{stage}_us"] = time_fn(lambda name=name: launch(False, name), flusher.read, graph=True)["median_us"]
            except RuntimeError as exc:
                row[f"{stage}_error"] = str(exc)
        marks = torch.zeros(len(rounds) * grid, 9, 2, dtype=torch.int64, device="cuda")
        for _ in range(3):  # warm, then the last of three eager launches, each after a clean L2 as in the timing
            flusher.read()
            launch(False, marks=marks)
        torch.cuda.synchronize()
        marks = marks.cpu()
        row["phases"] = phase_marks(marks[:, :8])
        row["sm_halves"] = sm_halves(marks[:grid, 8, 0], started=marks[:grid, 0, 0] != 0)
        row["smid_round0"] = marks[:grid, 8, 0].tolist()  # the SM of each schedule CTA in round 0 (0 where idle)
    except RuntimeError as exc:  # a launch refused (e.g. a grid the cooperative launch finds too large): this plan says
        row["error"] = str(exc)    # so, the others still run
        row["failed_after_s"] = time.perf_counter() - started  # at once: a fault (a hung wait reports, see hang_report)
    return row


def clear_hang_report(kernels: Kernels) -> None:
    """Zero the kernel's hang report and its give-up flag (``hang_report``, ``hang_abort`` in stream.cu)."""
    kernels.zero_global("hang_report")
    kernels.zero_global("hang_abort")


def hang_report(kernels: Kernels, buffers: tuple, *, group: int, slots: int, budget: int) -> dict | None:
    """What the kernel's first wait past its limit recorded (``hang_report`` in stream.cu), with the word decoded
    against the launch's buffers: slice statistics [groups][G][slots][2] or sampled keys [B·H][S]; None if none."""
    words = kernels.read_global("hang_report", 8)
    if words[0] == 0:
        return None
    stats, sampled, _ = buffers
    address, tag, seen = words[3], words[4], words[5]
    report = {"cta": words[1], "thread": words[2], "tag_awaited": tag, "tag_seen": seen >> 32}
    for name, tensor in (("slice_stats", stats), ("sampled", sampled)):
        first = tensor.data_ptr()
        if first <= address < first + tensor.numel() * 8:
            index = (address - first) // 8
            report["buffer"] = name
            if name == "slice_stats":  # [group][G · slots · 2]: the slice c and head g depend on the group's C_g
                report["group"], report["word_in_group"] = divmod(index, group * slots * 2)
            else:
                report["row"], report["sample"] = divmod(index, budget)
    return report


def sm_halves(smid: torch.Tensor, *, started: torch.Tensor) -> dict:
    """Which schedule CTAs sat on one SM in round 0: among the SMs holding two CTAs that ran, the share holding one
    of each half ([0, grid/2) and [grid/2, grid)), which the staggered schedule needs; and the share of pairs (i,
    i + grid/2) on one SM, which the block scheduler alone gives 0 (measured 2026-12-03: why the kernel pairs the
    halves itself, ``arrivals``)."""
    half = smid.numel() // 2
    per_sm: dict[int, list[int]] = {}
    for cta in torch.nonzero(started).flatten().tolist():
        per_sm.setdefault(int(smid[cta]), []).append(int(cta >= half))
    pairs = [sorted(halves) for halves in per_sm.values() if len(halves) == 2]
    both = started[:half] & started[half: 2 * half]
    return {"sms_with_both_halves": sum(p == [0, 1] for p in pairs) / len(pairs) if pairs else None,
            "i_and_i_plus_half": float((smid[:half] == smid[half: 2 * half])[both].float().mean()) if both.any() else None}


PHASES = ["start", "streamed", "published", "stats read", "first points placed", "keys written", "V rows gathered",
          "done"]


def phase_marks(marks: torch.Tensor) -> dict:
    """From the kernel's marks [CTAs, 8, (globaltimer ns, clock64)]: per phase boundary, when the last CTA reached it
    (µs after the first CTA started, globaltimer), and per phase the median and largest cycles a CTA spent in it."""
    ns, cycles = marks[..., 0].double(), marks[..., 1].double()
    seen = marks[..., 0] != 0  # mark 4 is missing where head 0 places no point in the slice
    t0 = ns[seen[:, 0], 0].min()  # idle schedule slots carry no marks
    out = {"last_cta_us": {}, "cycles_median": {}, "cycles_max": {}}
    for i, name in enumerate(PHASES):
        if seen[:, i].any():
            out["last_cta_us"][name] = float((ns[seen[:, i], i].max() - t0) / 1e3)
        if i and (both := seen[:, i] & seen[:, i - 1]).any():
            spent = cycles[both, i] - cycles[both, i - 1]
            out["cycles_median"][name] = float(spent.median())
            out["cycles_max"][name] = float(spent.max())
    return out


def measure_or_error(kernels: Kernels, flusher: Flusher, plans: set[str] | None = None, **shape) -> dict:
    """:func:`measure_case`, or the error it raised as the record: one bad case must not hide the others."""
    try:
        return measure_case(kernels, flusher, plans=plans, **shape)
    except (RuntimeError, ValueError) as exc:
        return {"error": str(exc), "where": traceback.format_exc(limit=-3)}


def slug(name: str) -> str:
    """A case's name as one shell word."""
    return name.replace(" ", "_")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the JSONL file (one line per case; a re-run resumes)")
    parser.add_argument("commit", nargs="?", help="the commit the records carry (the device's .git may be stale)")
    parser.add_argument("--only", nargs="+", metavar="CASE", choices=[slug(name) for name, *_ in CASES],
                        help="these cases only, spaces written as _ (e.g. llama_B=8_x_32k; default: all)")
    parser.add_argument("--plans", nargs="+", metavar="PLAN", help="these plans only (e.g. C8 C8s; default: all)")
    parser.add_argument("--ptx", action="store_true",
                        help="load the kernels as PTX compiled by the driver at load time (no cubin from nvcc's ptxas)")
    args = parser.parse_args()
    cases = [case for case in CASES if args.only is None or slug(case[0]) in args.only]
    if args.plans:  # a record of some plans is not the case's record: its own key, so neither run skips the other
        cases = [(f"{name} [plans {' '.join(sorted(args.plans))}]", *shape) for name, *shape in cases]
    module = Path("/tmp/santa_one_launch.ptx" if args.ptx else "/tmp/santa_one_launch.cubin")
    run_cases(args.out, cases=cases, cubin=module, commit=args.commit,
              measure=functools.partial(measure_or_error, plans=set(args.plans) if args.plans else None),
              holder="cuda_one_launch_check.py", describe=describe)


def describe(name: str, case: dict) -> str:
    """One line per case: santa's prop, then per plan the time, its phases and the check."""
    if "error" in case:
        return f"{name}: {case['error']}"
    parts = [f"{name}: santa prop {case['santa_prop_us']:.1f} µs"]
    for key, row in case["plans"].items():
        if "error" in row:
            parts.append(f"{key}: {row['error']}")
            continue
        phases = f" (stream {row['prop1s1_us']:.1f}, +sample {row['prop1s2_us']:.1f})" if "prop1s2_us" in row else ""
        both_halves = row.get("sm_halves", {}).get("sms_with_both_halves")
        phases += f" [SMs with one CTA of each half: {both_halves:.2f}]" if both_halves is not None else ""
        parts.append(f"{key}/r{row.get('rounds', 1)} {row.get('us', float('nan')):.1f}{phases} equal {row['rows_equal_to_santa']:.2f} "
                     f"moved {row['samples_moved']} S {row['every_head_draws_S']} rep {row['repeat_bitwise_equal']} "
                     f"out-santa {row['max_abs_out_diff']:.3f} out-own {row['max_abs_diff_to_own_counts']:.4f}")
    return "; ".join(parts)


if __name__ == "__main__":
    main()
