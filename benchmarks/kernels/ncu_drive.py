"""One prop decode call, run three times: what ``ncu -k regex:_prop_`` (the Triton launches) or ``regex:^prop1`` (the
one-launch CUDA prop) profiles.

    ncu --section SpeedOfLight ... python benchmarks/kernels/ncu_drive.py BATCH KEYS HEADS KV_HEADS DIM BUDGET [PAGE]
        [--ordered] [--schedule plan|rounds|live]

PAGE: a paged NHD cache of PAGE keys per page, shuffled over the pool (as vLLM's after a while of serving), instead of a
contiguous one; ``--ordered`` keeps its pages in order (sequence b's pages one after another, as a fresh vLLM server
hands them out), which tells the paged stream's arithmetic from what shuffled pages cost the memory system (DRAM pages,
TLB). ``--schedule``: the call ``plan_decode`` chose (``plan``, default), or the one launch on host-built rounds
(``rounds``) or on the live schedule (``live``), built directly (``santa.kernels.one_launch.OneLaunch``): the same keys
on both schedules tell the schedule's cost from the cache's.
"""

import argparse

import torch

from santa.kernels import one_launch as ol
from santa.kernels import plan_decode

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
for name in ("batch", "n_keys", "heads", "kv_heads", "dim", "budget"):
    parser.add_argument(name, type=int)
parser.add_argument("page", type=int, nargs="?", default=None)
parser.add_argument("--ordered", action="store_true", help="pages in order instead of shuffled over the pool")
parser.add_argument("--schedule", choices=("plan", "rounds", "live"), default="plan")
args = parser.parse_args()
if args.ordered and args.page is None:
    parser.error("--ordered: give PAGE (a paged cache)")
batch, n_keys, heads, kv_heads, dim, budget, page = (args.batch, args.n_keys, args.heads, args.kv_heads, args.dim,
                                                     args.budget, args.page)
q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
k = torch.randn(batch, n_keys, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
table = None
if page is not None:
    pages = batch * n_keys // page
    order = torch.arange(pages, device="cuda") if args.ordered else torch.randperm(pages, device="cuda")
    k_pages, v_pages = torch.empty(pages, page, kv_heads, dim, device="cuda", dtype=k.dtype), torch.empty(pages, page, kv_heads, dim, device="cuda", dtype=k.dtype)
    k_pages[order], v_pages[order] = k.reshape(pages, page, kv_heads, dim), v.reshape(pages, page, kv_heads, dim)
    table = order.reshape(batch, n_keys // page).to(torch.int32)
    k, v = k_pages, v_pages
out = torch.empty_like(q)
seq_lens = torch.full((batch,), n_keys, dtype=torch.int32, device="cuda")
if args.schedule == "plan":
    plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                       dtype=q.dtype, device="cuda", page_size=page)
    print(f"plan: {plan.implementation}", flush=True)
    for _ in range(3):
        plan.run(q, k, v, out=out, seq_lens=seq_lens, block_table=table)
else:
    launch = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                          scale=dim ** -0.5, device=torch.device("cuda"), page_size=page, live=args.schedule == "live")
    print(f"one launch: {launch.kernel}, plan {launch.plan.name}", flush=True)
    strides = ol.cache_strides(k, v, "NHD")
    for _ in range(3):
        launch.run(q, k, v, out=out, strides=strides, seq_lens=seq_lens, block_table=table)
torch.cuda.synchronize()
