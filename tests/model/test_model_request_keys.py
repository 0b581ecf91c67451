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


def test_batch_invariant_plans_run_the_triton_prop(tiny_transformer):
    """``batch_invariant=True`` plans every budget with ``Tuning(one_launch=False)`` (the one launch's float32 CDF
    follows its slices); the default leaves the choice to the plan. On the CPU both draw the same samples."""
    from santa.model import make_context

    tiny_transformer.setup_caches(2, 32)
    plans = {flag: make_context(tiny_transformer, "santa-prop", prompt_len=5, budget=4, layer_budgets={1: 8},
                                batch_invariant=flag).plans for flag in (False, True)}
    assert sorted(plans[True]) == [4, 8]
    assert all(plan.tuning.one_launch is False and plan.one_launch is None for plan in plans[True].values())
    assert all(plan.tuning.one_launch is None for plan in plans[False].values())
    default = generate(tiny_transformer, PROMPTS, 4, backend="santa-prop", budget=3, seed=5, cuda_graph=False)
    invariant = generate(tiny_transformer, PROMPTS, 4, backend="santa-prop", budget=3, seed=5, cuda_graph=False,
                         batch_invariant=True)
    assert all(torch.equal(a, b) for a, b in zip(default, invariant, strict=True))


def test_batch_invariant_must_be_a_bool_and_refuses_dense_below(tiny_transformer):
    with pytest.raises(TypeError, match="batch_invariant must be a bool"):
        generate(tiny_transformer, PROMPTS[:1], 2, backend="santa-prop", budget=3, batch_invariant=1)
    with pytest.raises(ValueError, match="dense_below must be 0 with batch_invariant=True.*got 64"):
        generate(tiny_transformer, PROMPTS[:1], 2, backend="santa-prop", budget=3, batch_invariant=True, dense_below=64)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the one-launch prop runs on sm_90")
def test_batch_invariant_on_hopper_takes_the_triton_prop_and_decodes_alike_alone_and_batched():
    """At Llama's head shape (d = 128, G = 4) the default plan runs the one launch and ``batch_invariant=True`` the
    Triton prop, whose samples, so tokens, are the same for a prompt alone and batched beside two others."""
    from santa.model import ModelArgs, Transformer, make_context

    args = ModelArgs(n_layer=2, n_head=8, n_kv_head=2, dim=1024, intermediate_size=512, vocab_size=256)
    model = Transformer.random(args, device="cuda", dtype=torch.bfloat16, seed=0).eval()
    model.setup_caches(3, 1024)
    for flag, expected in ((False, True), (True, False)):
        plans = make_context(model, "santa-prop", prompt_len=600, budget=16, batch_invariant=flag).plans
        assert (plans[16].one_launch is not None) is expected, flag
    prompts = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (700, 300, 900)]
    batched = generate(model, prompts, 8, backend="santa-prop", budget=16, seed=3, batch_invariant=True)
    for i, prompt in enumerate(prompts):
        alone = generate(model, [prompt], 8, backend="santa-prop", budget=16, seed=3, batch_invariant=True)[0]
        assert torch.equal(alone, batched[i]), (i, alone, batched[i])
