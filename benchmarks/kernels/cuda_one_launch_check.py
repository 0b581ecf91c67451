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
import functools
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, ".")
from benchmarks.bench.kernels import sdpa_fn  # noqa: E402
from benchmarks.bench.timing import Flusher, time_fn  # noqa: E402
from benchmarks.kernels.cuda_stream.plans import phase_names, plan_candidates  # noqa: E402
from benchmarks.kernels.cuda_stream_check import Kernels, random_inputs, run_cases  # noqa: E402

from santa.kernels import Tuning, plan_decode  # noqa: E402
from santa.kernels.one_launch import OneLaunch  # noqa: E402

BUDGET, SEED, OFFSET = 128, 3, 5
# (name, batch, keys, q heads, kv heads, head dim)
CASES = [("llama 8k", 1, 8192, 32, 8, 128), ("llama 32k", 1, 32768, 32, 8, 128), ("llama 128k", 1, 131072, 32, 8, 128),
         ("llama B=4 x 32k", 4, 32768, 32, 8, 128), ("qwen 32k", 1, 32768, 14, 2, 64), ("smollm2 8k", 1, 8192, 9, 3, 64),
         ("llama B=8 x 32k", 8, 32768, 32, 8, 128), ("llama B=32 x 32k", 32, 32768, 32, 8, 128),
         ("qwen B=16 x 32k", 16, 32768, 14, 2, 64), ("smollm2 B=64 x 8k", 64, 8192, 9, 3, 64)]


def measure_case(kernels: Kernels, flusher: Flusher, *, batch: int, n: int, heads: int, kv_heads: int, dim: int,
                 plans: set[str] | None = None, budget: int = BUDGET) -> dict:
    from santa.kernels.reference import philox_uniforms

    q, k, v = random_inputs(batch=batch, n=n, heads=heads, kv_heads=kv_heads, dim=dim)
    uniforms = philox_uniforms(SEED, OFFSET, torch.arange(batch * heads).reshape(batch, heads)).float().cuda()

    # santa's two-launch Triton prop (the baseline), and santa's prop as it runs by default (the one-launch kernel on
    # the plan of choose_plan, through DecodePlan.run: the product path)
    plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n, budget=budget,
                       dtype=q.dtype, device=q.device, tuning=Tuning(one_launch=False))
    product = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n, budget=budget,
                          dtype=q.dtype, device=q.device)
    santa_counts = torch.zeros(batch, heads, n, dtype=torch.int32, device="cuda")
    santa_out = plan.run(q, k, v, seed=SEED, offset=OFFSET, counts=santa_counts)
    case = {"batch": batch, "keys": n, "heads": heads, "kv_heads": kv_heads, "head_dim": dim, "budget": budget, "plans": {}}
    scratch = torch.empty_like(santa_out)  # timed into its own buffer: santa_out stays the (SEED, OFFSET) draw
    case["santa_prop_us"] = time_fn(lambda: plan.run(q, k, v, out=scratch), flusher.read, graph=True)["median_us"]
    if product.one_launch is not None:
        case["santa_plan"] = product.one_launch.plan.name
        case["santa_one_launch_us"] = time_fn(lambda: product.run(q, k, v, out=scratch), flusher.read, graph=True)["median_us"]
    try:  # the dense backend to beat on these shapes (benchmarks/RESULTS.md): cuDNN through SDPA, same inputs, same call
        case["cudnn_us"] = time_fn(sdpa_fn(q, k, v, "cudnn"), flusher.read, graph=True)["median_us"]
    except RuntimeError as exc:
        case["cudnn_error"] = str(exc).splitlines()[0][:200]
    shape = dict(batch=batch, heads=heads, kv_heads=kv_heads, dim=dim, n=n, budget=budget)
    best = None
    for one in plan_candidates(kernels, **shape):
        if plans is not None and one.name not in plans:
            continue
        row = run_plan(kernels, flusher, one, shape=shape, inputs=(q, k, v, uniforms), santa=(santa_counts, santa_out))
        case["plans"][one.name] = row
        if "us" in row and (best is None or row["us"] < best[0]):
            best = (row["us"], one)
    if best is not None:
        case["one_launch_us"], case["best_plan"] = best[0], best[1].name
        case["positional"] = check_positional(kernels, best[1], shape=shape, inputs=(q, k, v), santa_plan=plan)
    case["offset_in_memory"] = check_offset_in_memory(shape=shape, inputs=(q, k, v), santa_plan=plan, product=product)
    return case


def check_positional(kernels: Kernels, plan, *, shape: dict, inputs: tuple, santa_plan) -> dict:
    """The plan as santa.model's decode step runs it (``santa bench e2e --backends cuda-prop1``): santa's positional
    draw made in the kernel (a Philox key per sequence, the sequence's position) and per-sequence lengths read on the
    device (ragged: n − 37·b − 1 keys for sequence b, at least n / 2), against santa's prop on the same arguments."""
    q, k, v = inputs
    batch, heads, n = shape["batch"], shape["heads"], shape["n"]
    gen = torch.Generator().manual_seed(11)
    seeds = torch.randint(0, 2**62, (batch,), generator=gen).cuda()
    positions = torch.randint(0, 2**40, (batch,), generator=gen).cuda()
    seq_lens = torch.tensor([max(n // 2, n - 37 * b - 1) for b in range(batch)], dtype=torch.int32, device="cuda")
    santa_counts = torch.zeros(batch, heads, n, dtype=torch.int32, device="cuda")
    santa_plan.run(q, k, v, seq_lens=seq_lens, seed=seeds, positions=positions, counts=santa_counts)
    prop = one_launch(kernels, plan, shape)
    counts = torch.zeros_like(santa_counts)
    out = prop.run(q, k, v, out=torch.empty_like(q), seq_lens=seq_lens, seed=seeds, positions=positions, counts=counts)
    torch.cuda.synchronize()
    beyond = torch.arange(n, device="cuda") >= seq_lens[:, None, None]
    group = heads // shape["kv_heads"]
    own = torch.einsum("bkgn,bnkd->bkgd", counts.view(batch, -1, group, n).float(), v.float()) / shape["budget"]
    return {"plan": plan.name, "every_head_draws_S": bool((counts.sum(-1) == shape["budget"]).all()),
            "no_sample_past_len": bool((counts * beyond).sum() == 0),
            "rows_equal_to_santa": float((counts == santa_counts).all(-1).float().mean()),
            "samples_moved": int((counts - santa_counts).abs().sum()) // 2,
            "max_abs_diff_to_own_counts": float((out.float() - own.reshape(out.shape)).abs().max())}


def check_offset_in_memory(*, shape: dict, inputs: tuple, santa_plan, product) -> dict | None:
    """santa's default prop (the one-launch kernel, through ``DecodePlan.run``) with one seed, the offset in device
    memory (graph replay) and every sequence at full length, against the two-launch prop on the same arguments."""
    if product.one_launch is None:
        return None
    q, k, v = inputs
    batch, heads, n = shape["batch"], shape["heads"], shape["n"]
    offset = torch.tensor([2**33 + 5], dtype=torch.int64, device="cuda")
    want = torch.zeros(batch, heads, n, dtype=torch.int32, device="cuda")
    santa_plan.run(q, k, v, seed=SEED, offset=offset, counts=want)
    counts = torch.zeros_like(want)
    product.run(q, k, v, seed=SEED, offset=offset, counts=counts)
    torch.cuda.synchronize()
    return {"every_head_draws_S": bool((counts.sum(-1) == shape["budget"]).all()),
            "rows_equal_to_santa": float((counts == want).all(-1).float().mean()),
            "samples_moved": int((counts - want).abs().sum()) // 2}


def one_launch(kernels: Kernels, plan, shape: dict, kernel: str | None = None) -> OneLaunch:
    """santa's OneLaunch on the benchmark's module (with the phase kernels) and this ``plan``."""
    return OneLaunch(batch=shape["batch"], heads=shape["heads"], kv_heads=shape["kv_heads"], head_dim=shape["dim"],
                     n_keys=shape["n"], budget=shape["budget"], scale=shape["dim"] ** -0.5, device=torch.device("cuda"),
                     module=kernels, plan=plan, kernel=kernel)


def run_plan(kernels: Kernels, flusher: Flusher, plan, *, shape: dict, inputs: tuple, santa: tuple) -> dict:
    """One plan (``one_launch.Plan``): checked against santa's counts and output and its own counts, timed with its
    phases, and its phase marks; a refused launch is the row's error."""
    q, k, v, uniforms = inputs
    santa_counts, santa_out = santa
    batch, heads, dim, n, budget = shape["batch"], shape["heads"], shape["dim"], shape["n"], shape["budget"]
    kv_heads = shape["kv_heads"]
    group = heads // kv_heads
    works, grid = plan.works, plan.grid
    row = {"slices": min(w.slices for w in works), "slice_len": max(w.slice_len for w in works),
           "shared_bytes": plan.shared(group_size=group, dim=dim, budget=budget), "grid": grid, "rounds": len(plan.rounds),
           "slice_counts": sorted({w.slices for w in works})}
    try:  # per kernel (the full one and its phases): its own buffers
        props = {name: one_launch(kernels, plan, shape, kernel=name) for name in phase_names(plan.kernel)}
    except (RuntimeError, ValueError) as exc:  # too much shared memory, too few CTAs resident, or a broken context
        row["error"] = str(exc)
        return row
    prop = props[plan.kernel]
    row["sm_paired"] = prop.paired
    out = torch.empty_like(q)
    counts = torch.zeros(batch, heads, n, dtype=torch.int32, device="cuda")

    def launch(with_counts: bool, name: str = plan.kernel, marks: torch.Tensor | None = None) -> None:
        props[name].run(q, k, v, out=out, strides=(k.stride(0), k.stride(1), k.stride(2)), uniforms=uniforms,
                        counts=counts if with_counts else None, marks=marks)

    started = time.perf_counter()
    try:
        counts.zero_()
        clear_hang_report(kernels)
        launch(True)
        torch.cuda.synchronize()
        if hang := hang_report(kernels, (prop.own_buffers().stats, prop.own_buffers().sampled), group=group, slots=plan.slots, budget=budget):
            row["error"] = "a tagged-word wait gave up"
            row["hang"] = hang
            clear_hang_report(kernels)
            return row
        first = out.clone()
        launch(False)
        torch.cuda.synchronize()
        row["repeat_bitwise_equal"] = bool(torch.equal(first, out))
        row["epochs_count_launches"] = bool((prop.own_buffers().epoch == 2).all())
        row["every_head_draws_S"] = bool((counts.sum(-1) == budget).all())
        row["rows_equal_to_santa"] = float((counts == santa_counts).all(-1).float().mean())
        row["samples_moved"] = int((counts - santa_counts).abs().sum()) // 2
        row["max_abs_out_diff"] = float((first.float() - santa_out.float()).abs().max())
        # the output against its own draw: Σ_j counts_j · v_j / S in float32 (the gather and its sum, exactly checked)
        own = torch.einsum("bkgn,bnkd->bkgd", counts.view(batch, kv_heads, group, n).float(), v.float()) / budget
        row["max_abs_diff_to_own_counts"] = float((first.float() - own.reshape(batch, heads, dim)).abs().max())
        try:
            row["us"] = time_fn(lambda: launch(False), flusher.read, graph=True)["median_us"]
        except RuntimeError as exc:  # a cooperative launch that a graph cannot capture: say so, time it eagerly
            row["graph_error"] = str(exc)
            row["eager_us"] = time_fn(lambda: launch(False), flusher.read)["median_us"]
            return row
        for stage, name in zip(("prop1s1", "prop1s2"), phase_names(plan.kernel)[1:], strict=True):  # stream + publish; + the stats exchange and placement
            try:
                row[f"{stage}_us"] = time_fn(lambda name=name: launch(False, name), flusher.read, graph=True)["median_us"]
            except RuntimeError as exc:
                row[f"{stage}_error"] = str(exc)
        marks = torch.zeros(len(plan.rounds) * grid, 9, 2, dtype=torch.int64, device="cuda")
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
    stats, sampled = buffers
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


def measure_or_error(kernels: Kernels, flusher: Flusher, plans: set[str] | None = None, budget: int = BUDGET, **shape) -> dict:
    """:func:`measure_case`, or the error it raised as the record: one bad case must not hide the others."""
    try:
        return measure_case(kernels, flusher, plans=plans, budget=budget, **shape)
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
    parser.add_argument("--budget", type=int, default=BUDGET, help=f"S, samples per head (default {BUDGET})")
    parser.add_argument("--ptx", action="store_true",
                        help="load the kernels as PTX compiled by the driver at load time (no cubin from nvcc's ptxas)")
    args = parser.parse_args()
    cases = [case for case in CASES if args.only is None or slug(case[0]) in args.only]
    if args.plans:  # a record of some plans is not the case's record: its own key, so neither run skips the other
        cases = [(f"{name} [plans {' '.join(sorted(args.plans))}]", *shape) for name, *shape in cases]
    if args.budget != BUDGET:
        cases = [(f"{name} S={args.budget}", *shape) for name, *shape in cases]
    module = Path("/tmp/santa_one_launch.ptx" if args.ptx else "/tmp/santa_one_launch.cubin")
    run_cases(args.out, cases=cases, cubin=module, commit=args.commit,
              measure=functools.partial(measure_or_error, plans=set(args.plans) if args.plans else None, budget=args.budget),
              holder="cuda_one_launch_check.py", describe=describe)


def describe(name: str, case: dict) -> str:
    """One line per case: santa's prop, then per plan the time, its phases and the check."""
    if "error" in case:
        return f"{name}: {case['error']}"
    parts = [f"{name}: two-launch prop {case['santa_prop_us']:.1f} µs, santa's default "
             f"{case.get('santa_one_launch_us', float('nan')):.1f} ({case.get('santa_plan')}), cuDNN {case.get('cudnn_us', float('nan')):.1f}"]
    if case.get("offset_in_memory"):
        off = case["offset_in_memory"]
        parts.append(f"default prop, offset in memory: equal {off['rows_equal_to_santa']:.2f} moved {off['samples_moved']} "
                     f"S {off['every_head_draws_S']}")
    if "positional" in case:
        pos = case["positional"]
        parts.append(f"positional draw, ragged lengths ({pos['plan']}): equal {pos['rows_equal_to_santa']:.2f} moved "
                     f"{pos['samples_moved']} S {pos['every_head_draws_S']} in-length {pos['no_sample_past_len']} "
                     f"out-own {pos['max_abs_diff_to_own_counts']:.4f}")
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
