"""The samplers' spec: inverse CDF, count identities, determinism, unbiasedness, variance order."""

import math

import pytest
import torch

import santa
from helpers import random_probs
from santa.sampling import inverse_cdf, sample_points
from santa.stats import stratum_weights

SAMPLERS = ["iid", "stratified", "systematic"]


def test_inverse_cdf_takes_first_key_whose_cdf_exceeds_t():
    probs = torch.tensor([0.25, 0.0, 0.5, 0.25])  # F = .25 .25 .75 1
    points = torch.tensor([0.0, 0.2499, 0.25, 0.7499, 0.75, 0.9999])
    assert inverse_cdf(probs, points).tolist() == [0, 0, 2, 2, 3, 3]


def test_systematic_points_share_one_offset():
    points = sample_points(torch.tensor([0.5]), 4, "systematic")
    assert torch.allclose(points, torch.tensor([[0.125, 0.375, 0.625, 0.875]], dtype=torch.float64))


def test_stratified_points_fall_one_per_stratum():
    points = sample_points(torch.tensor([0.0, 0.5, 0.999], dtype=torch.float64), 3, "stratified")
    assert torch.allclose(points, torch.tensor([0.0, 1.5, 2.999], dtype=torch.float64) / 3)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("budget", [1, 7, 64, 1000])
def test_counts_sum_to_budget(sampler, budget):
    probs = random_probs((5, 3, 300), seed=budget)
    counts = santa.sample_counts(probs, budget, sampler, generator=torch.Generator().manual_seed(1))
    assert counts.dtype == torch.int64 and counts.shape == probs.shape
    assert (counts.sum(-1) == budget).all()
    assert (counts >= 0).all()


@pytest.mark.parametrize("budget", [1, 5, 32, 333])
def test_systematic_counts_are_floor_or_ceil_of_expected(budget):
    probs = random_probs((50, 200), seed=3, peak=3.0)
    counts = santa.sample_counts(probs, budget, "systematic", generator=torch.Generator().manual_seed(2))
    expected = budget * probs
    assert ((counts >= torch.floor(expected) - 1e-9) & (counts <= torch.ceil(expected) + 1e-9)).all()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_same_uniforms_give_same_counts(sampler):
    probs = random_probs((4, 100))
    shape = (4,) if sampler == "systematic" else (4, 16)
    uniforms = torch.rand(shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    first = santa.sample_counts(probs, 16, sampler, uniforms=uniforms)
    second = santa.sample_counts(probs.clone(), 16, sampler, uniforms=uniforms.clone())
    assert torch.equal(first, second)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_same_generator_seed_gives_same_counts_and_new_seed_new_counts(sampler):
    probs = random_probs((8, 500))
    a = santa.sample_counts(probs, 32, sampler, generator=torch.Generator().manual_seed(0))
    b = santa.sample_counts(probs, 32, sampler, generator=torch.Generator().manual_seed(0))
    c = santa.sample_counts(probs, 32, sampler, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_zero_probability_keys_never_sampled(sampler):
    probs = random_probs((16, 64))
    masked = torch.zeros(64, dtype=torch.bool)
    masked[::3] = True
    masked[-1] = True  # the last key masked: round-off past F(n-2) must not land on it
    probs = probs.masked_fill(masked, 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    # uniforms as close to 1 as float64 allows stress the round-off clamp
    shape = (16,) if sampler == "systematic" else (16, 50)
    uniforms = torch.full(shape, 1.0 - 2**-53, dtype=torch.float64)
    for u in (uniforms, None):
        counts = santa.sample_counts(probs, 50, sampler, uniforms=u, generator=torch.Generator().manual_seed(0))
        assert (counts[:, masked] == 0).all()
        assert (counts.sum(-1) == 50).all()


def test_all_zero_row_gets_no_samples():
    probs = torch.zeros(2, 10)
    probs[0, 3] = 1.0
    counts = santa.sample_counts(probs, 4, "systematic")
    assert counts[0].tolist() == [0, 0, 0, 4, 0, 0, 0, 0, 0, 0]
    assert (counts[1] == 0).all()


def test_counts_on_hand_example():
    probs = torch.tensor([0.125, 0.375, 0.25, 0.25])  # F = .125 .5 .75 1, exact in binary
    # systematic S=4, U=0.5: T = .125 .375 .625 .875 → keys 1 1 2 3 (F(0) = .125 is not > .125)
    assert santa.sample_counts(probs, 4, "systematic", uniforms=torch.tensor(0.5)).tolist() == [0, 2, 1, 1]
    # iid with T = .05 .95 .5 → keys 0 3 2 (F(1)=.5 is not > .5)
    assert santa.sample_counts(probs, 3, "iid", uniforms=torch.tensor([0.05, 0.95, 0.5])).tolist() == [1, 0, 1, 1]


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(budget=0), ValueError),
        (dict(budget=-3), ValueError),
        (dict(budget=2.0), TypeError),
        (dict(budget=True), TypeError),
        (dict(sampler="uniform"), ValueError),
        (dict(uniforms=torch.rand(3, 5)), ValueError),  # systematic takes one uniform per row
        (dict(uniforms=torch.tensor([0.5, 1.0, 0.2])), ValueError),  # outside [0, 1)
    ],
)
def test_bad_sampler_arguments_raise(kwargs, error):
    args = dict(probs=random_probs((3, 5)), budget=4, sampler="systematic") | kwargs
    with pytest.raises(error):
        santa.sample_counts(**args)


def test_bad_probs_raise():
    with pytest.raises(TypeError, match="probs"):
        santa.sample_counts(torch.ones(3, 4, dtype=torch.int64), 2, "iid")
    with pytest.raises(ValueError, match="NaN"):
        santa.sample_counts(torch.tensor([0.5, math.nan]), 2, "iid")
    with pytest.raises(ValueError, match="non-negative"):
        santa.sample_counts(torch.tensor([1.5, -0.5]), 2, "iid")


def coordinate_variances(probs, values, budget, sampler):
    """Per-coordinate variance of ô: variance trace of each value coordinate alone. → [..., d]"""
    return torch.stack(
        [santa.variance_trace(probs, values[..., i : i + 1], budget, sampler) for i in range(values.shape[-1])], -1
    )


def draw_estimates(probs, values, budget, sampler, replicates, seed):
    """R independent estimates ô_r = (1/S) Σ_j c_j v_j: probs [rows, n], values [rows, n, d] → [R, rows, d]."""
    counts = santa.sample_counts(
        probs.expand(replicates, *probs.shape), budget, sampler, generator=torch.Generator().manual_seed(seed)
    )
    return torch.einsum("Rrn,rnd->Rrd", counts.double(), values) / budget


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_estimate_is_unbiased(sampler):
    """The mean of R draws lies within 4.5 standard errors of μ in every coordinate.

    iid and stratified use the closed-form variance; systematic (no closed form) uses the sample
    variance of its own draws (a t-statistic; R = 4000 makes it as tight as a z-test).
    """
    replicates, budget = 4000, 8
    probs = random_probs((3, 40), seed=11, peak=2.0)
    values = torch.randn(3, 40, 6, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    mu = torch.einsum("rn,rnd->rd", probs, values)
    estimates = draw_estimates(probs, values, budget, sampler, replicates, seed=13)
    if sampler == "systematic":
        variance = estimates.var(dim=0)
    else:
        variance = coordinate_variances(probs, values, budget, sampler)
    z = (estimates.mean(0) - mu) / torch.sqrt(variance / replicates)
    assert z.abs().max() < 4.5


@pytest.mark.parametrize("sampler", ["iid", "stratified"])
def test_closed_form_variance_matches_empirical(sampler):
    """E‖ô − μ‖² = tr Cov: the mean of Y_r = ‖ô_r − μ‖² over R draws is within 5 standard errors
    (std(Y)/√R, measured from the same draws) of the closed form."""
    replicates, budget = 4000, 16
    probs = random_probs((2, 60), seed=21, peak=1.5)
    values = torch.randn(2, 60, 4, generator=torch.Generator().manual_seed(22), dtype=torch.float64)
    mu = torch.einsum("rn,rnd->rd", probs, values)
    estimates = draw_estimates(probs, values, budget, sampler, replicates, seed=23)
    squared_error = ((estimates - mu) ** 2).sum(-1)  # [R, rows]
    standard_error = squared_error.std(dim=0) / math.sqrt(replicates)
    closed = santa.variance_trace(probs, values, budget, sampler)
    assert ((squared_error.mean(0) - closed).abs() < 5 * standard_error).all()


def test_stratified_variance_never_exceeds_iid():
    probs = random_probs((20, 128), seed=31, peak=2.0)
    values = torch.randn(20, 128, 8, generator=torch.Generator().manual_seed(32), dtype=torch.float64)
    for budget in (1, 4, 16, 64, 256):
        iid = santa.variance_trace(probs, values, budget, "iid")
        strat = santa.variance_trace(probs, values, budget, "stratified")
        assert (strat <= iid * (1 + 1e-9) + 1e-15).all()
    assert (santa.variance_trace(probs, values, 1, "stratified") - santa.variance_trace(probs, values, 1, "iid")).abs().max() < 1e-12


def test_systematic_replicate_variance_below_iid_on_smooth_values():
    """Values varying smoothly along the keys: systematic sampling beats iid by a wide margin."""
    n = 256
    probs = random_probs((4, n), seed=41)
    values = torch.linspace(-1, 1, n, dtype=torch.float64).expand(4, n).unsqueeze(-1)
    sys_var = santa.variance_trace(probs, values, 32, "systematic", replicates=512, generator=torch.Generator().manual_seed(0))
    iid_var = santa.variance_trace(probs, values, 32, "iid")
    assert (sys_var < iid_var / 4).all()


def test_stratum_weights_are_distributions():
    probs = random_probs((3, 50), seed=51)
    w = stratum_weights(probs, 7)
    assert torch.allclose(w.sum(-1), torch.ones(3, 7, dtype=torch.float64))
    assert torch.allclose(w.sum(-2) / 7, probs)
