"""santa.hf keyed on the request (issue 26): the same prompt and seed give the same tokens alone, batched
beside a longer prompt (left-padded), and under a static cache, for every sampled method; dense is the control."""

from __future__ import annotations

import pytest
import torch

import santa.hf
from helpers import recorded_decode_argument, tiny_hf_model

PROMPT = [5, 17, 3, 9, 23, 8, 61, 2]
LONGER = [44, 2, 50, 9, 33, 12, 7, 7, 19, 28, 31, 40, 6]


def generated(model, rows, config, **generate_kwargs):
    """Greedy new tokens ``[rows, 6]`` and their logits ``[6, rows, vocab]`` of each row (left-padded with
    token 0 and masked)."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    santa.hf.configure(model, config)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                             return_dict_in_generate=True, output_logits=True, **generate_kwargs)
    return out.sequences[:, width:], torch.stack(out.logits)


def tokens(model, rows, config, **generate_kwargs):
    return generated(model, rows, config, **generate_kwargs)[0]


@pytest.fixture(scope="module")
def model():
    return tiny_hf_model("llama")


# S = 10 sits between the prompts: PROMPT's first decode steps see 8–10 keys (S covers them: exact attention),
# its later ones 11–13 (sampled), LONGER's all 13–18 (sampled). Batched beside LONGER or in a static cache the
# padded length passes S from the first step: the rule must follow PROMPT's own live keys, not the padded length.
BETWEEN = 10


@pytest.mark.parametrize("kernel", ["reference", "prop"])
@pytest.mark.parametrize("sampler", ["dense", "iid", "stratified", "systematic"])
def test_a_prompt_draws_alike_alone_batched_and_in_a_static_cache(model, sampler, kernel):
    if kernel == "prop" and sampler != "systematic":
        pytest.skip("the prop kernel draws S²ANTA-sys")
    config = santa.hf.SantaConfig(sampler=sampler, budget=BETWEEN, seed=7, kernel=kernel)
    alone, alone_logits = generated(model, [PROMPT], config)
    batched, batched_logits = generated(model, [LONGER, PROMPT], config)
    static, static_logits = generated(model, [PROMPT], config, cache_implementation="static")
    assert torch.equal(alone[0], batched[1]), (alone, batched)
    assert torch.equal(alone[0], static[0]), (alone, static)
    # the logits too, step by step (transformers' left-padding test): exact and sampled steps alike, up to
    # the float rounding of a batch of two against one (~1e-6 here), far below what a different draw moves
    torch.testing.assert_close(batched_logits[:, 1], alone_logits[:, 0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(static_logits[:, 0], alone_logits[:, 0], rtol=1e-4, atol=1e-4)


def test_a_row_the_budget_covers_is_exact_however_long_its_batch():
    """The first decode step of PROMPT (8 live keys ≤ S = 10) beside LONGER (13 keys) equals dense attention's:
    the exactness rule is the row's own, never the batch's padded length."""
    model = tiny_hf_model("llama")
    dense = generated(model, [LONGER, PROMPT], santa.hf.SantaConfig(sampler="dense"))[1][0, 1]
    for kernel in ("reference", "prop"):
        config = santa.hf.SantaConfig(sampler="systematic", budget=BETWEEN, seed=7, kernel=kernel)
        sampled = generated(model, [LONGER, PROMPT], config)[1][0, 1]
        torch.testing.assert_close(sampled, dense, rtol=1e-4, atol=1e-4)


def test_the_kernels_and_the_reference_draw_the_same_samples(model):
    """The prop kernel (here santa.decode's CPU path, reading each sequence's run of keys) and the systematic
    reference take one definition of the draws: the same tokens alone, left-padded and in a static cache."""
    reference = tokens(model, [PROMPT, LONGER], santa.hf.SantaConfig(sampler="systematic", budget=3, seed=7, kernel="reference"))
    config = santa.hf.SantaConfig(sampler="systematic", budget=3, seed=7, kernel="prop")
    kernel = tokens(model, [LONGER, PROMPT], config)  # PROMPT left-padded: its keys are a run from key 5
    static = tokens(model, [LONGER, PROMPT], config, cache_implementation="static")
    assert torch.equal(reference[0], kernel[1]) and torch.equal(reference[1], kernel[0])
    assert torch.equal(static, kernel)


def test_sampling_regardless_is_the_reference_paths_alone():
    with pytest.raises(ValueError, match="exact_when_budget_covers=False"):
        santa.hf.SantaConfig(exact_when_budget_covers=False, kernel="prop")
    config = santa.hf.SantaConfig(exact_when_budget_covers=False)  # auto: the reference samples every row
    assert santa.hf.kernel_for(config, torch.zeros(1, 2, 1, 4), None) is None


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


@pytest.mark.parametrize("kernel", ["reference", "prop"])
def test_dense_below_gives_short_decode_steps_to_sdpa(model, kernel):
    """PROMPT's decode steps see 9–13 keys. dense_below = 11 makes the steps that see fewer exact (SDPA's logits), while
    the later steps are sampled; above every step it is the dense sampler's generation; 0 (the default) samples."""
    dense_tokens, dense_logits = generated(model, [PROMPT], santa.hf.SantaConfig(sampler="dense"))
    sampled = dict(sampler="systematic", budget=4, seed=7, kernel=kernel)
    _, default_logits = generated(model, [PROMPT], santa.hf.SantaConfig(**sampled))
    split_tokens, split_logits = generated(model, [PROMPT], santa.hf.SantaConfig(**sampled, dense_below=11))
    above_tokens, above_logits = generated(model, [PROMPT], santa.hf.SantaConfig(**sampled, dense_below=100))
    assert torch.equal(above_tokens, dense_tokens)
    torch.testing.assert_close(above_logits, dense_logits, rtol=1e-5, atol=1e-5)
    # logits[0] is the (dense) prefill's; decode step i ≥ 1 sees 8 + i keys. Below 11 (steps 1 and 2) they are SDPA's,
    # on the same tokens so far; by default those steps are sampled; step 5 (13 keys) is sampled under dense_below 11
    torch.testing.assert_close(split_logits[:3], dense_logits[:3], rtol=1e-5, atol=1e-5)
    assert torch.equal(split_tokens[:, :3], dense_tokens[:, :3])
    assert not torch.allclose(default_logits[1], dense_logits[1], atol=1e-4)
    assert not torch.allclose(split_logits[3], dense_logits[3], atol=1e-4)  # 11 keys, the first sampled step
    assert not torch.allclose(split_logits[5], dense_logits[5], atol=1e-4)


def test_dense_below_is_refused_unless_a_non_negative_int():
    with pytest.raises(TypeError, match="dense_below must be an int"):
        santa.hf.SantaConfig(dense_below=8192.0)
    with pytest.raises(TypeError, match="dense_below must be an int"):
        santa.hf.SantaConfig(dense_below=True)
    with pytest.raises(ValueError, match="dense_below must be an int ≥ 0, got -1"):
        santa.hf.SantaConfig(dense_below=-1)


def test_batch_invariant_must_be_a_bool_and_refuses_dense_below():
    """SantaConfig.batch_invariant, as santa.model's generate: a bool, and no dense_below with it (which steps are dense
    follows the batch's padded length); validate() (configure's) checks a field changed after construction too."""
    assert santa.hf.SantaConfig().batch_invariant is False
    assert santa.hf.SantaConfig(batch_invariant=True, kernel="prop").batch_invariant is True
    with pytest.raises(TypeError, match="batch_invariant must be a bool, got int 1"):
        santa.hf.SantaConfig(batch_invariant=1)
    with pytest.raises(ValueError, match="dense_below must be 0 with batch_invariant=True.*got 64"):
        santa.hf.SantaConfig(batch_invariant=True, dense_below=64)
    config = santa.hf.SantaConfig(batch_invariant=True)
    config.dense_below = 8
    with pytest.raises(ValueError, match="dense_below must be 0 with batch_invariant=True"):
        config.validate()


def test_the_kernel_path_passes_batch_invariant_to_decode(model, monkeypatch):
    """kernel_decode hands SantaConfig.batch_invariant to santa.kernels.decode on every call; with no one launch (the
    CPU) the tokens are the default's, and a prompt's are the same alone and batched."""
    flags = recorded_decode_argument(monkeypatch, "batch_invariant")
    sampled = dict(sampler="systematic", budget=5, seed=7, kernel="prop")
    alone = tokens(model, [PROMPT], santa.hf.SantaConfig(**sampled, batch_invariant=True))
    batched = tokens(model, [LONGER, PROMPT], santa.hf.SantaConfig(**sampled, batch_invariant=True))
    assert flags and set(flags) == {True}
    assert torch.equal(alone[0], batched[1])
    default = tokens(model, [LONGER, PROMPT], santa.hf.SantaConfig(**sampled))
    assert False in flags and torch.equal(batched, default)
