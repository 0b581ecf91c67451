"""sampled_attention: the SDPA-shaped reference, its baselines, masks, GQA and bad input."""

import math

import pytest
import torch
import torch.nn.functional as F

import santa
from helpers import qkv
from santa.attention import attention_probs


@pytest.mark.parametrize("hkv", [6, 3, 2, 1])
@pytest.mark.parametrize("lq, causal", [(1, False), (7, True), (7, False)])
def test_dense_equals_sdpa(hkv, lq, causal):
    q, k, v = qkv(hkv=hkv, lq=lq, lk=20)
    out = santa.sampled_attention(q, k, v, 4, sampler="dense", is_causal=causal, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    if causal:  # santa aligns the causal mask with the last key (KV-cached decoding); SDPA with the first
        ref = F.scaled_dot_product_attention(q, k[:, :, -lq:], v[:, :, -lq:], is_causal=True, enable_gqa=True)
        out = santa.sampled_attention(q, k[:, :, -lq:], v[:, :, -lq:], 4, sampler="dense", is_causal=True, enable_gqa=True)
    assert torch.allclose(out, ref, atol=1e-5)


def test_causal_mask_aligns_last_query_with_last_key():
    q, k, v = qkv(lq=3, lk=10, hkv=6)
    visible = torch.ones(3, 10, dtype=torch.bool).tril(diagonal=7)  # query i sees keys ≤ 7 + i
    out = santa.sampled_attention(q, k, v, 4, sampler="dense", is_causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    assert torch.allclose(out, ref, atol=1e-5)


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_masks_match_sdpa(mask_kind):
    q, k, v = qkv(lq=4, lk=30, hkv=6)
    visible = torch.rand(2, 1, 4, 30, generator=torch.Generator().manual_seed(1)) > 0.4
    visible[..., 0] = True
    mask = visible if mask_kind == "bool" else torch.zeros(visible.shape).masked_fill(~visible, -math.inf)
    out = santa.sampled_attention(q, k, v, 4, sampler="dense", attn_mask=mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(out, ref, atol=1e-5)


@pytest.mark.parametrize("sampler", ["iid", "stratified", "systematic"])
def test_output_is_mean_of_sampled_value_rows(sampler):
    """ô = (1/S) Σ_j c_j v_j with the counts the same generator draws from the same weights."""
    q, k, v = qkv(hq=6, hkv=2)
    budget = 16
    out = santa.sampled_attention(q, k, v, budget, sampler=sampler, enable_gqa=True, generator=torch.Generator().manual_seed(7))
    probs = attention_probs(q, k)
    counts = santa.sample_counts(probs, budget, sampler, generator=torch.Generator().manual_seed(7))
    v_rep = v.repeat_interleave(3, dim=1)
    expected = torch.einsum("bhqn,bhnd->bhqd", counts.float(), v_rep) / budget
    assert torch.allclose(out, expected, atol=1e-5)
    assert (counts.sum(-1) == budget).all()


def test_topk_equals_hand_computation():
    q = torch.zeros(1, 1, 1, 2)
    q[..., 0] = 1.0
    k = torch.tensor([[3.0, 0], [1.0, 0], [2.0, 0], [0.0, 0]]).reshape(1, 1, 4, 2)
    v = torch.arange(8.0).reshape(1, 1, 4, 2)
    out = santa.sampled_attention(q, k, v, 2, sampler="topk", scale=1.0)
    w0, w2 = math.exp(3.0), math.exp(2.0)  # the two largest scores: keys 0 and 2
    expected = (w0 * v[0, 0, 0] + w2 * v[0, 0, 2]) / (w0 + w2)
    assert torch.allclose(out[0, 0, 0], expected, atol=1e-6)


def test_dense_equals_hand_computation():
    q = torch.tensor([1.0, 0.0]).reshape(1, 1, 1, 2)
    k = torch.tensor([[math.log(1.0), 0], [math.log(3.0), 0]]).reshape(1, 1, 2, 2)
    v = torch.tensor([[4.0, 0], [0.0, 8.0]]).reshape(1, 1, 2, 2)
    out = santa.sampled_attention(q, k, v, 1, sampler="dense", scale=1.0)  # p = (1/4, 3/4)
    assert torch.allclose(out.flatten(), torch.tensor([1.0, 6.0]), atol=1e-6)


def test_topk_with_k_at_least_n_is_dense():
    q, k, v = qkv(hkv=6)
    assert torch.allclose(
        santa.sampled_attention(q, k, v, 50, sampler="topk"), santa.sampled_attention(q, k, v, 1, sampler="dense"), atol=1e-6
    )


def test_systematic_with_point_mass_is_exact():
    """A one-hot distribution: every sample hits the same key, so the estimate is exact."""
    q, k, v = qkv(hkv=6, lk=10)
    mask = torch.zeros(1, 1, 1, 10, dtype=torch.bool)
    mask[..., 4] = True
    out = santa.sampled_attention(q, k, v, 3, sampler="systematic", attn_mask=mask)
    assert torch.allclose(out[:, :, 0], v[:, :, 4])


def test_fully_masked_row_returns_zeros():
    q, k, v = qkv(hkv=6, lq=2, lk=5)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1] = False
    for sampler in ("dense", "topk", "systematic", "iid"):
        out = santa.sampled_attention(q, k, v, 3, sampler=sampler, attn_mask=mask)
        assert (out[:, :, 1] == 0).all()
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("sampler", ["dense", "topk", "systematic"])
@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_nan_input_gives_nan_output(sampler, where):
    q, k, v = qkv(hkv=6)
    {"query": q, "key": k, "value": v}[where][0, 0, 0, 0] = math.nan
    out = santa.sampled_attention(q, k, v, 8, sampler=sampler)
    assert torch.isnan(out[0, 0]).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_output_keeps_input_dtype(dtype):
    q, k, v = qkv(dtype=dtype)
    assert santa.sampled_attention(q, k, v, 4, enable_gqa=True).dtype == dtype


def test_prefill_sampled_is_close_to_dense_at_large_budget():
    q, k, v = qkv(hkv=2, lq=16, lk=16)
    dense = santa.sampled_attention(q, k, v, 1, sampler="dense", is_causal=True, enable_gqa=True)
    sampled = santa.sampled_attention(
        q, k, v, 4096, sampler="systematic", is_causal=True, enable_gqa=True, generator=torch.Generator().manual_seed(0)
    )
    # systematic counts are within one of S·p_j, so |ô − μ| ≤ Σ_j |v_j| / S per coordinate
    bound = v.abs().sum(dim=2, keepdim=True).repeat_interleave(3, dim=1) / 4096
    assert ((sampled - dense).abs() <= bound + 1e-5).all()


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(budget=0), ValueError, "budget"),
        (dict(budget=1.5), TypeError, "budget"),
        (dict(sampler="nucleus"), ValueError, "sampler"),
        (dict(query=torch.randn(6, 1, 16)), ValueError, "query"),
        (dict(key=torch.randn(3, 2, 50, 16), value=torch.randn(3, 2, 50, 16)), ValueError, "batch"),
        (dict(key=torch.randn(2, 2, 50, 8), value=torch.randn(2, 2, 50, 8)), ValueError, "D="),
        (dict(value=torch.randn(2, 2, 49, 16)), ValueError, "same shape"),
        (dict(key=torch.randn(2, 4, 50, 16), value=torch.randn(2, 4, 50, 16)), ValueError, "multiple"),
        (dict(enable_gqa=False), ValueError, "enable_gqa"),
        (dict(query=torch.ones(2, 6, 1, 16, dtype=torch.int32)), TypeError, "query"),
        (dict(value="v"), TypeError, "value"),
        (dict(attn_mask=torch.ones(1, 1, 1, 49, dtype=torch.bool)), ValueError, "attn_mask"),
        (dict(attn_mask=torch.ones(1, 1, 1, 50, dtype=torch.int64)), TypeError, "attn_mask"),
    ],
)
def test_bad_input_raises_naming_the_argument(change, error, match):
    q, k, v = qkv()
    args = dict(query=q, key=k, value=v, budget=4, enable_gqa=True) | change
    with pytest.raises(error, match=match):
        santa.sampled_attention(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_mixed_devices_raise():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="one device"):
        santa.sampled_attention(q.cuda(), k, v, 4, enable_gqa=True)


def test_mixed_devices_raise_on_meta():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="one device"):
        santa.sampled_attention(q.to("meta"), k, v, 4, enable_gqa=True)


def test_grouped_heads_read_their_own_kv_head_without_copies():
    from santa.attention import attention_probs, weighted_values

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 6, 3, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    probs = attention_probs(q, k, scale=0.3)
    repeated = attention_probs(q, k.repeat_interleave(3, dim=1), scale=0.3)  # query head h ↔ KV head h // 3
    torch.testing.assert_close(probs, repeated)
    torch.testing.assert_close(weighted_values(probs, v), weighted_values(probs, v.repeat_interleave(3, dim=1)))
    with pytest.raises(ValueError, match="must divide the 6 query heads"):
        attention_probs(q, torch.randn(2, 4, 5, 8))
