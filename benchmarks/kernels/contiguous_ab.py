"""santa's decode step on a contiguous cache sized for more keys than its sequences hold (HF's static cache: a plan for
``max_cache_len``): the one launch on host-built rounds against the live schedule, in the same call (issue 39).

    python benchmarks/kernels/contiguous_ab.py OUT.jsonl [--quick] [--fp8] [--hf]

Each case: a contiguous NHD cache ``[B, capacity, H_kv, D]`` (bf16, or e4m3 with scales 0.5), sequences of ``length``
keys (``seq_lens``), S = 128, seed 0, positions ``length − 1``. Arms: ``plan`` (``plan_decode`` for ``capacity`` keys:
what its rule chose, ``plan_name``), ``rounds`` (``OneLaunch(live=False)``: host-built rounds sized by the capacity),
``live`` (``OneLaunch(live=True)``: the work derived from ``seq_lens`` in the launch), ``triton`` (``Tuning(one_launch=
False)``), and cuDNN SDPA on the live keys alone (bf16; a tight copy: what dense costs at best). ``live_outputs_close``:
live against rounds on the same draws (the same samples up to the float32 CDF order, which follows the slices).
CUDA-graph replay, clean cold L2, medians (benchmarks/bench/timing.py). The first line of OUT.jsonl records the command,
commit, device and versions; one line per case follows, appended as it is measured; a re-run skips the cases there.
Cases: Llama-3.1-8B (32 / 8 heads, d = 128) and Qwen2.5-0.5B (14 / 2, d = 64) on tight and loose plans.

``--hf`` (keys ``hf/…``, :data:`HF_CASES`): the calls santa.hf makes on transformers' static cache, an HND cache
``[B, H_kv, capacity, D]`` with ``starts`` (each row's left padding: row b pads ``b · pad`` keys, its run
``[b · pad, length)``), positions ``length − b · pad − 1``. Arms: ``plan`` (the one launch since 00f90f1: read as one
page a sequence by the paged kernels until the branch ``hnd-stream``, in place by the contiguous ones since, ``plan_name``), ``triton``, ``hnd_nostarts`` (the plan's call without ``starts``),
``nhd`` (the plan's call on the same keys copied to NHD, with ``starts``) and cuDNN on the tight unpadded keys; the
rounds and live arms are NHD-only and left out.
"""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.bench.case_log import add_case, cases_done, run_locked  # noqa: E402
from benchmarks.bench.timing import Flusher, time_fn  # noqa: E402

BUDGET = 128
MODELS = {"llama": (32, 8, 128), "qwen": (14, 2, 64)}  # heads, KV heads, head dim
FP8, FP8_SCALE = torch.float8_e4m3fn, 0.5


# --hf: (model, batch, length, capacity, pad): hf_generate.py's Llama 30k (B = 1, 6, 16; a static cache of the prompt and
# its 48 new tokens) and Qwen 32k (B = 1, 16), unpadded and with rows padded 37 keys apart
HF_CASES = [("llama", 1, 30000, 30048, 0), ("llama", 6, 30000, 30048, 0), ("llama", 6, 30000, 30048, 37),
            ("llama", 16, 30000, 30048, 37), ("qwen", 1, 32768, 32816, 0), ("qwen", 16, 32768, 32816, 37)]


def cases(quick: bool) -> list[tuple[str, int, int, int]]:
    """(model, batch, length, capacity), tight plans beside loose ones (an HF static cache of 32k or 128k keys)."""
    quick_cases = [("llama", 64, 2048, 2048), ("llama", 64, 2048, 32768), ("llama", 32, 32768, 32768),
                   ("llama", 1, 8192, 131072)]
    if quick:
        return quick_cases
    return quick_cases + [("llama", 16, 2048, 32768), ("llama", 8, 32768, 32768), ("llama", 16, 8192, 131072),
                          ("qwen", 16, 32768, 32768), ("qwen", 64, 2048, 32768), ("qwen", 16, 4096, 131072)]


def measure_case(model: str, batch: int, length: int, capacity: int, fp8: bool, flusher, pad: int | None = None) -> dict:
    """One case's arms (module docstring), timed on the same cache, query and draws; ``pad`` (not None): santa.hf's
    call (``--hf``), HND with ``starts``, rows padded ``b · pad`` keys."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from santa import rng
    from santa.kernels import Tuning, plan_decode
    from santa.kernels import one_launch as ol

    heads, kv_heads, dim = MODELS[model]
    torch.manual_seed(0)
    hf = pad is not None
    cache_shape = (batch, kv_heads, capacity, dim) if hf else (batch, capacity, kv_heads, dim)
    k, v = (torch.randn(*cache_shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    if fp8:
        k, v = k.to(FP8), v.to(FP8)
    q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    runs = {}
    if hf:
        starts = torch.arange(batch, dtype=torch.int32, device="cuda") * pad
        runs = dict(starts=starts)
        positions = seq_lens - starts - 1
    else:
        positions = seq_lens - 1
    scales = dict(k_scale=FP8_SCALE, v_scale=FP8_SCALE) if fp8 else {}
    seed = rng.layer_key(0, 0)
    entry = {"model": model, "batch": batch, "length": length, "capacity": capacity, "fp8": fp8,
             **({"layout": "HND", "pad": pad} if hf else {})}
    call = dict(positions=positions, **runs)
    arms = [("plan", None, "HND" if hf else "NHD", k, v, call),
            ("triton", Tuning(one_launch=False), "HND" if hf else "NHD", k, v, call)]
    if hf:  # the same call without starts, and on the same keys laid out NHD (with starts): which of the two costs the
        # one launch time against the contiguous NHD figures (issue 39: Qwen 1 x 32k took 19.2 us here, 15.5 NHD on the H200)
        # (the copy lives to the case's end: Llama 16 x 30k's caches, their NHD copy and cuDNN's tight one take about 6 GB)
        k_nhd, v_nhd = (x.transpose(1, 2).contiguous() for x in (k, v))
        arms += [("hnd_nostarts", None, "HND", k, v, dict(positions=seq_lens - 1)),
                 ("nhd", None, "NHD", k_nhd, v_nhd, call)]
    for name, tuning, layout, keys, values, arguments in arms:
        plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=capacity, budget=BUDGET,
                           dtype=torch.bfloat16, kv_dtype=k.dtype, device="cuda", tuning=tuning, kv_layout=layout)
        out = torch.empty_like(q)

        def planned(plan=plan, out=out, keys=keys, values=values, arguments=arguments):
            plan.run(q, keys, values, seq_lens=seq_lens, seed=seed, out=out, **arguments, **scales)

        entry[f"{name}_us"] = time_fn(planned, flusher.read, graph=True)["median_us"]
        if name != "triton":
            entry["plan_name" if name == "plan" else f"{name}_plan"] = plan.implementation
    if hf:
        entry["plan_over_triton"] = entry["plan_us"] / entry["triton_us"]
    outs = {}
    for name, live in () if hf else (("rounds", False), ("live", True)):
        try:
            launch = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=capacity, budget=BUDGET,
                                  scale=dim**-0.5, device=torch.device("cuda"), fp8=fp8, live=live)
        except ValueError as error:
            entry[f"{name}_error"] = str(error)
            continue
        out = torch.empty_like(q)

        def step(launch=launch, out=out):
            launch.run(q, k, v, out=out, strides=ol.cache_strides(k, v, "NHD"), seq_lens=seq_lens, seed=seed,
                       positions=positions, **scales)

        step()  # its own buffers, before the graph's capture
        entry[f"{name}_us"] = time_fn(step, flusher.read, graph=True)["median_us"]
        entry[f"{name}_plan"] = launch.plan.name
        outs[name] = out.float()
    if len(outs) == 2:
        entry["live_over_rounds"] = entry["live_us"] / entry["rounds_us"]
        entry["live_outputs_close"] = bool(torch.allclose(outs["live"], outs["rounds"], atol=0.25, rtol=0.1))
    if hf:  # cuDNN on the unpadded length of every row: what dense costs at best
        kd, vd = ((x[:, :, :length].float() * FP8_SCALE).to(torch.bfloat16) if fp8 else x[:, :, :length].contiguous()
                  for x in (k, v))
    else:
        kd, vd = ((x[:, :length].float() * FP8_SCALE).to(torch.bfloat16) if fp8 else x[:, :length] for x in (k, v))
        kd, vd = kd.transpose(1, 2).contiguous(), vd.transpose(1, 2).contiguous()
    q4 = q.unsqueeze(2)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True)

    entry["cudnn_tight_us"] = time_fn(cudnn, flusher.read, graph=True)["median_us"]
    return entry


def measure(path: str, quick: bool, fp8: bool, hf: bool = False) -> None:
    done = cases_done(path)
    flusher = Flusher("cuda")
    chosen = HF_CASES if hf else [(*case, None) for case in cases(quick)]
    for model, batch, length, capacity, pad in chosen:
        key = ("hf/" if hf else "") + ("fp8/" if fp8 else "") + f"{model}/b{batch}/n{length}/cap{capacity}" + (
            f"/pad{pad}" if hf else "")
        if key in done:
            continue
        entry = {"key": key, **measure_case(model, batch, length, capacity, fp8, flusher, pad)}
        add_case(path, entry)
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="JSONL file (resumed where it exists)")
    parser.add_argument("--quick", action="store_true", help="four Llama cases only")
    parser.add_argument("--fp8", action="store_true", help="e4m3 caches")
    parser.add_argument("--hf", action="store_true", help="santa.hf's calls: HND with starts (HF_CASES, keys hf/…)")
    args = parser.parse_args()
    if args.hf and args.quick:
        parser.error("--hf has its own cases: leave --quick out")
    run_locked(args.out, "contiguous_ab.py", lambda: measure(args.out, args.quick, args.fp8, args.hf))


if __name__ == "__main__":
    main()
