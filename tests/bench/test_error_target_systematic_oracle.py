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


@pytest.mark.parametrize(("shape", "block"), [((2, 64, 3), 32), ((3, 77, 5), 32), ((1, 5, 2), 8), ((2, 40, 1), 16)])
def test_prefix_sums_are_the_cumulative_sums(shape, block):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.allclose(oracle.prefix_sums(x, block), torch.cumsum(x, 1), rtol=1e-12, atol=1e-12)


def test_the_exact_error_does_not_depend_on_the_chunk_or_the_block():
    g = torch.Generator().manual_seed(4)
    probs = torch.softmax(torch.randn(1000, generator=g, dtype=torch.float64), -1)
    values = torch.randn(1000, 8, generator=g)
    budgets = [1, 5, 64, 333, 2048]
    reference = oracle.systematic_error(probs, values, budgets)
    for chunk, block in ((1, 8), (3, 64), (5, 1000)):
        assert torch.allclose(oracle.systematic_error(probs, values, budgets, chunk, block), reference, rtol=1e-10)


def jagged_curves(heads: int, seed: int, grid=(1, 2, 3, 5, 8, 13)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(heads, len(grid), generator=g, dtype=torch.float64) / torch.tensor(grid)


def test_the_lagrangian_allocation_is_the_exact_oracle_for_the_reads_it_spends():
    grid = (1, 2, 3, 5, 8, 13)
    curves = jagged_curves(4, 5)
    best, _ = oracle.oracle_table(curves, grid, 52)
    for total in range(4, 53):
        budgets = oracle.lagrange_budgets(curves, grid, total)
        spent = int(budgets.sum())
        assert spent <= total
        error = oracle.grid_error(curves, grid, budgets)
        assert error == pytest.approx(float(best[spent]))  # optimal at its own reads …
        assert oracle.hull_bound(curves, grid, total) <= float(best[total]) + 1e-12 <= error + 2e-12  # … so it brackets


def test_hull_reads_inverts_the_hull_bound():
    grid = oracle.GRID
    curves = torch.tensor([[a / s for s in grid] for a in (1.0, 4.0, 0.3)], dtype=torch.float64)
    for total in (3, 50, 96, 200.5, 1000):
        target = oracle.hull_bound(curves, grid, total)
        assert oracle.hull_reads(curves, grid, target) == pytest.approx(total)
    assert oracle.hull_reads(curves, grid, 1e-9) == math.inf  # below every head's error at 2048
    assert oracle.hull_reads(curves, grid, 1e9) == 3  # every head at grid[0]


def test_cross_layer_of_equal_heads_has_nothing_to_move_and_of_unequal_heads_moves_reads():
    grid = oracle.GRID
    same = torch.tensor([[1.0 / s for s in grid]] * 6, dtype=torch.float64)
    result = oracle.cross_layer(same)
    assert result["rows"] == 6 and result["reads"] == 6 * 128
    assert result["oracle_hull"] == pytest.approx(1.0) and result["oracle_lagrange"] == pytest.approx(1.0)
    assert result["reads_at_equal_error_hull"] == pytest.approx(1.0)
    assert result["reads_at_equal_error_lagrange"] == pytest.approx(1.0)
    unequal = torch.tensor([[a / s for s in grid] for a in (1.0, 9.0)], dtype=torch.float64)  # optimum (64, 192)
    result = oracle.cross_layer(unequal)
    expected = (1 / 64 + 9 / 192) / (10 / 128)
    assert result["oracle_hull"] == pytest.approx(expected) and result["oracle_lagrange"] == pytest.approx(expected)
    assert result["reads_at_equal_error_lagrange"] < 1


def test_positions_layer_pools_the_heads_of_every_position():
    """Two heads at three positions (row t sees the first n − 3 + 1 + t keys): each position's oracle is the
    one-position analysis of its truncated heads, the pooled rules' errors are the exact errors of their budgets, and
    the pool does at least as well as every position alone and every head over its own positions."""
    g = torch.Generator().manual_seed(6)
    heads, positions, n = 2, 3, 60
    scores = 2 * torch.randn(heads, positions, n, generator=g, dtype=torch.float64)
    visible = torch.arange(n) < (n - positions + 1 + torch.arange(positions))[:, None]  # [P, n]
    probs = torch.softmax(scores.masked_fill(~visible, -math.inf), -1)
    values = torch.randn(heads, n, 4, generator=g)
    case = oracle.positions_layer(probs, values)
    assert case["curves"].shape == (heads * positions, len(oracle.GRID))
    alone = 0.0
    for t in range(positions):
        keys = n - positions + 1 + t
        one = oracle.layer_case(probs[:, t, :keys], values[:, :keys])
        assert torch.allclose(case["curves"][t * heads: (t + 1) * heads], one["curves"], rtol=1e-12)
        assert case["per_position"][t]["errors"]["oracle"] == pytest.approx(one["errors"]["oracle"])
        assert case["per_position"][t]["reads_at_equal_error"] == one["reads_at_equal_error"]
        alone += one["errors"]["oracle"]
    pooled = case["pooled"]
    assert pooled["fixed"] == pytest.approx(sum(p["fixed"] for p in case["per_position"]))
    assert pooled["errors"]["oracle"] <= alone + 1e-15
    assert pooled["errors"]["oracle"] <= case["steps_only_oracle"] + 1e-15
    for name, budgets in pooled["rule_budgets"].items():
        assert sum(budgets) == 128 * heads * positions
        direct = sum(float(oracle.systematic_error(probs[r % heads, r // heads, : n - positions + 1 + r // heads],
                                                   values[r % heads, : n - positions + 1 + r // heads], [s])[0])
                     for r, s in enumerate(budgets))
        assert pooled["errors"][name] == pytest.approx(direct, rel=1e-9)
    assert sum(case["pooled_oracle_reads_by_position"]) <= positions + 1e-12


def test_summary_is_the_mean_of_ratios_and_the_ratio_of_sums():
    assert oracle.summary([1.0, 3.0], [2.0, 4.0]) == {"layer_mean": 0.625, "overall": 4 / 6, "layer_min": 0.5,
                                                       "layer_max": 0.75}
