"""santa.model's sampled kernels keyed on the request (issue 26): a prompt decodes to the same tokens alone
or batched beside others (right-padded to another length), and whatever room the static cache has."""

from __future__ import annotations

import pytest
import torch

from santa.model import generate

PROMPTS = [[5, 17, 3, 99, 23, 8, 61], [44, 2, 250, 9], [7, 7, 120, 31, 66, 18, 201, 90, 12, 4, 33]]


@pytest.mark.parametrize("backend", ["santa-prop", "santa-flash"])
def test_a_prompt_decodes_alike_alone_batched_and_in_a_longer_cache(tiny_transformer, backend):
    batched = generate(tiny_transformer, PROMPTS, 6, backend=backend, budget=6, seed=9, cuda_graph=False)
    for i, prompt in enumerate(PROMPTS):
        alone = generate(tiny_transformer, [prompt], 6, backend=backend, budget=6, seed=9, cuda_graph=False)[0]
        assert torch.equal(alone, batched[i]), (i, alone, batched[i])
    # the same first tokens with a cache of another allocated length (room for 40 new tokens, not 6)
    roomy = generate(tiny_transformer, PROMPTS[:1], 40, backend=backend, budget=6, seed=9, cuda_graph=False)[0]
    assert torch.equal(roomy[:6], batched[0])


def test_the_dense_baseline_is_batch_invariant_too(tiny_transformer):
    """The control: dense attention gives each prompt its own tokens, batched or not."""
    batched = generate(tiny_transformer, PROMPTS, 6, backend="sdpa")
    assert all(torch.equal(generate(tiny_transformer, [p], 6, backend="sdpa")[0], batched[i]) for i, p in enumerate(PROMPTS))


def test_another_seed_draws_other_samples(tiny_transformer):
    runs = {seed: generate(tiny_transformer, PROMPTS, 8, backend="santa-prop", budget=2, seed=seed) for seed in (1, 2)}
    assert any(not torch.equal(a, b) for a, b in zip(runs[1], runs[2], strict=True))
