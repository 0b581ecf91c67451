"""santa.hf keyed on the request (issue 26): the same prompt and seed give the same tokens alone, batched
beside a longer prompt (left-padded), and under a static cache, for every sampled method; dense is the control."""

from __future__ import annotations

import pytest
import torch

import santa.hf
from helpers import tiny_hf_model

PROMPT = [5, 17, 3, 9, 23, 8, 61, 2]
LONGER = [44, 2, 50, 9, 33, 12, 7, 7, 19, 28, 31, 40, 6]


def tokens(model, rows, config, **generate_kwargs):
    """Greedy new tokens of each row (left-padded with token 0 and masked)."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    santa.hf.configure(model, config)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, **generate_kwargs)
    return out[:, width:]


@pytest.fixture(scope="module")
def model():
    return tiny_hf_model("llama")


@pytest.mark.parametrize("sampler", ["dense", "iid", "stratified", "systematic"])
def test_a_prompt_draws_alike_alone_batched_and_in_a_static_cache(model, sampler):
    config = santa.hf.SantaConfig(sampler=sampler, budget=3, seed=7)
    alone = tokens(model, [PROMPT], config)[0]
    batched = tokens(model, [LONGER, PROMPT], config)[1]
    static = tokens(model, [PROMPT], config, cache_implementation="static")[0]
    assert torch.equal(alone, batched), (alone, batched)
    assert torch.equal(alone, static), (alone, static)


def test_the_kernels_and_the_reference_draw_the_same_samples(model, monkeypatch):
    """The prop kernel (here santa.decode's CPU path) and the systematic reference take one definition of the draws."""
    reference = tokens(model, [PROMPT, LONGER], santa.hf.SantaConfig(sampler="systematic", budget=3, seed=7, kernel="reference"))
    kernel = tokens(model, [PROMPT, PROMPT], santa.hf.SantaConfig(sampler="systematic", budget=3, seed=7, kernel="prop"))
    assert torch.equal(reference[0], kernel[0]) and torch.equal(kernel[0], kernel[1])


def test_query_positions_count_the_keys_each_row_sees():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    assert santa.hf.query_positions(mask, 1, 5, 2, torch.device("cpu")).tolist() == [[2], [4]]
    assert santa.hf.query_positions(None, 3, 7, 2, torch.device("cpu")).tolist() == [[4, 5, 6], [4, 5, 6]]
