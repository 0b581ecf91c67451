"""santa's prop on vLLM's packed FlashAttention cache (K and V interleaved per row: strided views) against the
same pages stored as separate contiguous K and V caches: does vLLM's layout cost santa's kernel anything?

    python benchmarks/vllm/layout_ab.py OUT.json

Llama-3.1-8B shapes (32 / 8 heads, d = 128), pages of 16 keys shuffled over the pool, S = 128, bf16:
batch 1 and 16 at 32k keys. The packed case runs through santa.vllm.decode.PagedDecoder (what the vLLM
backend calls), the contiguous one through a DecodePlan of the same shape; CUDA-graph replay, clean cold
L2, medians (benchmarks/bench/timing.py).
"""

from __future__ import annotations

import json
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.bench.timing import Flusher, time_fn  # noqa: E402

from santa.provenance import run_record

HEADS, KV_HEADS, DIM, BLOCK, BUDGET = 32, 8, 128, 16, 128


def paged_inputs(batch: int, n_keys: int, *, capacity: int | None = None):
    """``(packed, kv_cache, table, seq_lens, q)``: ``batch`` sequences of ``n_keys`` keys in pages of BLOCK keys
    shuffled over one pool, ``packed`` its physical rows ``[pages, BLOCK, H_kv, 2·D]`` and ``kv_cache`` vLLM's
    logical view of them ``(num_blocks, H_kv, block_size, 2·D)``; the block table ``capacity // BLOCK`` wide
    (default ``n_keys``; unused columns page 0, as vLLM's); one bf16 query per sequence. Seeded: the same
    inputs on every call."""
    torch.manual_seed(0)
    pages_per_seq = n_keys // BLOCK
    n_pages = batch * pages_per_seq
    packed = torch.randn(n_pages, BLOCK, KV_HEADS, 2 * DIM, device="cuda", dtype=torch.bfloat16)  # physical layout
    table = torch.zeros(batch, (capacity or n_keys) // BLOCK, dtype=torch.int32, device="cuda")
    table[:, :pages_per_seq] = torch.randperm(n_pages, device="cuda").to(torch.int32).reshape(batch, pages_per_seq)
    seq_lens = torch.full((batch,), n_keys, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    return packed, packed.permute(0, 2, 1, 3), table, seq_lens, q


def paged_decoder(max_batch: int, max_keys: int, tuning=None):
    """santa.vllm.decode.PagedDecoder for these shapes (prop S = BUDGET, seed 0), as the backend makes it
    (``tuning``: a santa.kernels.Tuning, the backend's defaults when None)."""
    from santa.vllm.decode import PagedDecoder

    return PagedDecoder(heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, block_size=BLOCK, max_keys=max_keys,
                        max_batch=max_batch, budget=BUDGET, kernel="prop", seed=0, dtype=torch.bfloat16,
                        kv_dtype=torch.bfloat16, device="cuda", tuning=tuning)


def case(batch: int, n_keys: int, flusher: Flusher) -> dict:
    from santa import rng
    from santa.kernels import plan_decode

    packed, kv_cache, table, seq_lens, q = paged_inputs(batch, n_keys)
    k_cache, v_cache = packed[..., :DIM].contiguous(), packed[..., DIM:].contiguous()
    out = torch.empty_like(q)
    decoder = paged_decoder(batch, n_keys)
    plan = plan_decode(batch=batch, heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, n_keys=n_keys, budget=BUDGET,
                       dtype=torch.bfloat16, device="cuda", kernel="prop", page_size=BLOCK)
    positions = seq_lens - 1
    scale = DIM**-0.5

    def vllm_layout():
        decoder.run(q, kv_cache, seq_lens=seq_lens, block_table=table, layer=0, scale=scale, out=out)

    def contiguous():
        plan.run(q, k_cache, v_cache, seq_lens=seq_lens, block_table=table, seed=rng.layer_key(0, 0), positions=positions,
                 out=out)

    vllm_layout()
    packed_out = out.clone()
    contiguous()
    same = bool(torch.equal(packed_out, out))
    floor = (k_cache.numel() * 2 + batch * HEADS * BUDGET * DIM * 2) / 4.5e12 * 1e6
    return {"batch": batch, "n_keys": n_keys, "floor_us": floor, "same_output": same,
            "packed_us": time_fn(vllm_layout, flusher.read, graph=True)["median_us"],
            "contiguous_us": time_fn(contiguous, flusher.read, graph=True)["median_us"]}


def main() -> None:
    flusher = Flusher("cuda")
    results = {"run": run_record(), "device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for batch in (1, 16):
        entry = case(batch, 32768, flusher)
        results["cases"].append(entry)
        print(json.dumps(entry), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
