"""Attention of a whole decode step's layers back to back, without the rest of the step: why does
``santa bench e2e`` charge prop more per layer than the kernel benchmark does (Qwen2.5-0.5B shapes,
B = 16 × 32k: 71.1 µs per layer end to end against 65.6 in isolation, cuDNN 68.5 against 70.1)?

One CUDA graph replays L layers' attention calls on L separate caches (as ``santa.model`` lays them
out: NHD ``[B, L_max, H_kv, d]``, sequences of ``prompt`` keys), with the rest of the step left out.
Timed per layer (graph replay ÷ L, median of 20, no L2 flush: the regime of a decode step), and
the first layer alone after a cold-L2 flush (the kernel benchmark's regime):

- ``sdpa``: cuDNN SDPA with the model's −inf bias (``santa.model``'s dense backend)
- ``santa``: ``santa.kernels.decode`` as the model calls it (seq_lens, device offset, one workspace)
- ``santa_ws_per_layer``: the same with a workspace per layer (the stash of one layer is not the next's)
- ``santa_int_offset``: an int offset instead of the device tensor
- ``santa_plan_run``: ``plan.run`` with a preallocated ``out``
- ``…_no_discard``: ``Tuning(discard_stash=False)``: pass 2 leaves the dead stash in L2 (dirty)

    python -m benchmarks.kernels.layer_sequence OUT.json [--batch 16 --prompt 32000 --cache 32256 --layers 24 …]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from benchmarks.bench.timing import captured

from santa.provenance import run_record


def graph_us(fn, *, replays: int = 20, flush=None) -> float:
    """Median µs of one replay of a graph of ``fn`` (``flush`` before each replay, outside the events)."""
    graph = captured(fn, warmups=2)
    times = []
    for _ in range(replays + 3):
        if flush is not None:
            flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times[3:])


def main(argv=None) -> int:
    from benchmarks.bench.kernels import Flusher

    from santa.kernels import Tuning, decode, make_workspace, plan_decode
    from santa.model import visibility_bias

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=32000)
    parser.add_argument("--cache", type=int, default=32256)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--budget", type=int, default=128)
    args = parser.parse_args(argv)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    shape = (args.batch, args.cache, args.kv_heads, args.head_dim)
    caches = [(torch.randn(shape, device=dev, dtype=dtype), torch.randn(shape, device=dev, dtype=dtype)) for _ in range(args.layers)]
    q = torch.randn(args.batch, args.heads, args.head_dim, device=dev, dtype=dtype)
    seq_lens = torch.full((args.batch,), args.prompt, dtype=torch.int32, device=dev)
    offset = torch.zeros(1, dtype=torch.int64, device=dev)
    bias = visibility_bias(seq_lens, args.cache, dtype)
    out = torch.empty_like(q)
    shared = make_workspace(q, caches[0][0], args.budget)
    per_layer = [make_workspace(q, k, args.budget) for k, _ in caches]
    shape = dict(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, n_keys=args.cache,
                 budget=args.budget, dtype=dtype, device=dev)
    plan = plan_decode(**shape)
    kept = plan_decode(**shape, tuning=Tuning(discard_stash=False))

    def layer_calls(name):
        if name == "sdpa":
            return [lambda k=k, v=v: F.scaled_dot_product_attention(
                q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias, enable_gqa=True) for k, v in caches]
        if name == "santa":
            return [lambda k=k, v=v, i=i: decode(q, k, v, args.budget, seq_lens=seq_lens, seed=i, offset=offset, workspace=shared)
                    for i, (k, v) in enumerate(caches)]
        if name == "santa_ws_per_layer":
            return [lambda k=k, v=v, i=i: decode(q, k, v, args.budget, seq_lens=seq_lens, seed=i, offset=offset, workspace=per_layer[i])
                    for i, (k, v) in enumerate(caches)]
        if name == "santa_int_offset":
            return [lambda k=k, v=v, i=i: decode(q, k, v, args.budget, seq_lens=seq_lens, seed=i, offset=0, workspace=shared)
                    for i, (k, v) in enumerate(caches)]
        if name == "santa_no_discard":
            return [lambda k=k, v=v, i=i: kept.run(q, k, v, seq_lens=seq_lens, seed=i, offset=offset, out=out, workspace=shared)
                    for i, (k, v) in enumerate(caches)]
        if name == "santa_ws_per_layer_no_discard":
            return [lambda k=k, v=v, i=i: kept.run(q, k, v, seq_lens=seq_lens, seed=i, offset=offset, out=out, workspace=per_layer[i])
                    for i, (k, v) in enumerate(caches)]
        return [lambda k=k, v=v, i=i: plan.run(q, k, v, seq_lens=seq_lens, seed=i, offset=offset, out=out)
                for i, (k, v) in enumerate(caches)]

    flusher = Flusher(dev)
    results = {}
    for round_ in range(2):
        names = ["sdpa", "santa", "santa_no_discard", "santa_ws_per_layer", "santa_ws_per_layer_no_discard", "santa_plan_run"]
        for name in names if round_ == 0 else names[::-1]:
            calls = layer_calls(name)

            def step(calls=calls):
                for call in calls:
                    call()

            per_layer_us = graph_us(step) / len(calls)
            alone_cold = graph_us(calls[0], flush=flusher.read)
            alone_warm = graph_us(calls[0])
            results[f"{name}/r{round_}"] = {"per_layer_us": per_layer_us, "one_layer_cold_us": alone_cold, "one_layer_warm_us": alone_warm}
            print(f"{name:20s} r{round_}: per layer in a sequence of {len(calls)} {per_layer_us:7.1f} µs; one layer alone: "
                  f"cold L2 {alone_cold:7.1f}, warm {alone_warm:7.1f}", flush=True)
    Path(args.out).write_text(json.dumps({"run": run_record(), "args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
