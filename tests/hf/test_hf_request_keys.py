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


def test_the_kernels_and_the_reference_draw_the_same_samples(model):
    """The prop kernel (here santa.decode's CPU path, reading each sequence's run of keys) and the systematic
    reference take one definition of the draws: the same tokens alone, left-padded and in a static cache."""
    reference = tokens(model, [PROMPT, LONGER], santa.hf.SantaConfig(sampler="systematic", budget=3, seed=7, kernel="reference"))
    config = santa.hf.SantaConfig(sampler="systematic", budget=3, seed=7, kernel="prop")
    kernel = tokens(model, [LONGER, PROMPT], config)  # PROMPT left-padded: its keys are a run from key 5
    static = tokens(model, [LONGER, PROMPT], config, cache_implementation="static")
    assert torch.equal(reference[0], kernel[1]) and torch.equal(reference[1], kernel[0])
    assert torch.equal(static, kernel)


def test_visible_runs_come_from_the_mask_on_the_device():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 1, 0, 1, 0, 0]], dtype=torch.bool)[:, None, None, :]
    starts, ends, contiguous = santa.hf.visible_run(mask, 6)
    assert starts.tolist()[:2] == [2, 0] and ends.tolist()[:2] == [5, 4] and contiguous.tolist() == [True, True, False]


def test_query_positions_count_the_keys_each_row_sees():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    assert santa.hf.query_positions(mask, 1, 5, 2, torch.device("cpu")).tolist() == [[2], [4]]
    assert santa.hf.query_positions(None, 3, 7, 2, torch.device("cpu")).tolist() == [[4, 5, 6], [4, 5, 6]]


def test_the_kernel_path_compiles_in_one_graph_with_a_padding_mask():
    """No host read on the kernel path: torch.compile(fullgraph=True) traces a masked decode step (left
    padding and a static cache's unwritten tail), and it gives what the eager step gives."""
    from helpers import qkv
    from santa.hf import santa_attention_forward

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer_idx, self.num_key_value_groups, self.is_causal = 0, 3, True
            self.santa_config = santa.hf.SantaConfig(budget=4, seed=3, kernel="prop")

    module = Attention()
    q, k, v = qkv(b=2, hq=6, hkv=2, lk=40, seed=5)
    mask = torch.zeros(2, 1, 1, 40, dtype=torch.bool)
    mask[0, ..., 3:31] = True  # left-padded by 3, 12 static slots unwritten
    mask[1, ..., :37] = True

    def step(q, k, v, mask):
        return santa_attention_forward(module, q, k, v, mask)[0]

    eager = step(q, k, v, mask)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="eager")(q, k, v, mask)
    assert torch.equal(compiled, eager) and torch.isfinite(eager).all()
