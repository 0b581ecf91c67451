"""HF ``generate()`` ms/token with santa's attention against dense SDPA, on a random-weight model of a real
model's shape (bf16, CUDA): the loop transformers users run.

Two ways to run ``generate()``:
- ``--cache dynamic`` (eager, transformers' default cache);
- ``--cache static --compile`` (one ``StaticCache`` of fixed length per batch size, reused and reset, so
  nothing recompiles between calls; the decode forward compiled by transformers with
  ``CompileConfig(fullgraph=True, mode="reduce-overhead", dynamic=False)``: CUDA graphs underneath).

Backends: ``sdpa`` (``attn_implementation="sdpa"``) and ``santa-prop`` (``santa.hf.configure`` with
systematic S=128: the prop kernel through the ``santa::decode`` custom op).
ms/token = (t(LONG new tokens) − t(SHORT)) / (LONG − SHORT), median of 3 after one warm-up pair, so the
prefill cancels. Weights are random: the time of a step does not depend on their values.
Writes JSON (rewritten after every case, so a crash keeps what finished).

    python benchmarks/kernels/hf_generate.py --out hf.json --shape llama-3.1-8b --lengths 30000 --batches 1 6 \\
        --cache static --compile
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, StaticCache

import santa.hf
from santa.provenance import run_record

SHAPES = {  # the transformers configs of the shapes santa.model benchmarks (santa.model.CONFIGS)
    "llama-3.1-8b": (LlamaForCausalLM, LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=131072, rope_theta=500000.0)),
    "qwen2.5-0.5b": (Qwen2ForCausalLM, Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True)),
    "tiny": (LlamaForCausalLM, LlamaConfig(  # a smoke test of this script (runs on CPU: --device cpu)
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=4096)),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--lengths", type=int, nargs="+", default=[30000], help="prompt tokens")
    parser.add_argument("--batches", type=int, nargs="+", default=[1])
    parser.add_argument("--cache", choices=("dynamic", "static"), default="static")
    parser.add_argument("--compile", action="store_true", help="compile the decode forward (static cache only)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--short", type=int, default=8)
    parser.add_argument("--long", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="+", choices=("sdpa", "santa-prop"), default=["sdpa", "santa-prop"],
                        help="which to time (the speed-up is written only when both run)")
    parser.add_argument("--profile", help="also profile one generate(LONG) per backend (torch.profiler): "
                        "top CUDA kernels and GPU-busy time per token, written to this text file")
    args = parser.parse_args()
    if args.compile and args.cache != "static":
        parser.error("--compile needs --cache static (transformers compiles only with a static cache)")
    if not 0 < args.short < args.long:
        parser.error(f"--short and --long must satisfy 0 < short < long, got {args.short} and {args.long}")
    return args


def use_backend(model: torch.nn.Module, backend: str, budget: int) -> None:
    if backend == "sdpa":
        model.set_attn_implementation("sdpa")
    else:
        santa.hf.configure(model, santa.hf.SantaConfig(sampler="systematic", budget=budget, kernel="prop"))
    torch._dynamo.reset()  # a fresh compile per backend and batch: no guard failures mid-timing
    if hasattr(model, "_compiled_call"):
        del model._compiled_call


def profile_generate(timed, args: argparse.Namespace, label: str) -> dict:
    """generate(SHORT) and generate(LONG) under torch.profiler: per decode token (their difference over
    LONG − SHORT, so the prefill cancels) the wall time against the summed time of the CUDA kernels (GPU
    busy); the top kernels of the LONG run are appended to ``args.profile``."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    runs = {}
    for new_tokens in (args.short, args.long):
        with torch.profiler.profile(activities=activities) as profile:
            wall_s, _ = timed(new_tokens)
        kernels = [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        runs[new_tokens] = (wall_s * 1e3, sum(e.device_time for e in kernels) / 1e3, len(kernels))
    steps = args.long - args.short
    result = {
        "wall_ms_per_token": (runs[args.long][0] - runs[args.short][0]) / steps,
        "kernel_ms_per_token": (runs[args.long][1] - runs[args.short][1]) / steps,
        "launches_per_token": (runs[args.long][2] - runs[args.short][2]) / steps,
    }
    table = profile.key_averages().table(sort_by="device_time_total", row_limit=25)
    with open(args.profile, "a") as f:
        f.write(f"\n== {label}: per decode token (profiled) {result}\n{table}\n")
    return result


def main() -> None:
    args = parse_args()
    model_class, config = SHAPES[args.shape]
    torch.manual_seed(0)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with device:
        model = model_class(config).to(torch.bfloat16).eval()
    generate_kwargs = dict(do_sample=False, pad_token_id=0)
    if args.compile:
        generate_kwargs["compile_config"] = CompileConfig(fullgraph=True, mode="reduce-overhead", dynamic=False)
    results = {
        "run": run_record(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else args.device, "torch": torch.__version__, "transformers": transformers.__version__,
        "shape": args.shape, "cache": args.cache, "compile": args.compile, "budget": args.budget,
        "short": args.short, "long": args.long, "cases": [],
    }
    for n in args.lengths:
        for batch in args.batches:
            ids = torch.randint(0, config.vocab_size, (batch, n), generator=torch.Generator().manual_seed(n)).to(device)
            cache = StaticCache(config=model.config, max_cache_len=n + args.long) if args.cache == "static" else None

            def timed(new_tokens: int, cache=cache, ids=ids) -> tuple[float, torch.Tensor]:
                kwargs = dict(generate_kwargs)
                if cache is not None:
                    cache.reset()
                    kwargs["past_key_values"] = cache
                sync()
                start = time.perf_counter()
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
                sync()
                return time.perf_counter() - start, out

            case = {"prompt_tokens": n, "batch": batch}
            for backend in args.backends:
                use_backend(model, backend, args.budget)
                per_token = []
                with torch.inference_mode():
                    start = time.perf_counter()
                    timed(args.short), timed(args.long)  # warm-up: compilation, CUDA graphs, plans, allocator
                    warm_up_s = time.perf_counter() - start
                    for _ in range(args.repeats):
                        t_short, _ = timed(args.short)
                        t_long, out = timed(args.long)
                        per_token.append((t_long - t_short) / (args.long - args.short) * 1e3)
                    if args.profile:
                        case[f"{backend}_profile"] = profile_generate(timed, args, f"{args.shape} n={n} B={batch} {backend}")
                case[backend] = {"ms_per_token_median": statistics.median(per_token), "ms_per_token_all": per_token,
                                 "warm_up_s": warm_up_s, "tokens_row0": out[0, n:].tolist()}
                print(f"{args.shape} n={n} B={batch} {args.cache}{' compiled' if args.compile else ''} {backend:12s} "
                      f"{statistics.median(per_token):8.3f} ms/token {[round(x, 3) for x in per_token]} (warm-up {warm_up_s:.0f} s)",
                      flush=True)
            if "sdpa" in case and "santa-prop" in case:
                case["speedup"] = case["sdpa"]["ms_per_token_median"] / case["santa-prop"]["ms_per_token_median"]
            results["cases"].append(case)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
            cache = None  # free the static cache before the next batch size
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
