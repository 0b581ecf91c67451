import sys, torch
from santa.kernels import plan_decode
b, n, H, Hkv, d, S = (int(x) for x in sys.argv[1:7])
q = torch.randn(b, H, d, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, n, Hkv, d, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
plan = plan_decode(batch=b, heads=H, kv_heads=Hkv, head_dim=d, n_keys=n, budget=S, dtype=q.dtype, device="cuda")
out = torch.empty_like(q)
for _ in range(3):
    plan.run(q, k, v, out=out)
torch.cuda.synchronize()
