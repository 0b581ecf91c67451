"""One prop decode call, run three times: what ``ncu -k regex:_prop_`` profiles.

    ncu --section SpeedOfLight ... python benchmarks/kernels/ncu_drive.py BATCH KEYS HEADS KV_HEADS DIM BUDGET
"""

import sys

import torch

from santa.kernels import plan_decode

batch, n_keys, heads, kv_heads, dim, budget = (int(x) for x in sys.argv[1:7])
q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
k = torch.randn(batch, n_keys, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget, dtype=q.dtype,
                   device="cuda")
out = torch.empty_like(q)
for _ in range(3):
    plan.run(q, k, v, out=out)
torch.cuda.synchronize()
