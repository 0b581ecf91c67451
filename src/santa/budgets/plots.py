"""Fig. 9-style plots of a tuning run: the learning curve and the learned schedule."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def plot_learning_curve(updates: Sequence[dict], path: str | Path, *, title: str = "") -> Path:
    """Reward of every accepted episode (dots) and each update's batch mean vs the update index.

    updates: the history records (``"update"``, ``"episodes"`` with ``"reward"``).
    """
    from santa.eval.report import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    xs = [u["update"] for u in updates for _ in u["episodes"]]
    rs = [e["reward"] for u in updates for e in u["episodes"]]
    ax.scatter(xs, rs, s=4, alpha=0.3, color="tab:blue", lw=0, label="episode reward")
    means = [np.mean([e["reward"] for e in u["episodes"]]) for u in updates]
    ax.plot([u["update"] for u in updates], means, color="tab:blue", lw=1.2, label="batch mean")
    window = max(1, len(means) // 10)
    if len(means) >= window > 1:
        smooth = np.convolve(means, np.ones(window) / window, mode="valid")
        ax.plot([u["update"] for u in updates][window - 1 :], smooth, color="black", lw=1.5, label=f"mean of {window} updates")
    ax.set_xlabel("iteration (policy update)")
    ax.set_ylabel("reward")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=130)


def plot_schedule(
    schedule: Sequence[int], path: str | Path, *, probs: Sequence[float] | None = None, floor: int = 1, title: str = ""
) -> Path:
    """Samples per layer of the learned schedule (bars), the uniform schedule of the same total (line)."""
    from santa.eval.report import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    layers = np.arange(len(schedule))
    ax.bar(layers, schedule, color="tab:blue", label="learned schedule")
    ax.axhline(sum(schedule) / len(schedule), color="tab:gray", ls="--", lw=1, label="uniform (same total)")
    if probs is not None:
        free = sum(schedule) - len(schedule) * floor
        ax.plot(layers, floor + free * np.asarray(probs), "k.", ms=4, label="policy mean")
    ax.set_xlabel("layer")
    ax.set_ylabel("# samples S")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=130)
