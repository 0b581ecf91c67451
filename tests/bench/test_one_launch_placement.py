"""The one-launch prop's placement arithmetic (benchmarks/kernels/cuda_stream/placement.py, the float32 steps of the
CUDA kernel ``prop1_*``) places the comb of ``santa.sample_counts(..., "systematic")``: the same counts but for
samples within float32 rounding of a CDF step, for any slice length, peaked rows, keys outside the row, S > n."""

import math

import pytest
import torch
from benchmarks.kernels.cuda_stream.placement import one_launch_counts

from santa import sample_counts

TOL = 2e-5  # |F(j) − (m + U)/S| within which a sample may cross a CDF step (float32 CDF against float64)


def moved_only_near_steps(counts: torch.Tensor, probs: torch.Tensor, budget: int, uniform: float) -> bool:
    """True when ``counts`` equal the float64 systematic counts but for samples on a CDF step (within TOL)."""
    want = sample_counts(probs.unsqueeze(0), budget, "systematic", uniforms=torch.tensor([uniform], dtype=torch.float64))[0]
    if int(counts.sum()) != budget:
        return False
    got_keys = torch.repeat_interleave(torch.arange(probs.numel()), counts)
    want_keys = torch.repeat_interleave(torch.arange(probs.numel()), want)
    cdf = torch.cumsum(probs, 0)
    points = (torch.arange(budget, dtype=torch.float64) + uniform) / budget
    for m in torch.nonzero(got_keys != want_keys).flatten().tolist():
        lo, hi = sorted((int(got_keys[m]), int(want_keys[m])))
        steps = cdf[lo:hi]  # the steps F(lo) … F(hi − 1) the sample crossed
        if ((steps - points[m]).abs() > TOL).any():
            return False
    return True


@pytest.mark.parametrize("slice_len", [7, 64, 100, 1000])
@pytest.mark.parametrize("kind", ["flat", "peaked", "masked"])
def test_the_slices_place_the_systematic_comb(slice_len, kind):
    gen = torch.Generator().manual_seed(slice_len + len(kind))
    n, budget = 300, 128
    scores = torch.randn(n, generator=gen) * (8.0 if kind == "peaked" else 1.0)
    if kind == "masked":
        scores[200:] = -math.inf  # keys past the row's length: never sampled
    scores_log2 = (scores * math.log2(math.e)).float()
    probs = torch.softmax(scores_log2.double() * math.log(2.0), 0)
    for uniform in (0.0, 0.37, 0.999):
        counts = one_launch_counts(scores_log2, budget, uniform, slice_len)
        assert moved_only_near_steps(counts, probs, budget, uniform)
        if kind == "masked":
            assert not counts[200:].any()


def test_a_budget_past_the_keys_repeats_them():
    scores_log2 = torch.tensor([0.0, 1.0, -1.0, 2.0, 0.5], dtype=torch.float32)
    probs = torch.softmax(scores_log2.double() * math.log(2.0), 0)
    counts = one_launch_counts(scores_log2, 64, 0.5, 2)
    assert moved_only_near_steps(counts, probs, 64, 0.5) and int(counts.sum()) == 64


def test_an_empty_row_draws_nothing_and_bad_scores_are_refused():
    assert not one_launch_counts(torch.full((10,), -math.inf), 8, 0.3, 4).any()
    with pytest.raises(TypeError, match="scores_log2"):
        one_launch_counts(torch.zeros(10, dtype=torch.float64), 8, 0.3, 4)
