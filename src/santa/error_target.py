"""Budgets from an error target: each row (query, head) draws the samples its own distribution needs.

A fixed budget S gives every head the same number of draws, but the estimator's error depends on the
head. For ``ô = (1/S) Σ_m v_{J_m}`` with ``J_m ~ p`` iid (the paper, Appendix A.2)::

    E‖ô − o‖² = T / S,    T = Σ_j p_j ‖v_j‖² − ‖o‖²   (the variance trace of one draw)

so the relative error ``r²(S) = E‖ô − o‖² / ‖o‖² = T / (S ‖o‖²)`` and the smallest S with
``r² ≤ ε²`` is ``S* = ⌈T / (ε² ‖o‖²)⌉``. A head whose softmax sits on keys with similar values has
``T ≈ 0`` and needs one draw; a flat head over diverse values needs many.

Neither T nor ‖o‖² is known before V is read. A **pilot** of ``S₀`` systematic draws (on uniforms
independent of the output's) reads rows ``y_1 … y_S₀`` and estimates both::

    ȳ = (1/S₀) Σ_m y_m
    T̂ = (1/(S₀ − 1)) Σ_m ‖y_m − ȳ‖²  = S₀/(S₀ − 1) · ((1/S₀) Σ_m ‖y_m‖² − ‖ȳ‖²)
    N̂ = ‖ȳ‖² − T̂ / S₀

For iid draws both would be unbiased: ``E T̂ = T`` (the sample variance), and ``E‖ȳ‖² = ‖o‖² + T/S₀``
gives ``E N̂ = ‖o‖²``. The row then draws ``S_r = min(S_max, max(S₀, ⌈T̂ / (ε² N̂)⌉))`` samples of its
own sampler for its output (``S_max`` where ``N̂ ≤ 0``: the pilot cannot tell o from zero), on fresh
uniforms, so that given ``S_r`` the output is the fixed-budget estimator: **unbiased**. The pilot's
rows are read and not averaged into the output (that would make the weights depend on the draws): a
row reads ``S₀ + S_r`` value rows, and ``S_max`` bounds what a step can read.

Why the pilot is systematic for every sampler. The realised error is ``≈ ε² · (T / T̂) · (N̂ / ‖o‖²)``:
convex in T̂, so a noisy T̂ raises it (Jensen). An iid pilot of 16 draws on a peaked head (a few keys
holding most of the mass, a tail of keys with other values) often misses the tail: T̂ ≪ T, too few
samples, and the iid output's realised ``E r² / ε²`` measured 1.99 ± 0.40 at ε = 0.05 and 1.25 ± 0.10 at
ε = 0.1 (8 synthetic heads at 8192 keys, 200 seeds; one head 8.3×). Systematic draws sit at evenly
spaced quantiles of the CDF, so the tail enters in proportion to its mass and T̂ varies far less: the
same iid outputs with a systematic pilot measured 0.94 ± 0.01 and 0.93 ± 0.02 (worst head 1.06), for
6 % more samples (``benchmarks/results/accuracy.md``, issue 42). A systematic ȳ also varies less than an
iid one, so ``N̂`` is biased low: the rule errs towards more samples. It is also what prop's kernel
draws (one offset per row, stream 1).

Why never fewer than S₀ draws. Mass below 1/S₀ can slip between the pilot's points, and on real heads
it is where the error hides: an attention sink holds most of the weight with a small value, a tail of
keys with large values holds the rest, so a pilot that lands on the sink alone sees ``T̂ = 0`` while
``T / ‖o‖²`` is 0.2–2.2 (SmolLM2-135M at 8k, the "easy" third of its heads). Down to one draw, those
heads measured ``E r² / ε²`` 5.3 ± 4.0 at ε = 0.1 (one head 40×); with the floor at S₀ = 16, 0.66 ±
0.06 (8 heads × 200 seeds; ``benchmarks/results/accuracy.md``, issue 42). The floor costs nothing where
the rule asks for more, and cuts a missed tail's share of the error to ``1/S₀`` of its variance.

Calibration. Where ``S_r`` is well above S₀ and below the cap, ``E r² ≈ ε²`` for iid output; the
ceiling, the floor and ``N̂ ≤ 0 → S_max`` only lower it. Stratified and systematic outputs
use the same rule: their variance is at most iid's for stratified (proven: the within-stratum
variances sum to at most T) and measured below it for systematic on every head the calibration
covers, so they land at or below ε². The calibration study measures the realised ``E r² / ε²`` per
head class (``benchmarks/eval/error_target_calibration.py``).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch

DEFAULT_PILOT = 16  # pilot draws per row: T̂ and N̂ from 16 rows, 1/8 of the default cap's reads


class ErrorTargetDraw(NamedTuple):
    """What an error-target draw did per row: the output's counts ``[..., n]`` (summing to
    ``budgets``), the per-row budgets ``S_r`` ``[...]`` int64, the pilot's counts ``[..., n]`` (summing
    to the pilot size), and the pilot's estimates ``T̂`` and ``N̂`` ``[...]`` float64."""

    counts: torch.Tensor
    budgets: torch.Tensor
    pilot_counts: torch.Tensor
    trace: torch.Tensor
    norm2: torch.Tensor

    def rows_read(self) -> torch.Tensor:
        """Value rows each row's draws read, pilot included: ``S₀ + S_r`` ``[...]`` (draws, not unique keys)."""
        return self.budgets + self.pilot_counts.sum(-1)


def check_error_target(error_target: object) -> float:
    """The relative error target ε as a float, or raise: TypeError unless a real number, ValueError
    unless finite and > 0."""
    if isinstance(error_target, bool) or not isinstance(error_target, numbers.Real):
        raise TypeError(f"error_target must be a real number > 0 (a relative error, e.g. 0.1), got "
                        f"{type(error_target).__name__} {error_target!r}")
    value = float(error_target)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"error_target must be finite and > 0 (a relative error, e.g. 0.1), got {value}")
    return value


def check_pilot(pilot: object, *, targeted: bool = True) -> int:
    """The pilot's draws per row S₀ as an int ≥ 2 (a sample variance needs two draws), or raise; ``targeted=False``
    (no error target): a pilot other than the default sizes nothing, and is refused rather than ignored."""
    if isinstance(pilot, bool) or not isinstance(pilot, numbers.Integral):
        raise TypeError(f"pilot must be an int ≥ 2 (draws per row that estimate the error), got {type(pilot).__name__} {pilot!r}")
    if pilot < 2:
        raise ValueError(f"pilot must be ≥ 2 (a sample variance needs two draws), got {pilot}")
    if not targeted and pilot != DEFAULT_PILOT:
        raise ValueError(f"pilot={pilot} sizes an error target's pilot draws: pass error_target too (or leave pilot at "
                         f"{DEFAULT_PILOT})")
    return int(pilot)


def pilot_statistics(mean: torch.Tensor, square_mean: torch.Tensor, pilot: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(T̂, N̂)`` from a pilot of ``pilot`` draws: its mean row ``ȳ [..., d]`` and its mean squared
    norm ``(1/S₀) Σ_m ‖y_m‖² [...]`` (float64 ``[...]`` each; T̂ is clamped at 0 against round-off)."""
    mean, square_mean = mean.double(), square_mean.double()
    mean_norm2 = (mean * mean).sum(-1)
    trace = (pilot / (pilot - 1)) * (square_mean - mean_norm2)
    trace = trace.clamp_min(0.0)
    return trace, mean_norm2 - trace / pilot


def adaptive_budgets(trace: torch.Tensor, norm2: torch.Tensor, error_target: float, cap: int, pilot: int) -> torch.Tensor:
    """``S_r = min(cap, max(pilot, ⌈T̂ / (ε² N̂)⌉))`` per row, ``cap`` where ``N̂ ≤ 0`` or either estimate is
    not finite: int64 ``[...]``. Never fewer draws than the pilot's: mass the pilot cannot see (below 1/S₀) may
    hold values far from the rest (an attention sink's tail), which a single draw would leave as the whole error."""
    usable = (norm2 > 0) & torch.isfinite(norm2) & torch.isfinite(trace)
    wanted = torch.ceil(trace / (error_target**2 * norm2.masked_fill(~usable, 1.0)))
    wanted = wanted.clamp_min(pilot).clamp_max(cap).masked_fill(~usable, cap)
    return wanted.long()
