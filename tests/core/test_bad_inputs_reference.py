"""Issue 11, reference side: every bad input a clear error, never a silent answer.

sampled_attention's arguments (masks, D, scale, flags, dtypes), non-finite input (NaN out in the
rows it reaches, as SDPA), budgets past memory (refused fast, or computed in O(n)), SantaConfig
and configure, and the stats helpers.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import santa
import santa.hf
from helpers import qkv, random_probs, tiny_hf_model
from santa import sampling
from santa.stats import stratum_weights

SAMPLERS = ["iid", "stratified", "systematic", "topk", "dense"]


def attend(q, k, v, budget=8, seed=3, **kwargs):
    kwargs.setdefault("enable_gqa", q.shape[1] != k.shape[1])
    return santa.sampled_attention(q, k, v, budget, generator=torch.Generator().manual_seed(seed), **kwargs)


# ---- item 4: sampled_attention's arguments -------------------------------------------------------


def test_mask_that_does_not_broadcast_to_the_output_is_refused():
    """A [3, 4, 5, 50] mask on a [1, 4, 1, D] query used to return a [3, 4, 5, D] tensor."""
    q, k, v = qkv(b=1, hq=4, hkv=4, lq=1, lk=50, d=16)
    mask = torch.ones(3, 4, 5, 50, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"attn_mask must broadcast to \[B, Hq, Lq, Lk\] = \[1, 4, 1, 50\], got \[3, 4, 5, 50\]"):
        santa.sampled_attention(q, k, v, 4, attn_mask=mask)


@pytest.mark.parametrize("shape", [(2, 50), (2, 1, 1, 50), (1, 2, 1, 50)])
def test_mask_with_more_rows_batches_or_heads_than_the_query_is_refused(shape):
    q, k, v = qkv(b=1, hq=4, hkv=4, lq=1, lk=50, d=8)
    with pytest.raises(ValueError, match="attn_mask must broadcast"):
        santa.sampled_attention(q, k, v, 4, attn_mask=torch.ones(shape, dtype=torch.bool))


def test_scalar_and_per_key_masks_broadcast():
    q, k, v = qkv(lk=10, lq=3, d=8)
    plain = attend(q, k, v, sampler="dense")
    assert torch.equal(attend(q, k, v, sampler="dense", attn_mask=torch.tensor(True)), plain)
    visible = torch.arange(10) < 6
    torch.testing.assert_close(attend(q, k, v, sampler="dense", attn_mask=visible), attend(q, k[:, :, :6], v[:, :, :6], sampler="dense"))


def test_zero_head_dim_is_refused():
    q, k, v = torch.ones(1, 2, 1, 0), torch.ones(1, 2, 5, 0), torch.ones(1, 2, 5, 0)
    with pytest.raises(ValueError, match="head dim D ≥ 1"):
        santa.sampled_attention(q, k, v, 4)


@pytest.mark.parametrize("scale", ["x", True, torch.tensor(0.5), [0.5]])
def test_scale_that_is_not_a_real_number_is_refused(scale):
    q, k, v = qkv(lq=3, lk=20, d=8)
    with pytest.raises(TypeError, match="scale must be a real number or None"):
        attend(q, k, v, scale=scale)


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
def test_non_finite_scale_is_refused(scale):
    q, k, v = qkv(lq=3, lk=20, d=8)
    with pytest.raises(ValueError, match="scale must be finite"):
        attend(q, k, v, scale=scale)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_meta_tensors_are_refused_naming_the_argument(sampler):
    """The samplers used to fail inside torch (``Tensor.item() cannot be called on meta tensors``)."""
    q, k, v = (x.to("meta") for x in qkv(lq=3, lk=20, d=8))
    with pytest.raises(ValueError, match="query is on the meta device"):
        santa.sampled_attention(q, k, v, 4, sampler=sampler, enable_gqa=True)


def test_meta_probabilities_are_refused_naming_the_argument():
    probs = random_probs().to("meta")
    with pytest.raises(ValueError, match="probs is on the meta device"):
        santa.sample_counts(probs, 4, "systematic")
    with pytest.raises(ValueError, match="probs is on the meta device"):
        santa.variance_trace(probs, torch.ones(4, 50, 2, device="meta"), 4, "iid")


def test_zero_and_negative_scales_are_softmax_of_scaled_scores():
    q, k, v = qkv(hkv=6, lq=3, lk=20, d=8)
    for scale in (0.0, -0.7):
        torch.testing.assert_close(attend(q, k, v, sampler="dense", scale=scale), F.scaled_dot_product_attention(q, k, v, scale=scale))


@pytest.mark.parametrize("flag", ["is_causal", "enable_gqa"])
@pytest.mark.parametrize("value", ["no", 0, None])
def test_flags_must_be_bools(flag, value):
    """is_causal="no" is truthy: it used to apply a causal mask."""
    q, k, v = qkv(hkv=6, lq=3, lk=20, d=8)
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        santa.sampled_attention(q, k, v, 4, **{flag: value})


def test_query_key_value_of_different_dtypes_are_refused():
    q, k, v = qkv(hkv=6, lq=3, lk=20, d=8)
    with pytest.raises(TypeError, match="one dtype"):
        santa.sampled_attention(q.half(), k, v, 4)


def test_generator_of_wrong_type_is_refused():
    q, k, v = qkv(hkv=6, lq=3, lk=20, d=8)
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got int"):
        santa.sampled_attention(q, k, v, 4, generator=0)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        santa.sample_counts(random_probs(), 4, "iid", generator=0)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        santa.bernoulli_query(q, 4, generator=0)


# ---- item 1: non-finite input gives NaN in the rows it reaches, as SDPA --------------------------


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("where", ["query", "key"])
def test_nan_in_query_or_key_gives_nan_rows_and_leaves_other_rows_unchanged(sampler, where):
    """NaN in batch 0, query head 1, row 2 (query) or KV head 0, key 5 (key, read by heads 0–2):
    exactly those rows are NaN; every other row is bitwise the clean output (same draws)."""
    q, k, v = qkv(lq=3, lk=20, d=8)
    clean = attend(q, k, v, sampler=sampler)
    bad = torch.zeros(2, 6, 3, dtype=torch.bool)
    if where == "query":
        q[0, 1, 2, 3] = math.nan
        bad[0, 1, 2] = True
    else:
        k[0, 0, 5, 3] = math.nan
        bad[0, :3] = True
    out = attend(q, k, v, sampler=sampler)
    assert torch.isnan(out[bad]).all()
    assert torch.equal(out[~bad], clean[~bad])


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("bad_value", [math.nan, math.inf])
def test_nan_or_inf_in_value_reaches_its_batch_and_group_only(sampler, bad_value):
    """w·V with 0·NaN = 0·inf = NaN: every row of batch 0 that reads KV head 1 is non-finite
    (sampled or not), as in SDPA; the other rows are bitwise the clean output."""
    q, k, v = qkv(lq=3, lk=20, d=8)
    clean = attend(q, k, v, sampler=sampler)
    v[1, 1, 4, :] = bad_value
    out = attend(q, k, v, sampler=sampler)
    assert not torch.isfinite(out[1, 3:]).any()
    assert torch.equal(out[0], clean[0]) and torch.equal(out[1, :3], clean[1, :3])


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_nan_with_a_padding_mask_gives_nan_in_its_rows_only(sampler):
    q, k, v = qkv(lq=3, lk=20, d=8)
    mask = torch.ones(2, 1, 3, 20, dtype=torch.bool)
    mask[1, :, :, :8] = False  # batch 1 left-padded
    mask[0, :, 0] = False  # batch 0, row 0 fully masked: zeros
    clean = attend(q, k, v, sampler=sampler, attn_mask=mask)
    k[1, 1, 10, 0] = math.nan  # a visible key of batch 1, read by heads 3–5
    out = attend(q, k, v, sampler=sampler, attn_mask=mask)
    assert torch.isnan(out[1, 3:]).all()
    assert torch.equal(out[1, :3], clean[1, :3]) and torch.equal(out[0], clean[0])
    assert (out[0, :, 0] == 0).all()


@pytest.mark.parametrize("score_sampler", ["stratified", "iid"])
def test_nan_query_with_bernoulli_scores_gives_nan_in_its_group_only(score_sampler):
    """Bernoulli qKᵀ: the heads of a GQA group share one draw of their mean |q|, so a NaN in
    head 1 makes heads 0–2 of that batch element and row NaN; nothing else changes."""
    q, k, v = qkv(lq=3, lk=20, d=8)
    clean = attend(q, k, v, score_samples=4, score_sampler=score_sampler)
    q[1, 1, 0, 2] = math.nan
    out = attend(q, k, v, score_samples=4, score_sampler=score_sampler)
    bad = torch.zeros(2, 6, 3, dtype=torch.bool)
    bad[1, :3, 0] = True
    assert torch.isnan(out[bad]).all()
    assert torch.equal(out[~bad], clean[~bad])


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_plus_inf_score_gives_a_nan_row_as_sdpa(sampler):
    """softmax is undefined with a +inf score (inf − inf): NaN, never a point mass or a finite row."""
    q, k, v = qkv(hkv=6, lq=1, lk=20, d=8)
    bias = torch.zeros(2, 1, 1, 20)
    bias[0, 0, 0, 7] = math.inf
    out = attend(q, k, v, sampler=sampler, attn_mask=bias)
    assert torch.isnan(F.scaled_dot_product_attention(q, k, v, attn_mask=bias)[0]).all()
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1]).all()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_overflowing_scores_give_nan_rows(sampler):
    """Finite q and k whose product overflows float32 to ±inf: NaN, as in SDPA."""
    q, k, v = qkv(hkv=6, lq=1, lk=20, d=8)
    q[0, 2] *= 1e20
    k[0, 2] *= 1e20
    out = attend(q, k, v, sampler=sampler)
    assert torch.isnan(out[0, 2]).all()
    assert torch.isfinite(out[0, :2]).all() and torch.isfinite(out[1]).all()


def test_minus_inf_score_is_a_masked_key_as_sdpa():
    """q·k = −inf (an infinite key the query points away from) masks that key, exactly as SDPA."""
    q, k, v = qkv(hkv=6, lq=1, lk=20, d=8)
    q[..., 0] = 1.0
    k[:, :, 4, 0] = -math.inf
    out = attend(q, k, v, sampler="dense")
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert torch.isfinite(out).all()


class FakeAttention(torch.nn.Module):
    """What santa_attention_forward reads from a transformers attention layer."""

    def __init__(self, config, layer_idx=0, groups=3):
        super().__init__()
        self.santa_config, self.layer_idx, self.num_key_value_groups, self.is_causal = config, layer_idx, groups, True


def test_hf_backend_gives_nan_rows_instead_of_raising_about_probs():
    """A NaN key in one sequence of the batch used to raise about `probs` inside sample_counts."""
    q, k, v = qkv(lq=1, lk=20, d=8)
    k[0, 1, 3] = math.nan
    module = FakeAttention(santa.hf.SantaConfig(budget=4, kernel="reference", record_stats=True))
    out, _ = santa.hf.santa_attention_forward(module, q, k, v, None)  # [B, Lq, Hq, D]
    assert torch.isnan(out[0, :, 3:]).all()
    assert torch.isfinite(out[0, :, :3]).all() and torch.isfinite(out[1]).all()


# ---- item 5: budgets past memory -----------------------------------------------------------------


@pytest.mark.parametrize("sampler", ["iid", "stratified", "systematic"])
def test_budget_far_past_memory_is_refused_before_drawing(sampler):
    """budget=10**9 used to end in an allocator error or a long hang; now a ValueError at once."""
    with pytest.raises(ValueError, match=r"budget=1000000000 is above the 50 keys .* past santa.sampling.MAX_DRAWS"):
        santa.sample_counts(random_probs(), 10**9, sampler)
    with pytest.raises(ValueError, match="budget=1000000000"):
        santa.sample_indices(random_probs(), 10**9, sampler)
    q, k, v = qkv(lq=3, lk=20, d=8)
    with pytest.raises(ValueError, match="budget=1000000000"):
        attend(q, k, v, budget=10**9, sampler=sampler)


def test_systematic_variance_with_a_budget_far_past_memory_is_refused():
    values = torch.randn(4, 50, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="budget=1000000000"):
        santa.variance_trace(random_probs(), values, 10**9, "systematic")


def test_budget_up_to_the_number_of_keys_is_never_refused(monkeypatch):
    """S ≤ n costs no more than the probabilities already in memory: drawn whatever MAX_DRAWS is."""
    monkeypatch.setattr(sampling, "MAX_DRAWS", 10)
    counts = santa.sample_counts(random_probs((4, 50)), 50, "systematic", generator=torch.Generator().manual_seed(0))
    assert (counts.sum(-1) == 50).all()


def test_budget_above_the_keys_is_drawn_up_to_max_draws(monkeypatch):
    monkeypatch.setattr(sampling, "MAX_DRAWS", 100)
    probs = random_probs((4, 5))
    assert (santa.sample_counts(probs, 25, "iid", generator=torch.Generator().manual_seed(0)).sum(-1) == 25).all()  # 100 draws
    with pytest.raises(ValueError, match="= 104 draws"):
        santa.sample_counts(probs, 26, "iid")


def test_topk_and_dense_take_any_budget():
    q, k, v = qkv(lq=3, lk=20, d=8)
    torch.testing.assert_close(attend(q, k, v, budget=10**9, sampler="topk"), attend(q, k, v, sampler="dense"))
    assert torch.equal(attend(q, k, v, budget=10**9, sampler="dense"), attend(q, k, v, sampler="dense"))


def all_strata_variance(probs, values, budget):
    """(1/S²) Σ_m tr Σ_m over every stratum m = 0…S−1 (the definition)."""
    w, vv = stratum_weights(probs, budget), values.double()
    mu = torch.einsum("...mn,...nd->...md", w, vv)
    return (torch.einsum("...mn,...n->...m", w, (vv * vv).sum(-1)) - (mu * mu).sum(-1)).sum(-1) / budget**2


@pytest.mark.parametrize("budget", [10, 11, 37, 1000])
def test_stratified_variance_past_the_keys_sums_only_strata_holding_a_cdf_step(budget):
    probs = random_probs((3, 10), seed=4)
    probs[0, 3] = probs[1, -2:] = 0.0  # a zero key and zero tail keys
    probs = probs / probs.sum(-1, keepdim=True)
    values = torch.randn(3, 10, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    torch.testing.assert_close(santa.variance_trace(probs, values, budget, "stratified"), all_strata_variance(probs, values, budget), rtol=1e-9, atol=1e-18)


def test_stratified_variance_at_a_budget_far_past_memory_is_computed_not_refused():
    """O(n²) per row for any S: at S = 10**9 it is finite, positive and far below iid's (1/S² vs 1/S)."""
    probs, values = random_probs(), torch.randn(4, 50, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    strat = santa.variance_trace(probs, values, 10**9, "stratified")
    iid = santa.variance_trace(probs, values, 10**9, "iid")
    assert (strat > 0).all() and (strat < iid * 1e-6).all()


def test_bernoulli_iid_draws_past_max_draws_are_refused_and_stratified_takes_any_count(monkeypatch):
    monkeypatch.setattr(sampling, "MAX_DRAWS", 1000)
    q = torch.randn(1, 4, 2, 8, generator=torch.Generator().manual_seed(0))  # 64 features: iid draws 64·B uniforms
    with pytest.raises(ValueError, match="samples=16 with sampler='iid' needs 1,024 uniforms"):
        santa.bernoulli_query(q, 16, sampler="iid")
    assert santa.bernoulli_query(q, 15, sampler="iid", generator=torch.Generator().manual_seed(0)).query.shape == q.shape
    drawn = santa.bernoulli_query(q, 10**9, generator=torch.Generator().manual_seed(0)).query  # one uniform per feature
    # stratified counts are within one of B·p: |q̃ − q| ≤ max|q| / B per feature
    assert ((drawn - q.double()).abs() <= q.double().abs().amax(-1, keepdim=True) / 10**9 * (1 + 1e-9)).all()


# ---- sample_counts' probs: NaN refused by name, rows must be distributions -----------------------


@pytest.mark.parametrize("probs", [[0.1, 0.1], [0.5, 0.6], [math.inf, 0.0]])
def test_probs_rows_that_are_not_distributions_are_refused(probs):
    """[0.1, 0.1] used to give the last key 9 of 10 systematic samples (the round-off clamp)."""
    with pytest.raises(ValueError, match="probs rows must sum to 1"):
        santa.sample_counts(torch.tensor(probs), 10, "systematic")


def test_nan_probs_raise_naming_probs():
    with pytest.raises(ValueError, match="probs contains NaN"):
        santa.sample_counts(torch.tensor([[0.5, 0.5], [math.nan, 0.5]]), 4, "iid")


def test_float16_softmax_rows_pass_the_sum_check():
    probs = torch.softmax(torch.randn(8, 4096, generator=torch.Generator().manual_seed(0)), -1).half()
    assert (santa.sample_counts(probs, 64, "systematic", generator=torch.Generator().manual_seed(0)).sum(-1) == 64).all()


@pytest.mark.parametrize("probs, match", [([0.5, math.nan], "NaN"), ([1.5, -0.5], "non-negative"), ([0.2, 0.2], "sum to 1")])
def test_variance_trace_refuses_probs_that_are_not_distributions(probs, match):
    """It used to return NaN or a finite wrong variance."""
    with pytest.raises(ValueError, match=match):
        santa.variance_trace(torch.tensor([probs], dtype=torch.float64), torch.ones(1, 2, 3, dtype=torch.float64), 4, "iid")


@pytest.mark.parametrize("replicates, error", [(2.5, TypeError), ("8", TypeError), (1, ValueError)])
def test_variance_trace_refuses_bad_replicates(replicates, error):
    with pytest.raises(error, match="replicates"):
        santa.variance_trace(random_probs(), torch.ones(4, 50, 2), 4, "systematic", replicates=replicates)


# ---- stats helpers -------------------------------------------------------------------------------


@pytest.mark.parametrize("group_size, error", [(0, ValueError), (-2, ValueError), (1.5, TypeError)])
def test_unique_keys_refuses_bad_group_size(group_size, error):
    """group_size=0 used to raise ZeroDivisionError."""
    with pytest.raises(error, match="group_size"):
        santa.unique_keys(torch.ones(1, 4, 5, dtype=torch.int64), group_size=group_size)


@pytest.mark.parametrize("counts, where", [
    (torch.tensor([[3, 0, -1, 0]]), r"counts\[0, 2\] = -1"),
    (torch.tensor([[[1, 0], [0, -2]]], dtype=torch.int32), r"counts\[0, 1, 1\] = -2"),
    (torch.tensor([0.0, math.nan, 1.0]), r"counts\[1\] = nan"),
])
def test_unique_keys_refuses_negative_counts(counts, where):
    """A negative count used to read as 'not sampled' (counts [3, 0, -1, 0] gave one key)."""
    with pytest.raises(ValueError, match=r"counts must be ≥ 0 .*, got " + where):
        santa.unique_keys(counts)


def test_unique_keys_refuses_meta_counts():
    with pytest.raises(ValueError, match="counts is on the meta device"):
        santa.unique_keys(torch.ones(2, 5, dtype=torch.int64, device="meta"))
    with pytest.raises(TypeError, match="counts must be a real"):
        santa.unique_keys(torch.ones(2, 5, dtype=torch.complex64))


def test_value_stage_cost_names_a_bad_method_before_the_budget():
    with pytest.raises(ValueError, match="method"):
        santa.value_stage_cost(10, 4, method="sparse")


@pytest.mark.parametrize("kwargs, match", [(dict(n_keys=0), "n_keys"), (dict(head_dim=-1), "head_dim"), (dict(unique_rows=9), "unique_rows")])
def test_value_stage_cost_refuses_impossible_sizes(kwargs, match):
    """unique_rows=9 of budget 8 used to count more distinct rows read than samples drawn."""
    args = dict(n_keys=100, head_dim=4, method="santa", budget=8) | kwargs
    with pytest.raises(ValueError, match=match):
        santa.value_stage_cost(**args)


# ---- item 8: SantaConfig and configure -----------------------------------------------------------


@pytest.mark.parametrize("seed", [1.5, "0", True, None])
def test_config_refuses_a_seed_that_is_not_an_int(seed):
    with pytest.raises(TypeError, match="seed must be an int"):
        santa.hf.SantaConfig(seed=seed)


@pytest.mark.parametrize("seed", [-1, 2**63, 2**70])
def test_config_refuses_a_seed_the_kernels_refuse(seed):
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*63\)"):
        santa.hf.SantaConfig(seed=seed)


@pytest.mark.parametrize("dense_layers", [5, "01", {0: 1}])
def test_config_refuses_dense_layers_that_are_not_a_collection_of_indices(dense_layers):
    with pytest.raises(TypeError, match="dense_layers must be a collection of layer indices"):
        santa.hf.SantaConfig(dense_layers=dense_layers)


def test_config_refuses_dense_layer_entries_that_are_not_indices():
    with pytest.raises(ValueError, match="dense_layers entry must be a layer index ≥ 0, got -1"):
        santa.hf.SantaConfig(dense_layers=(0, -1))
    with pytest.raises(TypeError, match="dense_layers entry"):
        santa.hf.SantaConfig(dense_layers=(0.0,))


def test_config_stores_dense_layers_as_a_tuple():
    assert santa.hf.SantaConfig(dense_layers=range(2)).dense_layers == (0, 1)
    assert santa.hf.SantaConfig(dense_layers=[3]).dense_layers == (3,)


@pytest.mark.parametrize("key, error", [("0", TypeError), (1.0, TypeError), (True, TypeError), (-1, ValueError)])
def test_config_refuses_layer_budget_keys_that_are_not_layer_indices(key, error):
    with pytest.raises(error, match="layer_budgets key"):
        santa.hf.SantaConfig(layer_budgets={key: 8})


def test_config_refuses_layer_budgets_that_are_not_a_mapping():
    with pytest.raises(TypeError, match="layer_budgets must be a mapping"):
        santa.hf.SantaConfig(layer_budgets=[(0, 8)])


@pytest.mark.parametrize("field", ["exact_when_budget_covers", "record_stats"])
def test_config_refuses_flags_that_are_not_bools(field):
    """exact_when_budget_covers="no" is truthy: it used to keep exact attention on."""
    with pytest.raises(TypeError, match=f"{field} must be a bool"):
        santa.hf.SantaConfig(**{field: "no"})


@pytest.mark.parametrize("config", ["str", None, {"budget": 8}])
def test_configure_refuses_a_config_that_is_not_a_santa_config(tiny_llama, config):
    with pytest.raises(TypeError, match="config must be a santa.hf.SantaConfig"):
        santa.hf.configure(tiny_llama, config)


def test_configure_refuses_a_model_that_is_not_a_module():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        santa.hf.configure("smollm2-135m", santa.hf.SantaConfig())


@pytest.fixture(scope="module")
def tiny_llama():
    """A two-layer random Llama with GQA (no download)."""
    return tiny_hf_model("llama")


@pytest.mark.parametrize("field, value", [("layer_budgets", {2: 8}), ("dense_layers", (0, 5))])
def test_configure_refuses_layers_the_model_does_not_have(tiny_llama, field, value):
    """A budget for layer 2 of a two-layer model used to be silently never applied."""
    with pytest.raises(ValueError, match=rf"{field} names layers \[{max(value)}\] the model does not have \(its 2 attention layers are 0–1\)"):
        santa.hf.configure(tiny_llama, santa.hf.SantaConfig(**{field: value}))


def test_configure_revalidates_fields_changed_after_construction(tiny_llama):
    config = santa.hf.SantaConfig()
    config.seed = "7"
    with pytest.raises(TypeError, match="seed must be an int"):
        santa.hf.configure(tiny_llama, config)


def test_configured_tiny_model_decodes_with_valid_layer_settings(tiny_llama):
    config = santa.hf.SantaConfig(budget=2, layer_budgets={1: 3}, dense_layers=[0], exact_when_budget_covers=False, record_stats=True)
    santa.hf.configure(tiny_llama, config)
    with torch.inference_mode():
        logits = tiny_llama(input_ids=torch.tensor([[1, 2, 3, 4, 5]])).logits
    assert torch.isfinite(logits).all() and config.stats.calls == 0  # a dense prefill
    with torch.inference_mode():
        tiny_llama.generate(torch.tensor([[1, 2, 3, 4, 5]]), max_new_tokens=2, do_sample=False)
    assert config.stats.calls == 1  # one decode step, in layer 1 (layer 0 is dense)


def test_hf_backend_refuses_dropout_on_the_sampled_path():
    """attention_dropout in training mode used to be silently ignored by the sampled path."""
    q, k, v = qkv(lq=1, lk=20, d=8)
    module = FakeAttention(santa.hf.SantaConfig(budget=4, kernel="reference"))
    with pytest.raises(ValueError, match=r"no dropout, got dropout=0.1.*model.eval\(\)"):
        santa.hf.santa_attention_forward(module, q, k, v, None, dropout=0.1)


@pytest.mark.parametrize("sampler", ["dense", "topk"])
def test_uniforms_with_a_sampler_that_draws_none_are_refused(sampler):
    """Dense and top-k draw nothing: uniforms given to them would be ignored, so they are refused."""
    q, k, v = qkv(b=1, hq=2, hkv=1, lq=1, lk=16, d=8)
    with pytest.raises(ValueError, match=f"uniforms are for a stochastic sampler .*sampler '{sampler}' draws none"):
        santa.sampled_attention(q, k, v, budget=4, sampler=sampler, enable_gqa=True, uniforms=torch.rand(1, 2, 1, 4))
