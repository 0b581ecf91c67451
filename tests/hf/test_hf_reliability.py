"""santa.hf against eager attention on tiny random transformers models of several families: what it
implements matches eager (sliding windows, a score scale other than 1/√D, GQA, MLA's narrower value
heads, left padding), what it does not is refused by name, at configure time and at call time."""

import math
import re

import numpy as np
import pytest
import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import santa.hf
from helpers import HF_FAMILIES, HF_SMALL, qkv, tiny_hf_model
from santa.hf import SantaConfig, santa_attention_forward


def generated_logits(model, ids, mask, config: SantaConfig | None, new_tokens: int = 3, **generate_kwargs) -> torch.Tensor:
    """Greedy logits ``[new_tokens, B, V]`` with eager attention (config None) or santa's."""
    if config is None:
        model.set_attn_implementation("eager")
    else:
        santa.hf.configure(model, config)
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, output_logits=True,
            return_dict_in_generate=True, pad_token_id=0, **generate_kwargs,
        )
    return torch.stack(out.logits)


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 20 tokens, the second left-padded to 15 (longer than the windows of 8)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 64, (2, 20), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    return ids, mask


# Top-k with k ≥ n keys reads every value row with its exact weight: santa's own sampled path
# (its probabilities, masks, scale and GQA) computing exact attention, prefill included.
EXACT_THROUGH_SANTA = {"sampler": "topk", "budget": 10**6, "exact_when_budget_covers": False, "prefill": "sampled"}


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_santas_own_attention_matches_eager(family):
    model = tiny_hf_model(family)
    ids, mask = padded_batch()
    eager = generated_logits(model, ids, mask, None)
    santa_logits = generated_logits(model, ids, mask, SantaConfig(**EXACT_THROUGH_SANTA))
    assert torch.allclose(santa_logits, eager, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["mistral, sliding window 8", "gemma3, window and scale 1/4 for D=8"])
@pytest.mark.parametrize("kernel", ["prop", "flash"])
def test_decode_kernels_honour_the_window_and_the_scale(family, kernel, monkeypatch):
    """The kernels' torch emulation on CPU (what the Triton kernels compute, tests/kernels/test_kernels.py) reads
    the window and the scale as the reference sampler does, which test_santas_own_attention_matches_eager ties to
    eager: with S = 6 below the window's 8 keys both sample, and they draw the same samples (request-keyed), so the
    logits agree up to float rounding; a wrong window or scale would not. (With S ≥ the window's keys every path
    computes the rows exactly: transformers' windowed caches then hold no more keys than S, and SDPA runs.)"""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = tiny_hf_model(family)
    ids = padded_batch()[0][:1]
    reference = generated_logits(model, ids, None, SantaConfig(sampler="systematic", budget=6, kernel="reference"))
    config = SantaConfig(sampler="systematic", budget=6, kernel=kernel, record_stats=True)
    sampled = generated_logits(model, ids, None, config)
    assert config.stats.calls > 0  # sampled calls ran (prop: the kernel's path; flash takes masked steps to the reference)
    assert torch.allclose(sampled, reference, atol=1e-4)


# --- refused at configure time -------------------------------------------------------------------


@pytest.mark.parametrize("softcap", [50.0, 30.0, 0.5])
def test_configure_refuses_soft_capped_attention_logits(softcap):
    model = tiny_hf_model("gemma2 without the softcap", attn_logit_softcapping=softcap)
    with pytest.raises(ValueError, match=rf"soft-capping: the model config sets attn_logit_softcapping={softcap}"):
        santa.hf.configure(model, SantaConfig())


def test_configure_refuses_attention_sinks():
    torch.manual_seed(0)
    config = transformers.GptOssConfig(**HF_SMALL, head_dim=8, num_local_experts=2, num_experts_per_tok=1, sliding_window=8)
    model = transformers.GptOssForCausalLM(config).eval()
    with pytest.raises(ValueError, match=r"santa does not implement attention sinks: layer 0 \(GptOssAttention\) has `sinks`"):
        santa.hf.configure(model, SantaConfig(sampler="dense"))


# --- refused at call time --------------------------------------------------------------------------


class Attention(torch.nn.Module):
    """The attributes santa's attention function reads from a transformers attention module."""

    def __init__(self, config: SantaConfig, group: int = 2, is_causal: bool = True):
        super().__init__()
        self.layer_idx, self.num_key_value_groups, self.is_causal, self.santa_config = 0, group, is_causal, config


CONFIGS = {"sampled": SantaConfig(budget=3), "exact": SantaConfig(sampler="dense"), "dense layer": SantaConfig(budget=3, dense_layers=(0,))}


@pytest.mark.parametrize("path", CONFIGS)
@pytest.mark.parametrize(
    ("keyword", "value", "named"),
    [
        ("softcap", 50.0, "soft-capping"),
        ("s_aux", torch.zeros(4), "attention sinks"),
        ("sinks", torch.zeros(4), "attention sinks"),
        ("position_bias", torch.zeros(1, 4, 1, 12), "relative position bias"),
        ("indices", torch.zeros(1, 1, 4, dtype=torch.long), "selected key indices"),
        ("block_indices", torch.zeros(1, 1, 2, dtype=torch.long), "selected key blocks"),
        ("attention_temperature", 0.7, "keyword attention_temperature=0.7"),
        ("alibi_slopes", torch.ones(4), "keyword alibi_slopes=<tensor of shape (4,)>"),
    ],
)
def test_attention_function_refuses_a_keyword_it_does_not_implement(path, keyword, value, named):
    q, k, v = qkv(b=1, hq=4, lk=12, d=8, seed=2)
    with pytest.raises(ValueError, match=re.escape(named)) as refused:
        santa_attention_forward(Attention(CONFIGS[path]), q, k, v, None, **{keyword: value})
    assert "layer 0 (Attention)" in str(refused.value)


@pytest.mark.parametrize("path", CONFIGS)
def test_attention_function_takes_the_keywords_that_do_not_change_attention(path):
    q, k, v = qkv(b=1, hq=4, lk=12, d=8, seed=2)
    harmless = {"position_ids": torch.arange(1)[None], "use_cache": True, "output_attentions": False, "softcap": None,
                "s_aux": None, "sliding_window": 64, "output_router_logits": False, "cu_seq_lens_q": None}
    out, weights = santa_attention_forward(Attention(CONFIGS[path]), q, k, v, None, **harmless)
    assert out.shape == (1, 1, 4, 8) and torch.isfinite(out).all() and weights is None


@pytest.mark.parametrize(("window", "n_keys"), [(8, 12), (1, 2), (11, 12)])
def test_a_sliding_window_without_a_mask_is_refused(window, n_keys):
    q, k, v = qkv(b=1, hq=4, lk=n_keys, d=8, seed=2)
    with pytest.raises(ValueError, match=f"sliding window of {window} keys but no attention mask for {n_keys} keys"):
        santa_attention_forward(Attention(SantaConfig(budget=1)), q, k, v, None, sliding_window=window)
    mask = torch.ones(1, 1, 1, n_keys, dtype=torch.bool)
    mask[..., : n_keys - window] = False  # the window, as transformers' mask carries it
    out, _ = santa_attention_forward(Attention(SantaConfig(budget=1)), q, k, v, mask, sliding_window=window)
    assert torch.isfinite(out).all()


def exact_santa(**fields) -> SantaConfig:
    return SantaConfig(**{**EXACT_THROUGH_SANTA, **fields})


@pytest.mark.parametrize("n_keys", [5, 9])
def test_an_unmasked_causal_block_over_more_keys_aligns_as_sdpa_does(n_keys):
    """An empty static cache's prefill: keys beyond the queries are unused slots (SDPA slices them)."""
    q, k, v = qkv(b=1, hq=4, lq=4, lk=n_keys, d=8, seed=2)
    module = Attention(exact_santa())
    expected, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.3)
    out, _ = santa_attention_forward(module, q, k, v, None, scaling=0.3)
    assert torch.allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("is_causal", [True, False])
def test_the_modules_causality_applies_when_the_call_does_not_say(is_causal):
    q, k, v = qkv(b=1, hq=4, lq=6, lk=6, d=8, seed=2)
    module = Attention(exact_santa(), is_causal=is_causal)
    expected, _ = sdpa_attention_forward(module, q, k, v, None)
    out, _ = santa_attention_forward(module, q, k, v, None)
    assert torch.allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("kernel", ["prop", "flash"])
def test_a_named_kernel_refuses_value_heads_narrower_than_key_heads(kernel):
    q, k, v = qkv(b=1, hq=4, lk=12, d=8, dv=6, seed=2)
    with pytest.raises(ValueError, match=f"kernel='{kernel}' needs keys and values of one head dim, but layer 0 has 8 and 6"):
        santa_attention_forward(Attention(SantaConfig(budget=3, kernel=kernel)), q, k, v, None)


def test_auto_kernel_falls_back_to_the_reference_for_narrower_value_heads(monkeypatch):
    monkeypatch.setattr(santa.hf, "kernel_for", lambda config, query, mask: "prop")  # as on CUDA
    q, k, v = qkv(b=1, hq=4, lk=12, d=8, dv=6, seed=2)
    out, _ = santa_attention_forward(Attention(SantaConfig(budget=3)), q, k, v, None)
    assert out.shape == (1, 1, 4, 6)


# --- top-k's value rows read ---------------------------------------------------------------------


@pytest.mark.parametrize(("budget", "prompt"), [(4, 20), (1, 12), (7, 9)])
def test_topk_counts_the_value_rows_it_reads(budget, prompt):
    """k of n rows per head and decode step: the share is Σk / Σn (it was not counted: 100 % shown)."""
    model = tiny_hf_model()
    ids = padded_batch()[0][:1, :prompt]
    config = SantaConfig(sampler="topk", budget=budget, record_stats=True)
    generated_logits(model, ids, None, config, new_tokens=4)
    steps = [prompt + i for i in (1, 2, 3)]  # keys of the three decode steps after the prefill's token
    assert config.stats.calls == 3 * model.config.num_hidden_layers
    assert config.stats.share_per_head == pytest.approx(3 * budget / sum(steps))
    assert config.stats.share_per_head <= config.stats.share_per_kv_head <= 2 * config.stats.share_per_head


def test_topk_rows_read_skips_invisible_keys():
    probs = torch.tensor([[[[0.5, 0.0, 0.3, 0.2, 0.0]]]])
    assert santa.hf.topk_rows_read(probs, 4).tolist() == [[[[1, 0, 1, 1, 0]]]]
    assert santa.hf.topk_rows_read(probs, 2).tolist() == [[[[1, 0, 1, 0, 0]]]]


# --- integer fields: santa.checks.integer's convention ----------------------------------------


def test_config_takes_numpy_integers_as_ints():
    config = SantaConfig(
        budget=np.int64(8), layer_budgets={np.int32(1): np.uint16(4)}, dense_layers=(np.int8(0),),
        seed=np.uint64(2**62), score_samples=np.int16(3),
    )
    assert (config.budget, config.layer_budgets, config.dense_layers, config.seed) == (8, {1: 4}, (0,), 2**62)
    ints = (config.budget, *config.layer_budgets, *config.layer_budgets.values(), *config.dense_layers, config.seed, config.score_samples)
    assert all(type(x) is int for x in ints)  # a numpy seed would overflow in the stream ids


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("budget", 8.0), ("budget", np.float32(8)), ("budget", "8"), ("budget", True),
        ("layer_budgets", {1.0: 4}), ("layer_budgets", {1: 4.0}), ("layer_budgets", {1: np.float64(4)}),
        ("dense_layers", (0.0,)), ("dense_layers", (np.float16(1),)),
        ("seed", 1.0), ("seed", np.float64(1)), ("seed", None),
        ("score_samples", 2.0), ("score_samples", math.inf),
    ],
)
def test_config_refuses_a_float_where_an_int_is_expected_with_a_type_error(field, value):
    with pytest.raises(TypeError, match="must be an int"):
        SantaConfig(**{field: value})


def test_config_refuses_layer_budgets_with_the_dense_sampler():
    """A schedule would be ignored: dense reads every key."""
    with pytest.raises(ValueError, match="layer_budgets sets samples per layer for a sampler; sampler='dense'"):
        SantaConfig(sampler="dense", layer_budgets={0: 4})
