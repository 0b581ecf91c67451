"""The layer-budget search's schedules: uniform, one-hot (the ablation's) and a policy's, rounded.

A schedule is a list ``[S_0, …, S_{L−1}]`` of samples per query row and head for each layer; its
``{layer: S}`` form, the schedule file and its loader are :mod:`santa.schedule_file`'s, below both
:mod:`santa.eval` and :mod:`santa.budgets`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from santa.checks import integer
from santa.schedule_file import load_layer_budgets  # noqa: F401 (re-exported: the README's documented path)


def uniform_schedule(*, n_layers: int, total: int) -> list[int]:
    """``total`` samples spread evenly over ``n_layers`` layers (the first ``total mod L`` get one more)."""
    n_layers, total = integer("n_layers", n_layers), integer("total", total)
    if n_layers < 1 or total < n_layers:
        raise ValueError(f"need n_layers ≥ 1 and total ≥ n_layers (one sample per layer), got {n_layers}, {total}")
    share, extra = divmod(total, n_layers)
    return [share + (layer < extra) for layer in range(n_layers)]


def one_hot_schedule(*, n_layers: int, layer: int, base: int, one_hot: int = 1) -> list[int]:
    """``base`` samples in every layer but ``layer``, which gets ``one_hot`` (the paper's S = 1)."""
    n_layers = integer("n_layers", n_layers, low=1)
    layer = integer("layer", layer)
    base, one_hot = integer("base", base, low=1), integer("one_hot", one_hot, low=1)
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer must lie in [0, {n_layers}), got {layer}")
    return [one_hot if i == layer else base for i in range(n_layers)]


def rounded_schedule(probs: Sequence[float], *, total: int, floor: int = 1) -> list[int]:
    """The schedule a policy expects, in integers: ``floor + round((total − floor·L)·p)``.

    probs ``[L]`` (sums to 1). Largest-remainder rounding, so the schedule sums to ``total``
    exactly; ties go to the lower layer index.
    """
    total, floor = integer("total", total, low=1), integer("floor", floor, low=0)
    p = np.asarray(probs, dtype=np.float64)
    free = total - floor * p.size
    if free < 0:
        raise ValueError(f"total {total} is below floor·layers = {floor * p.size}")
    exact = free * p / p.sum()
    counts = np.floor(exact).astype(np.int64)
    order = np.lexsort((np.arange(p.size), -(exact - counts)))  # largest fractional part first
    counts[order[: free - int(counts.sum())]] += 1
    return [int(floor + c) for c in counts]
