"""benchmarks/eval/error_target_systematic_oracle.py on hand-solvable cases (issue 42): the exact systematic error of
one-hot and two-point weights, its closed-form counts against santa's sampler, and the allocations on synthetic curves
whose optimum is known."""

import itertools
import math

import pytest
import torch
from benchmarks.eval import error_target_systematic_oracle as oracle

from santa.sampling import sample_counts


def test_one_hot_weights_have_no_systematic_error():
    probs = torch.zeros(50, dtype=torch.float64)
    probs[17] = 1.0
    values = torch.randn(50, 8, generator=torch.Generator().manual_seed(0))
    assert oracle.systematic_error(probs, values, [1, 2, 3, 7, 64, 1000]).abs().max() == 0


@pytest.mark.parametrize(("budget", "share"), [(1, 0.3), (4, 0.3), (10, 0.3), (7, 0.55), (128, 0.123)])
def test_two_point_weights_match_the_hand_computation(budget, share):
    """``c_0 = ⌊Sq⌋ + [U < f]``, ``f = frac(Sq)``: ``ô − o = ([U < f] − f)(v_0 − v_1) / S``, so
    ``E‖ô − o‖² = f(1 − f)‖v_0 − v_1‖² / S²`` (zero when Sq is an integer), against the iid ``q(1 − q)‖v_0 − v_1‖² / S``."""
    probs = torch.tensor([share, 1 - share], dtype=torch.float64)
    values = torch.tensor([[1.0, 2.0, -1.0], [0.5, -1.0, 3.0]])
    gap = float(((values[0] - values[1]) ** 2).sum())
    f = budget * share - math.floor(budget * share)
    expected = f * (1 - f) * gap / budget**2
    assert float(oracle.systematic_error(probs, values, [budget])[0]) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    trace, _ = oracle.head_moments(probs, values)
    assert trace / budget == pytest.approx(share * (1 - share) * gap / budget)


def test_the_closed_form_counts_and_exact_mean_follow_santas_sampler():
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(2 * torch.randn(300, generator=g, dtype=torch.float64), -1)
    probs[[0, 5, 299]] = 0  # zero-weight keys, the last one among them
    probs = probs / probs.sum()
    values = torch.randn(300, 4, generator=g)
    for budget in (1, 3, 50, 299, 700):
        uniforms = torch.rand(100, generator=g, dtype=torch.float64)
        counts = oracle.systematic_counts(probs, budget, uniforms)
        assert torch.equal(counts, sample_counts(probs.expand(100, -1), budget, "systematic", uniforms=uniforms))
    for budget in (2, 37):
        exact = float(oracle.systematic_error(probs, values, [budget])[0])
        assert oracle.systematic_error_sampled(probs, values, budget, points=8192) == pytest.approx(exact, rel=2e-3)
    batched = oracle.systematic_error(probs, values, [1, 2, 3, 50], chunk=3)
    assert torch.allclose(batched, torch.cat([oracle.systematic_error(probs, values, [s]) for s in (1, 2, 3, 50)]))


@pytest.mark.parametrize(("scales", "total", "optimum"), [((1.0, 4.0), 96, (32, 64)), ((1.0, 9.0), 128, (32, 96)),
                                                          ((2.0, 2.0, 2.0), 384, (128, 128, 128))])
def test_the_oracle_puts_budgets_in_proportion_to_the_root_of_a_over_s_curves(scales, total, optimum):
    grid = oracle.GRID
    curves = torch.tensor([[a / s for s in grid] for a in scales], dtype=torch.float64)
    best, budgets = oracle.oracle_table(curves, grid, total)
    assert budgets.tolist() == list(optimum)
    assert float(best[total]) == pytest.approx(sum(a / s for a, s in zip(scales, optimum, strict=True)))
    assert oracle.hull_bound(curves, grid, total) == pytest.approx(float(best[total]))
    # Neyman's S ∝ √a and a power law with slope 1 give the same optimum
    assert oracle.proportional_budgets(torch.tensor(scales).sqrt(), total).tolist() == list(optimum)
    real = oracle.powerlaw_budgets(torch.tensor(scales), torch.ones(len(scales)), total)
    assert real.tolist() == pytest.approx(list(optimum), rel=1e-6)
    assert torch.isinf(best[: len(scales) - 1]).all() and torch.isfinite(best[len(scales):]).all()


def test_the_oracle_is_the_exact_minimum_and_the_hull_a_lower_bound_on_jagged_curves():
    g = torch.Generator().manual_seed(2)
    grid = (1, 2, 3, 5, 8, 13)
    curves = torch.rand(3, len(grid), generator=g, dtype=torch.float64) / torch.tensor(grid)  # not convex, not monotone
    best, budgets = oracle.oracle_table(curves, grid, 16)
    for total in range(3, 17):
        brute = min(sum(float(curves[h, i]) for h, i in enumerate(pick))
                    for pick in itertools.product(range(len(grid)), repeat=3)
                    if sum(grid[i] for i in pick) <= total)
        assert float(best[total]) == pytest.approx(brute)
        assert oracle.hull_bound(curves, grid, total) <= brute + 1e-12
    assert int(budgets.sum()) <= 16
    assert float(sum(curves[h, grid.index(int(s))] for h, s in enumerate(budgets))) == pytest.approx(float(best[16]))


def test_proportional_budgets_are_integers_summing_to_the_total_each_at_least_one():
    assert oracle.proportional_budgets(torch.tensor([0.0, 2.0, 3.0, 5.0]), 100).tolist() == [1, 20, 30, 49]
    assert oracle.proportional_budgets(torch.tensor([1.0, 1.0, 1.0]), 100).tolist() == [34, 33, 33]
    budgets = oracle.proportional_budgets(torch.tensor([1e-9, 3.0, 5.5, 1.5]), 101)
    assert int(budgets.sum()) == 101 and int(budgets.min()) >= 1
