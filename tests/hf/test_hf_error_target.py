"""santa.hf with budgets from an error target (issue 42): the reference samplers and the prop kernel take it, a
prompt decodes alike alone and left-padded beside a longer one, the kernel and the systematic reference draw the
same samples (one pilot on prop's stream 1), stats count the pilot's rows, and bad targets are refused by name."""

from __future__ import annotations

import pytest
import torch

import santa.hf
from helpers import tiny_hf_model

PROMPT = [5, 17, 3, 9, 23, 8, 61, 2]
LONGER = [44, 2, 50, 9, 33, 12, 7, 7, 19, 28, 31, 40, 6]


def tokens(model, rows, config):
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    santa.hf.configure(model, config)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    return out[:, width:]


@pytest.fixture(scope="module")
def model():
    return tiny_hf_model("llama")


@pytest.mark.parametrize("sampler", ["iid", "stratified", "systematic"])
def test_a_prompt_draws_alike_alone_and_batched(model, sampler):
    config = santa.hf.SantaConfig(sampler=sampler, budget=6, seed=7, kernel="reference", error_target=0.3)
    alone = tokens(model, [PROMPT], config)
    batched = tokens(model, [LONGER, PROMPT], config)
    assert torch.equal(alone[0], batched[1])


def test_the_kernel_and_the_reference_draw_the_same_samples(model):
    reference = tokens(model, [PROMPT, LONGER], santa.hf.SantaConfig(sampler="systematic", budget=6, seed=7,
                                                                      kernel="reference", error_target=0.3))
    kernel = tokens(model, [LONGER, PROMPT], santa.hf.SantaConfig(sampler="systematic", budget=6, seed=7, kernel="prop",
                                                                  error_target=0.3))
    assert torch.equal(reference[0], kernel[1]) and torch.equal(reference[1], kernel[0])


def test_stats_count_the_pilots_rows(model):
    fixed = santa.hf.SantaConfig(sampler="systematic", budget=6, seed=7, kernel="reference", record_stats=True)
    tokens(model, [LONGER], fixed)
    targeted = santa.hf.SantaConfig(sampler="systematic", budget=6, seed=7, kernel="reference", record_stats=True,
                                    error_target=1e-6, pilot=4)  # every head at the cap, plus its pilot
    tokens(model, [LONGER], targeted)
    assert targeted.stats.calls == fixed.stats.calls
    assert targeted.stats.rows_read_per_head >= fixed.stats.rows_read_per_head


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(error_target=0.0), ValueError, "error_target"),
    (dict(error_target=True), TypeError, "error_target"),
    (dict(error_target=0.1, pilot=1), ValueError, "pilot"),
    (dict(error_target=0.1, sampler="topk"), ValueError, "stochastic sampler"),
    (dict(error_target=0.1, kernel="flash"), ValueError, "kernel='prop'"),
])
def test_bad_targets_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        santa.hf.SantaConfig(**{"sampler": "systematic", **kwargs})
