"""Budgets from an error target (issue 42), the reference: per-row draws, the pilot's estimates, the
budget rule, and the calibration E‖ô − o‖² / ‖o‖² ≈ ε² on synthetic heads (tolerances from the
replicates' standard error)."""

import math

import pytest
import torch

import santa
from santa.attention import attention_probs, error_target_values
from santa.error_target import adaptive_budgets, check_error_target, check_pilot, pilot_statistics
from santa.sampling import SAMPLERS, draw_uniforms, sample_counts, sample_counts_per_row


@pytest.fixture(scope="module")
def head():
    """Two KV heads, four query heads (G = 2), 256 keys, d = 16: values with a common direction."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1, 16, generator=g)
    k = 0.6 * torch.randn(1, 2, 256, 16, generator=g)
    v = torch.randn(1, 2, 256, 16, generator=g) + 1.0
    probs = attention_probs(q, k)
    dense = santa.sampled_attention(q, k, v, 1, sampler="dense", enable_gqa=True).float()
    return q, k, v, probs, dense


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_row_at_the_cap_draws_what_a_fixed_budget_draws(sampler, head):
    probs = head[3][0, :, 0]  # [4, 256]
    u = draw_uniforms(probs.shape[:-1], 64, sampler, device=probs.device, generator=torch.Generator().manual_seed(1))
    budgets = torch.full(probs.shape[:-1], 64, dtype=torch.int64)
    assert torch.equal(sample_counts_per_row(probs, budgets, sampler, cap=64, uniforms=u),
                       sample_counts(probs, 64, sampler, uniforms=u))


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_row_with_budget_s_draws_the_fixed_budget_draw_of_s_on_its_first_points(sampler, head):
    probs = head[3][0, :, 0]
    cap = 64
    u = draw_uniforms(probs.shape[:-1], cap, sampler, device=probs.device, generator=torch.Generator().manual_seed(2))
    budgets = torch.tensor([1, 7, 33, 64])
    counts = sample_counts_per_row(probs, budgets, sampler, cap=cap, uniforms=u)
    assert torch.equal(counts.sum(-1), budgets)
    for r, s in enumerate(budgets.tolist()):
        own = u[r] if sampler == "systematic" else u[r, :s]
        assert torch.equal(counts[r], sample_counts(probs[r], s, sampler, uniforms=own))


def test_pilot_statistics_are_the_sample_variance_and_the_debiased_square_norm():
    rows = torch.tensor([[[1.0, 2.0], [3.0, 0.0], [2.0, 4.0]]], dtype=torch.float64)  # S₀ = 3 rows of d = 2
    mean = rows.mean(1)
    trace, norm2 = pilot_statistics(mean, (rows**2).sum(-1).mean(1), 3)
    expected_trace = ((rows - mean[:, None]) ** 2).sum(-1).sum(1) / 2
    assert torch.allclose(trace, expected_trace)
    assert torch.allclose(norm2, (mean**2).sum(-1) - expected_trace / 3)


def test_budgets_follow_the_rule_and_fall_back_to_the_cap():
    trace = torch.tensor([0.0, 1.0, 1.0, 1.0, 5.0, math.nan, 1.0], dtype=torch.float64)
    norm2 = torch.tensor([1.0, 1.0, 0.0, -2.0, 1e-9, 1.0, math.inf], dtype=torch.float64)
    # ε = 0.1: ⌈T / (0.01 N)⌉ → the pilot's 16 (floor), 100, cap (N ≤ 0), cap, cap (past it), cap (NaN), cap (inf)
    assert adaptive_budgets(trace, norm2, 0.1, 128, 16).tolist() == [16, 100, 128, 128, 128, 128, 128]
    assert adaptive_budgets(torch.tensor([0.5]).double(), torch.tensor([1.0]).double(), 0.1, 128, 16).tolist() == [50]
    assert adaptive_budgets(torch.tensor([0.0]).double(), torch.tensor([1.0]).double(), 0.1, 8, 16).tolist() == [8]  # cap first


def test_a_head_on_identical_values_draws_the_pilots_count_and_is_exact():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 2, 1, 8, generator=g), torch.randn(1, 2, 64, 8, generator=g)
    v = torch.randn(1, 2, 1, 8, generator=g).expand(1, 2, 64, 8).contiguous()  # every key holds the same value
    out, draw = error_target_values(attention_probs(q, k), v, 128, "systematic", error_target=0.01,
                                    generator=torch.Generator().manual_seed(0))
    assert draw.budgets.tolist() == [[[16], [16]]]  # T̂ = 0: the floor, the pilot's own count
    assert torch.equal(draw.rows_read(), torch.full((1, 2, 1), 32))
    assert torch.allclose(out, v[:, :, :1], atol=1e-6)


@pytest.mark.parametrize(("sampler", "error_target"), [("iid", 0.2), ("iid", 0.1), ("stratified", 0.1), ("systematic", 0.1)])
def test_the_realised_relative_error_meets_the_target(sampler, error_target, head):
    """Mean of ‖ô − o‖² / ‖o‖² over 200 seeds, per head, against ε²: iid within its standard error of
    ε² (the rule is calibrated for iid; the ceiling lowers it by at most 1/S_r), stratified and
    systematic at most 1.1 ε² (their variance is at most iid's on these heads)."""
    _, _, v, probs, dense = head
    replicates = 200
    errors = []
    for seed in range(replicates):
        out, draw = error_target_values(probs, v, 4096, sampler, error_target=error_target,
                                        generator=torch.Generator().manual_seed(seed))
        errors.append(((out - dense) ** 2).sum(-1) / (dense**2).sum(-1))
    ratio = torch.stack(errors).flatten(1) / error_target**2  # [R, heads]
    mean, standard_error = ratio.mean(0), ratio.std(0) / math.sqrt(replicates)
    assert (draw.budgets > 4).all() and (draw.budgets < 4096).all()  # the rule, not the floor or cap, decided
    assert (mean <= 1.1 + 3 * standard_error).all(), (mean, standard_error)
    if sampler == "iid":
        ceiling = 1 / draw.budgets.double().flatten()  # ⌈⌉ takes up to one draw more than T̂/(ε²N̂)
        assert (mean >= 1 - ceiling - 3 * standard_error).all(), (mean, standard_error)


def test_the_output_is_unbiased(head):
    """The mean of R outputs is within its standard error of o: ‖ō_R − o‖² ≤ 3 · E‖ô − o‖² / R."""
    _, _, v, probs, dense = head
    replicates = 300
    outs, errors = [], []
    for seed in range(replicates):
        out, _ = error_target_values(probs, v, 4096, "iid", error_target=0.3, generator=torch.Generator().manual_seed(seed))
        outs.append(out)
        errors.append(((out - dense) ** 2).sum(-1))
    bias2 = ((torch.stack(outs).mean(0) - dense) ** 2).sum(-1)
    assert (bias2 <= 3 * torch.stack(errors).mean(0) / replicates).all()


def test_sampled_attention_takes_an_error_target(head):
    q, k, v, probs, _ = head
    g = torch.Generator().manual_seed(5)
    pilot_u = draw_uniforms(probs.shape[:-1], 8, "systematic", device=q.device, generator=g)
    output_u = draw_uniforms(probs.shape[:-1], 64, "systematic", device=q.device, generator=g)
    out = santa.sampled_attention(q, k, v, 64, sampler="systematic", enable_gqa=True, error_target=0.2, pilot=8,
                                  uniforms=(pilot_u, output_u))
    expected, draw = error_target_values(probs, v, 64, "systematic", error_target=0.2, pilot=8, uniforms=(pilot_u, output_u))
    assert torch.equal(out, expected.to(q.dtype))
    assert torch.equal(draw.pilot_counts.sum(-1), torch.full_like(draw.budgets, 8))
    again = santa.sampled_attention(q, k, v, 64, enable_gqa=True, error_target=0.2, generator=torch.Generator().manual_seed(9))
    assert torch.equal(again, santa.sampled_attention(q, k, v, 64, enable_gqa=True, error_target=0.2,
                                                      generator=torch.Generator().manual_seed(9)))


def test_a_nan_row_stays_nan_and_the_others_keep_their_draws(head):
    q, k, v, _, _ = head
    bad = q.clone()
    bad[0, 1, 0, 0] = math.nan
    clean = santa.sampled_attention(q, k, v, 64, enable_gqa=True, error_target=0.2, generator=torch.Generator().manual_seed(4))
    out = santa.sampled_attention(bad, k, v, 64, enable_gqa=True, error_target=0.2, generator=torch.Generator().manual_seed(4))
    assert torch.isnan(out[0, 1]).all()
    assert torch.equal(out[0, [0, 2, 3]], clean[0, [0, 2, 3]])


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (-0.1, ValueError), (math.nan, ValueError),
                                              (math.inf, ValueError), ("0.1", TypeError), (True, TypeError),
                                              (torch.tensor(0.1), TypeError)])
def test_a_bad_error_target_is_refused_by_name(value, error, head):
    q, k, v, _, _ = head
    with pytest.raises(error, match="error_target"):
        check_error_target(value)
    with pytest.raises(error, match="error_target"):
        santa.sampled_attention(q, k, v, 64, enable_gqa=True, error_target=value)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(pilot=1), ValueError, "pilot"),
    (dict(pilot=8.0), TypeError, "pilot"),
    (dict(sampler="topk"), ValueError, "stochastic sampler"),
    (dict(sampler="dense"), ValueError, "stochastic sampler"),
    (dict(uniforms=torch.zeros(1, 4, 1)), TypeError, "pair"),
])
def test_bad_error_target_arguments_are_refused(kwargs, error, match, head):
    q, k, v, _, _ = head
    with pytest.raises(error, match=match):
        santa.sampled_attention(q, k, v, 64, enable_gqa=True, error_target=0.1, **kwargs)


def test_per_row_budgets_are_checked():
    probs = torch.full((2, 8), 1 / 8)
    for budgets, error in ((torch.tensor([1, 9]), ValueError), (torch.tensor([0, 2]), ValueError),
                           (torch.tensor([1.0, 2.0]), TypeError), (torch.tensor([1]), ValueError)):
        with pytest.raises(error, match="budgets"):
            sample_counts_per_row(probs, budgets, "iid", cap=8)
    assert check_pilot(2) == 2


def test_pilot_moments_read_the_sampled_rows_as_a_dense_product_would(head):
    from santa.attention import pilot_moments, weighted_values

    _, _, v, probs, _ = head
    counts = sample_counts(probs, 16, "systematic", generator=torch.Generator().manual_seed(6))
    mean, square_mean = pilot_moments(counts, v, 16)
    weights = counts.double() / 16
    assert torch.allclose(mean, weighted_values(weights, v.double()))
    assert torch.allclose(square_mean, weighted_values(weights, (v.double() ** 2).sum(-1, keepdim=True))[..., 0])


def test_a_pilots_request_keyed_uniform_is_never_one_of_its_outputs():
    """The pilot's stream: prop's 1 under a systematic output (stream 0); under iid and stratified outputs, whose draw
    m takes stream m, one no draw uses (on stream 1 the pilot would share draw 1's uniform)."""
    from santa.kernels.reference import call_uniforms, pilot_uniforms, sampler_uniforms

    positions = torch.tensor([[7], [300]])
    assert torch.equal(pilot_uniforms(5, positions, 2, "systematic"), call_uniforms(5, 0, positions, 2, 2, 1))
    for sampler in ("iid", "stratified"):
        pilot = pilot_uniforms(5, positions, 2, sampler)  # [B, H, 1]
        outputs = sampler_uniforms(5, positions, 2, sampler, 64)  # [B, H, 1, 64]
        assert not (outputs == pilot.unsqueeze(-1)).any()
        assert ((pilot >= 0) & (pilot < 1)).all()


def test_a_pilot_without_an_error_target_is_refused_on_every_entry(head):
    """pilot sizes an error target's pilot draws; given alone it would size nothing, so every entry refuses it by name
    instead of ignoring it (the default, 16, stays accepted)."""
    import santa.hf
    from santa.kernels import plan_decode

    q, k, v, _, _ = head
    match = r"pilot=8 sizes an error target's pilot draws: pass error_target too"
    with pytest.raises(ValueError, match=match):
        santa.sampled_attention(q, k, v, 64, enable_gqa=True, pilot=8)
    with pytest.raises(ValueError, match=match):
        santa.hf.SantaConfig(pilot=8)
    with pytest.raises(ValueError, match=match):
        plan_decode(batch=1, heads=4, kv_heads=2, head_dim=8, n_keys=16, budget=4, dtype=torch.float32, device="cpu", pilot=8)
    assert santa.sampled_attention(q, k, v, 64, enable_gqa=True, pilot=16).shape == q.shape
