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
    """Spearman's ρ; nan where it is undefined (:func:`undefined_because` says why)."""
    if undefined_because(x, y) is not None:
        return float("nan")
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def undefined_because(sensitivities: Sequence[float], samples: Sequence[float]) -> str | None:
    """Why Spearman's ρ between a layer's sensitivity and its samples is undefined (None where it is
    defined): fewer than 2 layers, or one side the same for every layer (no ranking to correlate)."""
    if len(sensitivities) < 2:
        return f"{len(sensitivities)} ablated layer{'' if len(sensitivities) == 1 else 's'} with a result, at least 2 needed"
    if np.ptp(np.asarray(samples, dtype=np.float64)) == 0:
        return "the schedule gives every ablated layer the same samples"
    if np.ptp(np.asarray(sensitivities, dtype=np.float64)) == 0:
        return "every ablated layer has the same sensitivity"
    return None


def sensitivity(comparisons: Sequence[Comparison], *, metric: str) -> dict[int, float]:
    """``{layer: sensitivity}`` from an ablation's comparisons."""
    sign = 1.0 if metric == "kl" else -1.0
    return {c.layer: sign * c.delta for c in comparisons if c.layer is not None and c.delta is not None}


def agreement(schedule: Sequence[int], comparisons: Sequence[Comparison], *, metric: str) -> tuple[float, list[int], list[int]]:
    """(Spearman ρ over the ablated layers, nan where undefined; the 5 most sensitive layers; the 5
    layers with most samples)."""
    sens = sensitivity(comparisons, metric=metric)
    layers = sorted(sens)
    rho = spearman([sens[l] for l in layers], [schedule[l] for l in layers])
    most_sensitive = sorted(layers, key=lambda l: -sens[l])[:5]
    most_samples = sorted(range(len(schedule)), key=lambda l: (-schedule[l], l))[:5]
    return rho, most_sensitive, most_samples


def agreement_text(schedule: Sequence[int], comparisons: Sequence[Comparison], *, metric: str) -> str:
    """``Spearman ρ(samples, one-hot sensitivity) = +0.42; …`` for ``santa tune evaluate``, with the
    reason in words where ρ is undefined (never ``nan``)."""
    rho, most_sensitive, most_samples = agreement(schedule, comparisons, metric=metric)
    sens = sensitivity(comparisons, metric=metric)
    layers = sorted(sens)
    why = undefined_because([sens[l] for l in layers], [schedule[l] for l in layers])
    value = f"{rho:+.2f}" if why is None else f"undefined ({why})"
    return f"Spearman ρ(samples, one-hot sensitivity) = {value}; most sensitive layers {most_sensitive}, most samples {most_samples}"
