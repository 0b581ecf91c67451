"""Issue 42's speed target: an error-target step against fixed S at equal mean V rows read, in the same call.

    python benchmarks/kernels/error_target_speed.py OUT.jsonl [--cap 256] [--targets 0.12 0.19 0.3]

For each shape (Llama-3.1-8B: 8k, 32k, B = 8 and 32 × 32k, B = 16 × 30k; Qwen2.5-0.5B: B = 16 × 32k) and each ε:
one eager call with counts gives every row's realised budget S_r (the counts' row sums); the rows a step reads are
S₀ + S_r per head (the pilot's 16 included). Then, CUDA-graph replay, clean cold L2, 10 warm-ups, 40 timed, medians
(benchmarks/bench/timing.py), on the same inputs:
- ``target_us``: the plan with ``error_target=ε`` and ``budget=cap`` (the Triton prop; sized by the cap);
- ``fixed_triton_us``: a plan with the fixed budget S = round(mean reads), run with its workspace (the Triton launches:
  like for like);
- ``fixed_default_us``: the same plan as santa's default path runs it (the one launch where the plan has it);
- ``cudnn_us``: cuDNN SDPA, the dense anchor.
The issue's target: target_us ≤ 1.05 × the fixed budget's time at equal mean reads.

Values: V = μ_h + N(0, 1) per KV head with μ_h's entries in {0.25, 0.5, 1, 2} (so heads ask for different budgets:
relative variance ≈ 1/μ², flat-ish scores), K = 0.7·N(0, 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, ".")
from benchmarks.bench.timing import Flusher, time_fn  # noqa: E402

from santa.error_target import DEFAULT_PILOT
from santa.provenance import run_record
from santa.sweep_files import SweepFileError, append_record, read_records, sweep_lock

READ_BW = 4.5e12
CASES = [  # (model, batch, n_keys, heads, kv_heads, head_dim)
    ("llama", 1, 8192, 32, 8, 128), ("llama", 1, 32768, 32, 8, 128), ("llama", 8, 32768, 32, 8, 128),
    ("llama", 16, 30720, 32, 8, 128), ("llama", 32, 32768, 32, 8, 128), ("qwen", 16, 32768, 14, 2, 64),
]
MEANS = (0.25, 0.5, 1.0, 2.0)


def inputs(batch, n_keys, heads, kv_heads, dim):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, heads, dim, device="cuda", generator=g).bfloat16()
    k = (0.7 * torch.randn(batch, n_keys, kv_heads, dim, device="cuda", generator=g)).bfloat16()
    mu = torch.tensor([MEANS[h % len(MEANS)] for h in range(kv_heads)], device="cuda").view(1, 1, kv_heads, 1)
    v = (torch.randn(batch, n_keys, kv_heads, dim, device="cuda", generator=g) + mu).bfloat16()
    return q, k, v


def time_case(batch, n_keys, heads, kv_heads, dim, cap, targets, flusher) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from santa.kernels import plan_decode

    q, k, v = inputs(batch, n_keys, heads, kv_heads, dim)
    lens = torch.full((batch,), n_keys, dtype=torch.int32, device="cuda")
    positions = lens - 1
    out = torch.empty_like(q)
    q4, k4, v4 = q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True)

    entry = {"cudnn_us": time_fn(cudnn, flusher.read, graph=True)["median_us"], "dense_floor_us": 2 * k.numel() * 2 / READ_BW * 1e6,
             "targets": []}
    def timed(plan, **extra) -> float:  # one plan's step, graph replay, median µs
        return time_fn(lambda: plan.run(q, k, v, seq_lens=lens, positions=positions, out=out, **extra), flusher.read,
                       graph=True)["median_us"]

    shape = dict(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, dtype=q.dtype, device="cuda")
    for eps in targets:
        plan = plan_decode(budget=cap, error_target=eps, **shape)
        counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
        plan.run(q, k, v, seq_lens=lens, positions=positions, out=out, counts=counts)
        budgets = counts.sum(-1).float()  # S_r per (sequence, head)
        reads = budgets + DEFAULT_PILOT
        row = {"error_target": eps, "cap": cap, "mean_budget": budgets.mean().item(), "mean_reads": reads.mean().item(),
               "share_at_cap": (budgets == cap).float().mean().item(),
               "budget_by_kv_head": budgets.view(batch, kv_heads, -1).mean((0, 2)).tolist()}
        del counts
        row["target_us"] = timed(plan)
        fixed = max(1, round(row["mean_reads"]))
        fixed_plan = plan_decode(budget=fixed, **shape)
        row["fixed_budget"] = fixed
        row["fixed_default_one_launch"] = fixed_plan.one_launch is not None
        row["fixed_default_us"] = timed(fixed_plan)
        row["fixed_triton_us"] = timed(fixed_plan, workspace=fixed_plan.workspace)  # a workspace given: the Triton launches
        row["target_over_fixed_triton"] = row["target_us"] / row["fixed_triton_us"]
        row["target_over_fixed_default"] = row["target_us"] / row["fixed_default_us"]
        entry["targets"].append(row)
        print(json.dumps({key: round(x, 3) if isinstance(x, float) else x for key, x in row.items() if key != "budget_by_kv_head"}),
              flush=True)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a JSONL sweep file: one record per shape; a re-run times only what it lacks")
    parser.add_argument("--cap", type=int, default=256)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.12, 0.19, 0.3])
    args = parser.parse_args(argv)
    try:
        with sweep_lock(args.out, holder="error_target_speed.py"):  # a second writer is refused at once
            time_cases(args)
    except SweepFileError as error:
        print(f"error_target_speed.py: error: {error}", file=sys.stderr)
        return 1
    return 0


def time_cases(args: argparse.Namespace) -> None:
    """Each shape not yet in ``args.out`` with these settings, one record as it finishes (a cut-off call keeps what it
    measured, and a re-run resumes after it), after a provenance record per invocation."""
    settings = f"cap{args.cap}/eps{','.join(f'{t:g}' for t in args.targets)}"
    done = {record["key"] for record in read_records(args.out)} if args.out.exists() else set()
    todo = [case for case in CASES if f"{case[0]}/b{case[1]}/n{case[2]}/{settings}" not in done]
    if not todo:
        return
    run = run_record()
    append_record(args.out, {"key": f"run/{run['date']}", **run, "device": torch.cuda.get_device_name()})
    flusher = Flusher("cuda")
    for model, batch, n_keys, heads, kv_heads, dim in todo:
        name = f"{model}/b{batch}/n{n_keys}/{settings}"
        print(name, flush=True)
        entry = time_case(batch, n_keys, heads, kv_heads, dim, args.cap, args.targets, flusher)
        append_record(args.out, {"key": name, "cap": args.cap, "commit": run["commit"], **entry})
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
