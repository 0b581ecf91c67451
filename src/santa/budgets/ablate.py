"""The one-hot layer ablation (the paper's Appendix I, Fig. 8).

Cells: the uniform baseline (``base`` samples in every layer) and, for every layer ℓ, the same
schedule with ``one_hot`` samples (the paper's S = 1: hard attention to one sampled key) in ℓ.
A layer whose one-hot cell loses much against the baseline is one where attention precision
matters; the learned schedule should put its samples there.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from santa.budgets.schedule import one_hot_schedule
from santa.budgets.sweep import Cell, Comparison
from santa.checks import integer
from santa.rng import check_seed

BASELINE = "uniform"


def layer_cells(*, n_layers: int, base: int, one_hot: int = 1, layers: Sequence[int] | None = None, seeds: Sequence[int] = (0,)) -> list[Cell]:
    """The baseline cell and one one-hot cell per layer, for every seed (seed-major order)."""
    n_layers = integer("n_layers", n_layers, low=1)
    base, one_hot = integer("base", base, low=1), integer("one_hot", one_hot, low=1)
    layers = range(n_layers) if layers is None else [integer("layers[]", l, low=0, high=n_layers) for l in layers]
    seeds = [check_seed(s, "seeds[]") for s in seeds]  # santa.rng's one range, [0, 2**63)
    cells = []
    for seed in seeds:
        cells.append(Cell(BASELINE, (base,) * n_layers, seed))
        cells += [Cell(f"layer {l}", tuple(one_hot_schedule(n_layers=n_layers, layer=l, base=base, one_hot=one_hot)), seed, l) for l in layers]
    return cells


def plot_ablation(comparisons: Sequence[Comparison], path: str | Path, *, metric: str, title: str = "") -> Path:
    """Fig. 8-style: score of each one-hot cell vs its layer index (95 % CI bars), the baseline as a band."""
    from santa.eval.report import pyplot, save_figure

    plt = pyplot()
    base = next((c for c in comparisons if c.name == BASELINE), None)
    rows = sorted((c for c in comparisons if c.layer is not None), key=lambda c: c.layer)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    if base is not None:
        ax.axhspan(base.low, base.high, color="tab:gray", alpha=0.25, lw=0)
        ax.axhline(base.mean, color="tab:gray", lw=1.2, label=f"baseline (uniform, {base.total} total)")
    x = [c.layer for c in rows]
    y = [c.mean for c in rows]
    err = [[c.mean - c.low for c in rows], [c.high - c.mean for c in rows]]
    ax.errorbar(x, y, yerr=err, fmt="o-", ms=4, lw=1, capsize=2, color="tab:blue", label="one-hot schedule")
    ax.set_xlabel("one-hot layer index")
    ax.set_ylabel("KL(dense ‖ sampled), nats" if metric == "kl" else f"{metric} score")
    if metric == "kl":
        ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=130)
