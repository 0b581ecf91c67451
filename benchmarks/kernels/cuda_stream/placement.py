"""The one-launch prop's placement (``prop1_*`` in ``stream.cu``) as float32 torch, step for step: what the CUDA
kernel computes for one (sequence, head) row, so that its arithmetic can be checked on the CPU against
``santa.sample_counts(..., "systematic")`` (``tests/bench/test_one_launch_placement.py``) before device time is
spent on the kernel itself.

Per slice c of ``slice_len`` keys: m_c = max s, u = 2^(s − m_c), cum = its inclusive prefix, w_c = cum[last]. Over the
slices, in order: m* = max m_c, W_c = w_c · 2^(m_c − m*), z = Σ W; P_c = S · (Σ_{c'≤c} W_c') / z. Comb point m sits in
slice c iff P_{c−1} − m ≤ U < P_c − m; there, x = (U − (P_{c−1} − m)) / (P_c − P_{c−1}) and the key is
#{j : cum_j / cum_last ≤ x}, clamped to the slice's last key with u > 0.
"""

from __future__ import annotations

import torch


def one_launch_counts(scores_log2: torch.Tensor, budget: int, uniform: float, slice_len: int) -> torch.Tensor:
    """Counts [n] int64 of one row: ``scores_log2`` [n] float32 (q·k · log2(e)/√d; −inf for a key not in the row)."""
    if scores_log2.dtype != torch.float32 or scores_log2.dim() != 1:
        raise TypeError(f"scores_log2 must be a 1-D float32 tensor, got {scores_log2.dtype} of shape {tuple(scores_log2.shape)}")
    n = scores_log2.numel()
    starts = list(range(0, n, slice_len))
    maxima, cums, lives = [], [], []
    for start in starts:
        s = scores_log2[start : start + slice_len]
        m_c = s.max()
        u = torch.zeros_like(s) if m_c == -torch.inf else torch.exp2(s - m_c)
        maxima.append(m_c)
        cums.append(torch.cumsum(u, 0))
        lives.append(int(torch.nonzero(u > 0).max()) if (u > 0).any() else -1)  # the last key with u > 0
    m_star = torch.stack(maxima).max()
    m_ref = torch.zeros((), dtype=torch.float32) if m_star == -torch.inf else m_star
    z, bounds = torch.zeros((), dtype=torch.float32), []
    for m_c, cum in zip(maxima, cums, strict=True):
        below = z
        z = z + cum[-1] * torch.exp2(m_c - m_ref)
        bounds.append((below, z))
    counts = torch.zeros(n, dtype=torch.int64)
    if not z > 0:
        return counts
    s_f, u_f = torch.tensor(float(budget), dtype=torch.float32), torch.tensor(uniform, dtype=torch.float32)
    for c, (start, cum, live, (below, through)) in enumerate(zip(starts, cums, lives, bounds, strict=True)):
        p_lo = torch.zeros((), dtype=torch.float32) if c == 0 else (below / z) * s_f
        p_hi = (through / z) * s_f
        total = cum[-1]
        if not total > 0:
            continue
        first = max(0, int(torch.ceil(p_lo - u_f)) - 1)
        last = min(budget - 1, int(torch.ceil(p_hi - u_f)))
        for m in range(first, last + 1):
            m_f = torch.tensor(float(m), dtype=torch.float32)
            if not ((p_lo - m_f) <= u_f and u_f < (p_hi - m_f)):
                continue
            width = p_hi - p_lo
            x = (u_f - (p_lo - m_f)) / (width if width > 0 else torch.ones((), dtype=torch.float32))
            pos = int(((cum / total) <= x).sum())
            counts[start + min(pos, live)] += 1
    return counts
