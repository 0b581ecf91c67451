"""The one-launch prop's placement (``prop1_*`` in ``stream.cu``) as float32 torch, step for step: what the CUDA
kernel computes for one (sequence, head) row, so that its arithmetic can be checked on the CPU against
``santa.sample_counts(..., "systematic")`` (``tests/bench/test_one_launch_placement.py``) before device time is
spent on the kernel itself.

Per slice c of ``slice_len`` keys (the kernel keeps the slice's scores while it streams K), m_c = max s and in
8-key subtiles i, W_i = Σ 2^(s − m_c), Cum = their inclusive prefix; the published mass w_c
= Σ 2^(s − m_c) comes from the stream's own running (m, l), so it may differ from Cum[last] by rounding. Over the
slices, in order: m* = max m_c, W_c = w_c · 2^(m_c − m*), F = their prefix, z = F[last]; P_c = S · F(c) / z.
Comb point m sits in slice c iff P_{c−1} − m ≤ U < P_c − m; there t = (U − (P_{c−1} − m)) / (P_c − P_{c−1}) · Cum[last],
its subtile the first with Cum_i > t (past the last subtile with mass: that one), its key the subtile's first with
Cum_{i−1} + Σ_{k' ≤ k} 2^(s_k' − m_c) > t (else the subtile's last key with mass).
"""

from __future__ import annotations

import torch


def one_launch_counts(scores_log2: torch.Tensor, budget: int, uniform: float, slice_len: int) -> torch.Tensor:
    """Counts [n] int64 of one row: ``scores_log2`` [n] float32 (q·k · log2(e)/√d; −inf for a key not in the row)."""
    if scores_log2.dtype != torch.float32 or scores_log2.dim() != 1:
        raise TypeError(f"scores_log2 must be a 1-D float32 tensor, got {scores_log2.dtype} of shape {tuple(scores_log2.shape)}")
    n = scores_log2.numel()
    f32 = torch.float32
    zero = torch.zeros((), dtype=f32)
    slices = []  # per slice: (start, m_c, Cum over its subtiles, the last subtile with mass)
    for start in range(0, n, slice_len):
        s = scores_log2[start : start + slice_len]
        subtiles = [s[i : i + 8] for i in range(0, s.numel(), 8)]
        m_c = s.max()
        w = torch.stack([zero if m_c == -torch.inf else torch.exp2(t - m_c).sum() for t in subtiles])
        live = int(torch.nonzero(w > 0).max()) if (w > 0).any() else -1
        w_c = zero if m_c == -torch.inf else torch.exp2(s - m_c).sum()  # published from the stream's own (m, l)
        slices.append((start, m_c, w_c, torch.cumsum(w, 0), live))
    m_star = torch.stack([m_c for _, m_c, _, _, _ in slices]).max()
    m_ref = zero if m_star == -torch.inf else m_star
    prefix = torch.cumsum(torch.stack([w_c * torch.exp2(m_c - m_ref) for _, m_c, w_c, _, _ in slices]), 0)
    z = prefix[-1]
    counts = torch.zeros(n, dtype=torch.int64)
    if not z > 0:
        return counts
    s_f, u_f = torch.tensor(float(budget), dtype=f32), torch.tensor(uniform, dtype=f32)
    for c, (start, m_c, _, cum, live) in enumerate(slices):
        p_lo = zero if c == 0 else (prefix[c - 1] / z) * s_f
        p_hi = (prefix[c] / z) * s_f
        total = cum[-1]
        if live < 0 or not total > 0:
            continue
        first = max(0, int(torch.ceil(p_lo - u_f)) - 1)
        last = min(budget - 1, int(torch.ceil(p_hi - u_f)))
        for m in range(first, last + 1):
            m_f = torch.tensor(float(m), dtype=f32)
            if not ((p_lo - m_f) <= u_f and u_f < (p_hi - m_f)):
                continue
            width = p_hi - p_lo
            t = (u_f - (p_lo - m_f)) / (width if width > 0 else torch.ones((), dtype=f32)) * total
            pos = min(int((cum <= t).sum()), live)
            before = zero if pos == 0 else cum[pos - 1]
            keys = scores_log2[start + 8 * pos : min(start + slice_len, n, start + 8 * pos + 8)]
            u = torch.exp2(keys - m_c)
            above = torch.nonzero(before + torch.cumsum(u, 0) > t).flatten()
            if above.numel():
                key = int(above[0])
            else:
                alive = torch.nonzero(u > 0).flatten()
                key = int(alive[-1]) if alive.numel() else 0
            counts[start + 8 * pos + key] += 1
    return counts
