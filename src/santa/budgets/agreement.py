"""Does a learned schedule agree with the one-hot ablation? (The paper's check, Appendix J.)

A layer's *sensitivity* is how much its one-hot cell loses against the uniform baseline: the
paired Δ for KL (higher = worse), −Δ for a task score. Agreement is Spearman's rank correlation
between the sensitivity and the samples the schedule gives each layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from santa.budgets.sweep import Comparison


def ranks(x: Sequence[float]) -> np.ndarray:
    """Ranks 0…n−1 with ties averaged."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="stable")
    r = np.empty(a.size)
    r[order] = np.arange(a.size)
    for value in np.unique(a):
        tied = a == value
        r[tied] = r[tied].mean()
    return r


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def sensitivity(comparisons: Sequence[Comparison], *, metric: str) -> dict[int, float]:
    """``{layer: sensitivity}`` from an ablation's comparisons."""
    sign = 1.0 if metric == "kl" else -1.0
    return {c.layer: sign * c.delta for c in comparisons if c.layer is not None and c.delta is not None}


def agreement(schedule: Sequence[int], comparisons: Sequence[Comparison], *, metric: str) -> tuple[float, list[int], list[int]]:
    """(Spearman ρ over the ablated layers, the 5 most sensitive layers, the 5 layers with most samples)."""
    sens = sensitivity(comparisons, metric=metric)
    layers = sorted(sens)
    rho = spearman([sens[l] for l in layers], [schedule[l] for l in layers])
    most_sensitive = sorted(layers, key=lambda l: -sens[l])[:5]
    most_samples = sorted(range(len(schedule)), key=lambda l: (-schedule[l], l))[:5]
    return rho, most_sensitive, most_samples
