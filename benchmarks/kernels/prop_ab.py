"""Same-call A/B of santa's prop kernel against an older santa tree, with cuDNN SDPA as the dense anchor.

    python benchmarks/kernels/prop_ab.py OUT.json LABEL

Times ``santa.kernels.decode(..., kernel="prop")`` (with a workspace: the Triton launches) and a plan's ``run`` with
per-sequence lengths and positions (the one-launch path where the plan has it; and with its workspace given: the
Triton launches, as vLLM and the compiled op call them) at S = 128 on the issue's shapes (Llama-3.1-8B:
8k, 32k, 128k, B = 8 and 32 × 32k; Qwen2.5-0.5B: 32k, B = 16 × 32k; SmolLM2-135M: 8k, B = 64 × 8k)
and cuDNN SDPA on the same inputs: CUDA-graph replay, clean cold L2 (a 512 MB read before each
call), 10 warm-ups, 40 timed, medians (benchmarks/bench/timing.py). Whichever ``santa`` is first on
``sys.path`` is timed, so one device call can run it twice: ``PYTHONPATH=.old/src`` for the old
tree, ``PYTHONPATH=src`` for this one (commit b8c9ca6 also timed the one-launch experiment's Tuning
variants with it). Floors: K and the sampled V rows at 4.5 TB/s (no launch cost).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

sys.path.insert(0, ".")  # benchmarks.bench.timing, whichever santa is on the path
from benchmarks.bench.timing import Flusher, run_record_of_this_checkout, time_fn  # noqa: E402

READ_BW = 4.5e12
CASES = [  # (model, batch, n_keys, heads, kv_heads, head_dim)
    ("llama", 1, 8192, 32, 8, 128), ("llama", 1, 32768, 32, 8, 128), ("llama", 1, 131072, 32, 8, 128),
    ("llama", 8, 32768, 32, 8, 128), ("llama", 32, 32768, 32, 8, 128),
    ("qwen", 1, 32768, 14, 2, 64), ("qwen", 16, 32768, 14, 2, 64),
    ("smollm2", 1, 8192, 9, 3, 64), ("smollm2", 64, 8192, 9, 3, 64),
]
def time_case(batch: int, n_keys: int, heads: int, kv_heads: int, dim: int, budget: int, flusher) -> dict:
    """One case's floors, cuDNN SDPA and santa prop graph-replay medians (µs) on the same inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from santa.kernels import decode, make_workspace

    torch.manual_seed(0)
    q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, n_keys, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    k_bytes = k.numel() * 2
    v_rows = batch * min(heads * budget, kv_heads * n_keys)
    entry = {"floor_us": (k_bytes + v_rows * dim * 2) / READ_BW * 1e6, "dense_floor_us": 2 * k_bytes / READ_BW * 1e6}
    q4, k4, v4 = q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True)

    entry["cudnn_us"] = time_fn(cudnn, flusher.read, graph=True)["median_us"]
    try:
        ws = make_workspace(q, k, budget, kernel="prop")
        out = torch.empty_like(q)
        entry["prop_us"] = time_fn(lambda: decode(q, k, v, budget, kernel="prop", out=out, workspace=ws), flusher.read,
                                   graph=True)["median_us"]
    except Exception as exc:  # a tree whose kernel does not launch here is recorded, not fatal
        entry["prop_error"] = f"{type(exc).__name__}: {exc}"[:300]
    try:  # the product path of santa.model, santa bench e2e and vLLM: a plan run with per-sequence lengths and positions
        from santa.kernels import plan_decode

        plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                           dtype=q.dtype, device="cuda")
        lens = torch.full((batch,), n_keys, dtype=torch.int32, device="cuda")
        positions = lens - 1
        out = torch.empty_like(q)
        entry["plan_lens_us"] = time_fn(lambda: plan.run(q, k, v, seq_lens=lens, positions=positions, out=out), flusher.read,
                                        graph=True)["median_us"]
        entry["plan_one_launch"] = plan.one_launch is not None
        ws = plan.workspace  # a workspace given to run: the Triton launches (as the compiled op and vLLM call them)
        entry["triton_lens_us"] = time_fn(lambda: plan.run(q, k, v, seq_lens=lens, positions=positions, out=out, workspace=ws),
                                          flusher.read, graph=True)["median_us"]
    except Exception as exc:
        entry["plan_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("label")
    parser.add_argument("--budget", type=int, default=128)
    args = parser.parse_args()
    import santa

    flusher = Flusher("cuda")
    results = {"run": run_record_of_this_checkout(), "label": args.label, "santa_path": santa.__file__, "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "budget": args.budget, "cases": {}}
    for model, batch, n_keys, heads, kv_heads, dim in CASES:
        name = f"{model}/b{batch}/n{n_keys}"
        entry = time_case(batch, n_keys, heads, kv_heads, dim, args.budget, flusher)
        results["cases"][name] = entry
        print(name, json.dumps({key: round(value, 1) if isinstance(value, float) else value for key, value in entry.items()}),
              flush=True)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
