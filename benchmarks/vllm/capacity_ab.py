"""What a large ``max_model_len`` costs santa's decode in vLLM when the sequences are short: the backend plans
for ``max_model_len`` keys (CUDA graphs fix the grid), so pass 1 launches a program per 128-key tile of the
capacity and the programs past a sequence's length exit at once. This times that step against the same
step planned for exactly the sequences' length.

    python benchmarks/vllm/capacity_ab.py OUT.json

Llama-3.1-8B shapes (32 / 8 heads, d = 128), vLLM's packed FlashAttention cache in pages of 16 keys shuffled over
the pool, S = 128, bf16, through santa.vllm.decode.PagedDecoder (what the backend calls): sequences of 2k and
8k keys at batch 1, 16 and 64 with capacities 32k and 128k, and the tight capacity (= the length); CUDA-graph
replay, clean cold L2, medians (benchmarks/bench/timing.py). The JSON is rewritten after every case.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.bench.timing import Flusher, time_fn  # noqa: E402

HEADS, KV_HEADS, DIM, BLOCK, BUDGET = 32, 8, 128, 16, 128
LENGTHS, BATCHES, CAPACITIES = (2048, 8192), (1, 16, 64), (32768, 131072)


def step_us(batch: int, length: int, capacity: int, flusher: Flusher) -> float:
    """Median µs of one decode step: ``batch`` sequences of ``length`` keys, planned for ``capacity`` keys."""
    from santa.vllm.decode import PagedDecoder

    torch.manual_seed(0)
    pages = length // BLOCK
    n_pages = batch * pages
    packed = torch.randn(n_pages, BLOCK, KV_HEADS, 2 * DIM, device="cuda", dtype=torch.bfloat16)
    kv_cache = packed.permute(0, 2, 1, 3)  # vLLM's logical (num_blocks, H_kv, block_size, 2·D)
    table = torch.zeros(batch, capacity // BLOCK, dtype=torch.int32, device="cuda")  # unused columns: page 0, as vLLM's
    table[:, :pages] = torch.randperm(n_pages, device="cuda").to(torch.int32).reshape(batch, pages)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    decoder = PagedDecoder(heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, block_size=BLOCK, max_keys=capacity,
                           max_batch=batch, budget=BUDGET, kernel="prop", seed=0, dtype=torch.bfloat16,
                           kv_dtype=torch.bfloat16, device="cuda")
    decoder.allocate()
    positions = decoder.positions(seq_lens)

    def step():
        decoder.run(q, kv_cache, seq_lens=seq_lens, block_table=table, layer=0, scale=DIM**-0.5, out=out,
                    positions=positions)

    return time_fn(step, flusher.read, graph=True)["median_us"]


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    flusher = Flusher("cuda")
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for length in LENGTHS:
        for batch in BATCHES:
            entry = {"length": length, "batch": batch, "tight_us": step_us(batch, length, length, flusher)}
            for capacity in CAPACITIES:
                entry[f"capacity_{capacity}_us"] = step_us(batch, length, capacity, flusher)
            results["cases"].append(entry)
            print(json.dumps(entry), flush=True)
            with open(sys.argv[1] + ".part", "w") as f:
                json.dump(results, f, indent=1)
            os.replace(sys.argv[1] + ".part", sys.argv[1])


if __name__ == "__main__":
    main()
