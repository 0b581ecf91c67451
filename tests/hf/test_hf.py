"""The transformers backend on the bundled SmolLM2-135M (loaded offline from its GGUF)."""

import pytest
import torch

import santa.hf
from santa.eval.tasks import needle_prompt
from santa.generate import cache_keyword, returned_cache

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompt_ids(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    prompt = needle_prompt(tokenizer, 300, seed=1)
    return tokenizer(prompt.text, return_tensors="pt", add_special_tokens=False).input_ids


def generate(model, ids, config, new_tokens=8):
    santa.hf.configure(model, config)
    with torch.inference_mode():
        return model.generate(ids, max_new_tokens=new_tokens, do_sample=False)[0, ids.shape[1] :]


def last_logits(model, ids, config):
    """Logits of one decode step after a dense prefill of all but the last token."""
    santa.hf.configure(model, config)
    with torch.inference_mode():
        prefill = model(input_ids=ids[:, :-1], use_cache=True)
        cache = returned_cache(prefill)
        return model(input_ids=ids[:, -1:], use_cache=True, **{cache_keyword(model): cache}).logits[0, -1]


def test_dense_sampler_generates_sdpa_tokens(model_and_tokenizer, prompt_ids):
    model, _ = model_and_tokenizer
    model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        reference = model.generate(prompt_ids, max_new_tokens=8, do_sample=False)[0, prompt_ids.shape[1] :]
    tokens = generate(model, prompt_ids, santa.hf.SantaConfig(sampler="dense"))
    assert torch.equal(tokens, reference)


def test_budget_covering_all_keys_reproduces_dense(model_and_tokenizer, prompt_ids):
    model, _ = model_and_tokenizer
    dense = last_logits(model, prompt_ids, santa.hf.SantaConfig(sampler="dense"))
    covered = last_logits(model, prompt_ids, santa.hf.SantaConfig(budget=prompt_ids.shape[1], sampler="systematic"))
    assert torch.allclose(covered, dense, atol=1e-4, rtol=1e-4)


def test_sampled_decode_differs_from_dense_but_stays_close(model_and_tokenizer, prompt_ids):
    model, _ = model_and_tokenizer
    dense = last_logits(model, prompt_ids, santa.hf.SantaConfig(sampler="dense"))
    sampled = last_logits(model, prompt_ids, santa.hf.SantaConfig(budget=32, sampler="systematic"))
    assert not torch.allclose(sampled, dense, atol=1e-4)
    kl = torch.sum(dense.softmax(-1) * (dense.log_softmax(-1) - sampled.log_softmax(-1)))
    assert kl < 0.5  # S=32 of ~300 keys in every layer: a perturbation, not a different model


def test_generation_repeats_given_seed_and_changes_with_seed(model_and_tokenizer, prompt_ids):
    model, _ = model_and_tokenizer
    first = last_logits(model, prompt_ids, santa.hf.SantaConfig(budget=16, sampler="iid", seed=3))
    again = last_logits(model, prompt_ids, santa.hf.SantaConfig(budget=16, sampler="iid", seed=3))
    other = last_logits(model, prompt_ids, santa.hf.SantaConfig(budget=16, sampler="iid", seed=4))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_sampled_prefill_changes_the_prefill(model_and_tokenizer, prompt_ids):
    model, _ = model_and_tokenizer
    santa.hf.configure(model, santa.hf.SantaConfig(sampler="dense"))
    with torch.inference_mode():
        dense = model(input_ids=prompt_ids).logits[0, -1]
        santa.hf.configure(model, santa.hf.SantaConfig(budget=16, prefill="sampled"))
        sampled = model(input_ids=prompt_ids).logits[0, -1]
    assert torch.isfinite(sampled).all()
    assert not torch.allclose(sampled, dense, atol=1e-4)


def test_decode_stats_count_value_rows_read(model_and_tokenizer, prompt_ids):
    model, _ = model_and_tokenizer
    config = santa.hf.SantaConfig(budget=16, record_stats=True)
    generate(model, prompt_ids, config, new_tokens=3)
    stats = config.stats
    assert stats.calls == 2 * model.config.num_hidden_layers  # two decode steps after the prefill's token
    assert 0 < stats.share_per_head <= 16 / prompt_ids.shape[1]
    assert stats.share_per_head <= stats.share_per_kv_head <= 3 * 16 / prompt_ids.shape[1]


def test_bernoulli_scores_bypass_the_decode_kernels():
    """A config asking for both is refused (test_config_rejects_bad_values); one changed after construction still
    runs the reference, never the kernel without its score stage."""
    query = torch.zeros(1, 9, 1, 64)
    config = santa.hf.SantaConfig(kernel="prop")
    assert santa.hf.kernel_for(config, query, None) == "prop"
    config.score_samples = 4
    assert santa.hf.kernel_for(config, query, None) is None


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="budget"):
        santa.hf.SantaConfig(budget=0)
    with pytest.raises(ValueError, match="sampler"):
        santa.hf.SantaConfig(sampler="greedy")
    with pytest.raises(ValueError, match="prefill"):
        santa.hf.SantaConfig(prefill="sparse")
    with pytest.raises(TypeError, match="layer_budgets"):
        santa.hf.SantaConfig(layer_budgets={0: 2.5})
    with pytest.raises(ValueError, match="score_samples"):
        santa.hf.SantaConfig(score_samples=0)
    with pytest.raises(ValueError, match="score_sampler"):
        santa.hf.SantaConfig(score_samples=4, score_sampler="topk")
    # a kernel asked for where it cannot run is refused, not dropped for the reference
    with pytest.raises(ValueError, match=r"kernel='flash' draws systematic samples.*sampler='iid'"):
        santa.hf.SantaConfig(kernel="flash", sampler="iid")
    with pytest.raises(ValueError, match=r"score_samples \(Bernoulli qKᵀ\) runs on the torch reference, not kernel='prop'"):
        santa.hf.SantaConfig(kernel="prop", score_samples=8)


def test_bernoulli_scores_converge_to_dense_with_more_draws_and_count_features(model_and_tokenizer, prompt_ids):
    """sampler="dense" with score_samples samples the scores alone: the next-token KL to dense
    falls with B (stratified error ~ 1/B), and the share of key features read is recorded."""
    model, _ = model_and_tokenizer
    dense = last_logits(model, prompt_ids, santa.hf.SantaConfig(sampler="dense"))

    def kl_and_share(samples):
        config = santa.hf.SantaConfig(sampler="dense", score_samples=samples, record_stats=True)
        logits = last_logits(model, prompt_ids, config)
        kl = torch.sum(dense.softmax(-1) * (dense.log_softmax(-1) - logits.log_softmax(-1)))
        return float(kl), config.stats.feature_share

    (kl_few, share_few), (kl_many, share_many) = kl_and_share(2), kl_and_share(256)
    assert kl_many < kl_few / 10 and kl_many < 1e-2
    assert 0 < share_few < share_many <= 1
    # a value budget covering every key keeps the values exact: the same draws as sampler="dense"
    covered = santa.hf.SantaConfig(budget=prompt_ids.shape[1], sampler="systematic", score_samples=8)
    assert torch.equal(last_logits(model, prompt_ids, covered), last_logits(model, prompt_ids, santa.hf.SantaConfig(sampler="dense", score_samples=8)))
    # dense layers skip the score stage too
    every_layer = tuple(range(model.config.num_hidden_layers))
    skipped = last_logits(model, prompt_ids, santa.hf.SantaConfig(sampler="dense", score_samples=2, dense_layers=every_layer))
    assert torch.allclose(skipped, dense, atol=1e-5)
    # with a value sampler too (the paper's combination), one decode step still runs and stays finite
    both = last_logits(model, prompt_ids, santa.hf.SantaConfig(budget=32, score_samples=8))
    assert torch.isfinite(both).all() and not torch.allclose(both, dense, atol=1e-4)


@pytest.mark.parametrize("kernel", ["prop", "flash"])
def test_decode_kernel_path_stays_close_to_dense(model_and_tokenizer, prompt_ids, kernel, monkeypatch):
    """The HF wiring of santa.kernels.decode. On CPU the kernels' torch emulation runs (the Triton
    interpreter is too slow for 30 layers; tests/kernels/test_kernels.py checks the kernels against it)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model, _ = model_and_tokenizer
    dense = last_logits(model, prompt_ids, santa.hf.SantaConfig(sampler="dense"))
    config = santa.hf.SantaConfig(budget=32, sampler="systematic", kernel=kernel, record_stats=True)
    sampled = last_logits(model, prompt_ids, config)
    assert config.stats.calls == model.config.num_hidden_layers
    assert not torch.allclose(sampled, dense, atol=1e-4)
    kl = torch.sum(dense.softmax(-1) * (dense.log_softmax(-1) - sampled.log_softmax(-1)))
    assert kl < 0.5
    again = last_logits(model, prompt_ids, santa.hf.SantaConfig(budget=32, sampler="systematic", kernel=kernel))
    assert torch.equal(sampled, again)


def test_stats_count_sampled_prefill_rows(model_and_tokenizer, prompt_ids):
    model, _ = model_and_tokenizer
    config = santa.hf.SantaConfig(budget=16, prefill="sampled", record_stats=True)
    santa.hf.configure(model, config)
    with torch.inference_mode():
        model(input_ids=prompt_ids)
    n = prompt_ids.shape[1]
    assert config.stats.calls == model.config.num_hidden_layers
    assert config.stats.keys_per_head == model.config.num_hidden_layers * model.config.num_attention_heads * n * (n + 1) // 2
    assert 0 < config.stats.rows_read_per_head <= config.stats.keys_per_head
