"""One prop decode call, run three times: what ``ncu -k regex:_prop_`` (the Triton launches) or ``regex:^prop1`` (the
one-launch CUDA prop) profiles.

    ncu --section SpeedOfLight ... python benchmarks/kernels/ncu_drive.py BATCH KEYS HEADS KV_HEADS DIM BUDGET [PAGE]

PAGE: a paged NHD cache of PAGE keys per page, shuffled over the pool (as vLLM's), instead of a contiguous one.
"""

import sys

import torch

from santa.kernels import plan_decode

batch, n_keys, heads, kv_heads, dim, budget = (int(x) for x in sys.argv[1:7])
page = int(sys.argv[7]) if len(sys.argv) > 7 else None
q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
k = torch.randn(batch, n_keys, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
table = None
if page is not None:
    pages = batch * n_keys // page
    order = torch.randperm(pages, device="cuda")
    k_pages, v_pages = torch.empty(pages, page, kv_heads, dim, device="cuda", dtype=k.dtype), torch.empty(pages, page, kv_heads, dim, device="cuda", dtype=k.dtype)
    k_pages[order], v_pages[order] = k.reshape(pages, page, kv_heads, dim), v.reshape(pages, page, kv_heads, dim)
    table = order.reshape(batch, n_keys // page).to(torch.int32)
    k, v = k_pages, v_pages
plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget, dtype=q.dtype,
                   device="cuda", page_size=page)
print(f"plan: {plan.implementation}", flush=True)
out = torch.empty_like(q)
seq_lens = torch.full((batch,), n_keys, dtype=torch.int32, device="cuda")
for _ in range(3):
    plan.run(q, k, v, out=out, seq_lens=seq_lens, block_table=table)
torch.cuda.synchronize()
