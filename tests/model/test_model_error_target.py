"""santa.model with budgets from an error target (issue 42): each head draws what its pilot asks for, capped by the
budget; the kernels (Triton's interpreter on the CPU) and their torch fallback decode the same tokens, a prompt
decodes alike alone or batched, and the backends without a global draw refuse the target by name."""

from __future__ import annotations

import pytest
import torch

from santa.model import generate, make_context

PROMPTS = [[5, 17, 3, 99, 23, 8, 61, 14, 2, 77, 140, 9], [44, 2, 250, 9, 31, 8, 101, 7, 66]]


def decode(model, prompts):
    return generate(model, prompts, 6, backend="santa-prop", budget=8, seed=3, error_target=0.3, cuda_graph=False)


def test_the_kernels_and_their_fallback_decode_alike(tiny_transformer, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("the torch fallback serves CPU tensors")
    from santa.kernels.plan import kernels_on_cpu

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if not kernels_on_cpu():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: run with TRITON_INTERPRET=1")
    kernels = decode(tiny_transformer, PROMPTS)
    monkeypatch.delenv("TRITON_INTERPRET")
    fallback = decode(tiny_transformer, PROMPTS)
    assert all(torch.equal(a, b) for a, b in zip(kernels, fallback, strict=True))


def test_a_prompt_decodes_alike_alone_and_batched(tiny_transformer, decode_path):
    batched = decode(tiny_transformer, PROMPTS)
    assert torch.equal(decode(tiny_transformer, PROMPTS[1:])[0], batched[1])


@pytest.mark.parametrize("backend", ["systematic", "iid", "stratified"])
def test_the_reference_samplers_take_the_target(tiny_transformer, backend):
    tokens = generate(tiny_transformer, PROMPTS, 4, backend=backend, budget=8, seed=3, error_target=0.3)
    again = generate(tiny_transformer, PROMPTS, 4, backend=backend, budget=8, seed=3, error_target=0.3)
    assert all(torch.equal(a, b) for a, b in zip(tokens, again, strict=True)) and all(len(t) == 4 for t in tokens)


@pytest.mark.parametrize(("backend", "kwargs", "error", "match"), [
    ("sdpa", dict(error_target=0.1), ValueError, "sampling backend"),
    ("topk", dict(error_target=0.1), ValueError, "sampling backend"),
    ("santa-flash", dict(error_target=0.1), ValueError, "sampling backend"),
    ("santa-prop", dict(error_target=-1.0), ValueError, "error_target"),
    ("santa-prop", dict(error_target=0.1, pilot=1), ValueError, "pilot"),
    ("santa-prop", dict(error_target="0.1"), TypeError, "error_target"),
])
def test_a_bad_target_is_refused_by_name(tiny_transformer, backend, kwargs, error, match):
    tiny_transformer.setup_caches(1, 32)
    with pytest.raises(error, match=match):
        make_context(tiny_transformer, backend, prompt_len=8, budget=8, **kwargs)
