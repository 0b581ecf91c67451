"""Bernoulli qKᵀ: exact draws from fixed uniforms, unbiasedness and closed-form variance of the
scores, the share of key features read, one feature subset per GQA group."""

import math

import pytest
import torch

import santa
from santa.bernoulli import bernoulli_query, feature_probabilities, group_heads


def count_variance(probs: torch.Tensor, samples: int, sampler: str) -> torch.Tensor:
    """Var(Σ_n b⁽ⁿ⁾) per feature: Binomial for iid; only the stratum holding B·p is random otherwise."""
    if sampler == "iid":
        return samples * probs * (1 - probs)
    frac = samples * probs - torch.floor(samples * probs)
    return frac * (1 - frac)


def score_variance(query, key, samples, sampler, kv_heads):
    """Closed form Var(q̃ kⱼ) = Σ_i (q_gi / m_i)² · norm² · Var(count_i) / B² · k_ji² (independent features)."""
    m, norm, probs = feature_probabilities(group_heads(query, kv_heads))
    b, hq, lq, d = query.shape
    per_m = norm**2 * count_variance(probs, samples, sampler) / samples**2  # Var(m̂_i)
    ratio = (query.double().reshape(b, kv_heads, hq // kv_heads, lq, d) / m.unsqueeze(2)) ** 2
    var_q = (ratio * per_m.unsqueeze(2)).reshape(b, hq, lq, d)  # Var(q̃_gi)
    k2 = key.double().repeat_interleave(hq // kv_heads, dim=1) ** 2  # [b, hq, n, d]
    return torch.einsum("bhld,bhnd->bhln", var_q, k2)


def replicate(query, key, replicates):
    """R independent copies along the batch dimension (each batch row draws its own uniforms)."""
    return query.expand(replicates, *query.shape[1:]), key.expand(replicates, *key.shape[1:])


def test_fixed_uniforms_give_the_hand_computed_query():
    # |q| / max|q| = 0.3, 1, 0.5, 0 with B = 4: B·p = 1.2, 4, 2, 0
    query = torch.tensor([0.3, -1.0, 0.5, 0.0], dtype=torch.float64).reshape(1, 1, 1, 4)
    # stratified: c = ⌊B·p⌋ + [U < frac(B·p)]; only 0.3 has a random stratum (frac 0.2)
    low = torch.full((1, 1, 1, 4), 0.1, dtype=torch.float64)
    high = torch.full((1, 1, 1, 4), 0.5, dtype=torch.float64)
    assert bernoulli_query(query, 4, uniforms=low).query.flatten().tolist() == [0.5, -1.0, 0.5, 0.0]  # c = 2, 4, 2, 0
    drawn = bernoulli_query(query, 4, uniforms=high)
    assert drawn.query.flatten().tolist() == [0.25, -1.0, 0.5, 0.0]  # c = 1, 4, 2, 0
    assert drawn.features_read.flatten().tolist() == [True, True, True, False]
    assert drawn.read_fraction == 0.75
    # iid: c = #{n : U_n < p}; with U = .05 .25 .45 .65 per feature: c = 2, 4, 3, 0
    iid = torch.tensor([0.05, 0.25, 0.45, 0.65], dtype=torch.float64).expand(1, 1, 1, 4, 4)
    assert bernoulli_query(query, 4, sampler="iid", uniforms=iid).query.flatten().tolist() == [0.5, -1.0, 0.75, 0.0]


def test_stratified_counts_match_the_strata_definition():
    """c = ⌊B·p⌋ + [U < frac(B·p)] is the count of b⁽ⁿ⁾ = [(n + U_n)/B < p] when U_n = U in the random stratum."""
    from santa.bernoulli import draw_counts

    g = torch.Generator().manual_seed(8)
    probs, samples = torch.rand(200, generator=g, dtype=torch.float64), 6
    u = torch.rand(200, generator=g, dtype=torch.float64)
    strata = (torch.arange(samples, dtype=torch.float64) + u[:, None]) / samples  # every stratum uses U
    assert torch.equal(draw_counts(probs, samples, "stratified", u), (strata < probs[:, None]).sum(-1).double())


def test_single_head_draw_is_norm_times_ternary_mean():
    """G = 1: q̃ = (norm / B) Σ_n b⁽ⁿ⁾ ⊙ sign(q), the paper's ternary form."""
    g = torch.Generator().manual_seed(1)
    query = torch.randn(2, 3, 2, 16, generator=g, dtype=torch.float64)
    samples = 5
    uniforms = torch.rand(2, 3, 2, 16, samples, generator=g, dtype=torch.float64)
    drawn = bernoulli_query(query, samples, sampler="iid", uniforms=uniforms)
    norm = query.abs().amax(dim=-1, keepdim=True)
    ternary = (uniforms < (query.abs() / norm).unsqueeze(-1)).double() * query.sign().unsqueeze(-1)  # q̂⁽ⁿ⁾
    assert torch.allclose(drawn.query, norm * ternary.mean(dim=-1), atol=1e-12)


def test_stratified_is_exact_when_every_b_times_p_is_an_integer():
    """Probabilities on a 1/B grid: the stratified count is exactly B·p, so q̃ = q and the
    attention equals dense attention."""
    g = torch.Generator().manual_seed(2)
    half = torch.randint(-8, 9, (1, 2, 1, 8), generator=g).double() / 8
    half[..., 0] = 1.0  # max |q| = 1 in every row
    # GQA, 2 heads per KV head: the second head of a group is −1 × the first, so m = |q| stays on the grid
    query = torch.stack([half, -half], dim=2).reshape(1, 4, 1, 8)
    key = torch.randn(1, 2, 20, 8, generator=g, dtype=torch.float64)
    value = torch.randn(1, 2, 20, 8, generator=g, dtype=torch.float64)
    assert torch.allclose(bernoulli_query(query, 8, kv_heads=2, generator=g).query, query, atol=1e-12)
    exact = santa.sampled_attention(query, key, value, 1, sampler="dense", enable_gqa=True)
    scored = santa.sampled_attention(query, key, value, 1, sampler="dense", enable_gqa=True, score_samples=8, generator=g)
    assert scored.dtype == query.dtype
    assert torch.allclose(scored, exact, atol=1e-12)


@pytest.mark.parametrize(
    "sampler,kv_heads,samples", [("iid", 4, 4), ("iid", 4, 16), ("stratified", 4, 4), ("stratified", 4, 16), ("stratified", 2, 4)]
)
def test_scores_are_unbiased_with_the_closed_form_variance(sampler, kv_heads, samples):
    """Over R draws: the mean score is within 4.5 standard errors of q·kᵀ everywhere, and the mean
    squared error (summed over keys) is within 5 of its own standard errors of the closed form
    (which the 1/B test below then relies on)."""
    replicates = 4000
    g = torch.Generator().manual_seed(3)
    query = torch.randn(1, 4, 1, 12, generator=g, dtype=torch.float64)
    key = torch.randn(1, kv_heads, 10, 12, generator=g, dtype=torch.float64)
    exact = query @ key.repeat_interleave(4 // kv_heads, dim=1).transpose(-1, -2)  # [1, Hq, 1, n]
    q_r, k_r = replicate(query, key, replicates)
    drawn = bernoulli_query(q_r, samples, kv_heads=kv_heads, sampler=sampler, generator=g).query
    scores = drawn @ k_r.repeat_interleave(4 // kv_heads, dim=1).transpose(-1, -2)  # [R, Hq, 1, n]
    variance = score_variance(query, key, samples, sampler, kv_heads)[0]
    z = (scores.mean(0) - exact[0]) / torch.sqrt(variance / replicates).clamp_min(1e-12)
    assert z.abs().max() < 4.5
    squared_error = ((scores - exact) ** 2).sum(-1)  # [R, Hq, 1]
    standard_error = squared_error.std(dim=0) / math.sqrt(replicates)
    assert ((squared_error.mean(0) - variance.sum(-1)).abs() < 5 * standard_error).all()


def test_stratified_error_falls_as_one_over_b_and_iid_as_one_over_sqrt_b():
    """Closed forms (checked against the library's draws at B = 4 and 16 above): from B to 4B the
    score variance drops ~4× for iid and ≥ 8× for stratified on generic queries (1/B against 1/B²)."""
    g = torch.Generator().manual_seed(4)
    query = torch.randn(4, 8, 1, 64, generator=g, dtype=torch.float64)
    key = torch.randn(4, 8, 50, 64, generator=g, dtype=torch.float64)
    iid = [score_variance(query, key, b, "iid", 8).sum() for b in (8, 32)]
    strat = [score_variance(query, key, b, "stratified", 8).sum() for b in (8, 32)]
    assert 3.5 < iid[0] / iid[1] < 4.5
    assert strat[0] / strat[1] > 8
    assert strat[0] < iid[0] / 4


@pytest.mark.parametrize("sampler", ["iid", "stratified"])
def test_share_of_features_read_matches_its_probability(sampler):
    """P(feature read) = 1 − (1 − p)^B for iid, min(1, B·p) for stratified."""
    replicates, samples = 3000, 4
    g = torch.Generator().manual_seed(5)
    query = torch.randn(1, 2, 1, 16, generator=g, dtype=torch.float64)
    _, _, probs = feature_probabilities(group_heads(query, 2))
    expected = 1 - (1 - probs) ** samples if sampler == "iid" else (samples * probs).clamp(max=1.0)
    drawn = bernoulli_query(query.expand(replicates, -1, -1, -1), samples, sampler=sampler, generator=g)
    observed = drawn.features_read.double().mean(0)
    standard_error = torch.sqrt(expected * (1 - expected) / replicates)
    assert ((observed - expected[0]).abs() <= 4.5 * standard_error[0] + 1e-12).all()


def test_a_gqa_group_reads_one_feature_subset():
    g = torch.Generator().manual_seed(6)
    query = torch.randn(2, 6, 3, 32, generator=g)
    drawn = bernoulli_query(query, 2, kv_heads=2, generator=g)
    assert drawn.features_read.shape == (2, 2, 3, 32)
    nonzero = (drawn.query != 0).reshape(2, 2, 3, 3, 32)  # [b, hkv, G, lq, d]
    assert (nonzero <= drawn.features_read.unsqueeze(2)).all()  # no head reads outside its group's subset
    assert 0 < drawn.read_fraction < 1


def test_bad_arguments_are_refused_by_name():
    query = torch.randn(1, 4, 1, 8)
    with pytest.raises(ValueError, match="samples"):
        bernoulli_query(query, 0)
    with pytest.raises(TypeError, match="samples"):
        bernoulli_query(query, 2.0)
    with pytest.raises(ValueError, match="kv_heads"):
        bernoulli_query(query, 2, kv_heads=3)
    with pytest.raises(ValueError, match="sampler"):
        bernoulli_query(query, 2, sampler="topk")
    with pytest.raises(ValueError, match=r"uniforms must have shape \[1, 4, 1, 8\]"):
        bernoulli_query(query, 2, uniforms=torch.rand(1, 4, 1, 8, 2))
    with pytest.raises(ValueError, match=r"uniforms must have shape \[1, 4, 1, 8, 2\]"):
        bernoulli_query(query, 2, sampler="iid", uniforms=torch.rand(1, 4, 1, 8))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        bernoulli_query(query, 2, uniforms=torch.full((1, 4, 1, 8), 5.0))
    with pytest.raises(ValueError, match="uniforms must have shape"):
        bernoulli_query(query, 2, uniforms=[0.5] * 8)
    with pytest.raises(ValueError, match="D ≥ 1"):
        bernoulli_query(torch.ones(1, 4, 1, 0), 2)
    with pytest.raises(ValueError, match=r"\[B, Hq, Lq, D\]"):
        bernoulli_query(query[0], 2)
    with pytest.raises(TypeError, match="floating-point"):
        bernoulli_query(torch.ones(1, 4, 1, 8, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="score_samples"):
        santa.sampled_attention(query, query, query, 4, score_samples=0)
    with pytest.raises(ValueError, match="score_sampler"):
        santa.sampled_attention(query, query, query, 4, score_samples=2, score_sampler="dense")
    with pytest.raises(ValueError, match="score_sampler"):  # checked even when the scores are exact
        santa.sampled_attention(query, query, query, 4, score_sampler="bogus")


def test_layer_metrics_are_zero_for_an_exact_draw_and_count_the_features_read():
    """A query on the 1/B grid with one zero feature: stratified B = 4 is exact (KL 0, error 0) and
    reads every feature but the zero one."""
    from santa.eval.score_stage import layer_metrics
    from santa.eval.variance import Captured

    g = torch.Generator().manual_seed(7)
    # [Hq=2, D=4], one KV head; equal magnitudes keep the group mean |q| on the 1/4 grid
    query = torch.tensor([[1.0, -0.25, 0.5, 0.0], [-1.0, -0.25, -0.5, 0.0]])
    keys = torch.randn(1, 6, 4, generator=g)
    probs = torch.softmax(query @ keys[0].T * 0.5, dim=-1)
    layer = Captured(probs, torch.randn(2, 6, 3, generator=g), query, keys, 0.5)
    metrics = layer_metrics(layer, 4, "stratified", g)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-12)
    assert metrics["relative_error"] == pytest.approx(0.0, abs=1e-12)
    assert metrics["read_kv"] == metrics["read_head"] == metrics["read_head_kv"] == 0.75
    # few iid draws miss features and perturb the weights
    noisy = layer_metrics(layer, 1, "iid", g)
    assert noisy["read_head"] < 0.75 and noisy["kl"] > 0
