"""The torch fallback's memory (issue 44): a GQA decode call on the CPU materialised K and V repeated per query head
in float64 ([B, L, H, d]: 13.7 GB for B = 12 × 16k keys × 32 heads). It now holds one sequence's K in float64
at a time and gathers only the V rows it reads."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import resource, torch
from santa.kernels import decode
g = torch.Generator().manual_seed(0)
q = torch.randn(2, 32, 64, generator=g).bfloat16()
k = torch.randn(2, 8192, 8, 64, generator=g).bfloat16()
v = torch.randn(2, 8192, 8, 64, generator=g).bfloat16()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = decode(q, k, v, 64, seq_lens=torch.tensor([8192, 100], dtype=torch.int32))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, bool(torch.isfinite(out).all()))
"""


def test_a_long_gqa_call_on_the_cpu_needs_no_cache_repeated_per_head():
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}  # the torch fallback
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300, check=True)
    grown_mb, finite = result.stdout.split()
    # K repeated per query head in float64 alone is 2 × 8192 × 32 × 64 × 8 B = 256 MiB (and V as much again)
    assert finite == "True" and int(grown_mb) < 100, result.stdout
