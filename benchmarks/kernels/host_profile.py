"""Where the host time of an eager decode call goes (cProfile of back-to-back calls, 8k keys, CUDA)."""

import cProfile
import pstats
import statistics
import sys
import time

import torch

from santa.kernels import decode, plan_decode

q = torch.randn(1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 8192, 8, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
out = torch.empty_like(q)
plan = plan_decode(batch=1, heads=32, kv_heads=8, head_dim=128, n_keys=8192, budget=128, dtype=q.dtype, device="cuda")
stages = plan.stages(q, k, v, out=out)
for fn, name in ((lambda: plan.run(q, k, v, out=out), "plan.run"), (lambda: decode(q, k, v, 128, out=out), "decode"),
                 (lambda: [f() for _, f in stages], "stages only")):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(7):  # the host is noisy: the median of 7 rounds of 500 back-to-back calls
        t0 = time.perf_counter()
        for _ in range(500):
            fn()
        rounds.append((time.perf_counter() - t0) / 500 * 1e6)
        torch.cuda.synchronize()
    print(f"==== {name}: {statistics.median(rounds):.1f} µs per call (host, median of 7 × 500 back-to-back; "
          f"rounds {', '.join(f'{r:.1f}' for r in rounds)})")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(14)
