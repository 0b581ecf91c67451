"""Statements the README makes about behaviour, checked against the code (issue 22, item 6)."""

import pytest
import torch
import torch.nn.functional as F

import santa


@pytest.mark.parametrize("sampler", ["systematic", "stratified", "iid", "topk", "dense"])
def test_fully_masked_row_gives_zeros_like_sdpa(sampler):
    """README: a fully masked query row returns zeros, as SDPA does in torch 2.13 on CPU."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 2, 8, generator=gen) for _ in range(3))
    mask = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    mask[..., 0, :] = False  # query row 0 sees no key
    ours = santa.sampled_attention(q, k, v, budget=4, sampler=sampler, attn_mask=mask)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (ours[:, :, 0] == 0).all() and (sdpa[:, :, 0] == 0).all()
    assert torch.isfinite(ours).all()
