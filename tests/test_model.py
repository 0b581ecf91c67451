"""The compact Llama decoder: equals HF on the bundled model, and santa decode obeys its error bound.

"santa with budget ≥ n_keys equals dense" is tested with a tolerance derived from the math, not by
an exact fallback (the santa path has no special case): for systematic counts the partial sums
satisfy ``|Σ_{i≤j} c_i − S·F(j)| < 1``, so by Abel summation
``‖ô − μ‖_∞ = (1/S)‖Σ_j E_j (v_j − v_{j+1})‖_∞ ≤ (1/S) Σ_j ‖v_j − v_{j+1}‖_∞`` (prop), and for
flash the same bound per tile, weighted by the tile's mass, with its ``S_t = ⌈S/T⌉`` samples.
"""

import json
import math

import pytest
import torch

from santa.model import (
    CONFIGS,
    DecodeContext,
    ModelArgs,
    Transformer,
    generate,
    rope_tables,
    santa_decode_torch,
    systematic_indices,
)
from santa.sampling import sample_indices

TINY = CONFIGS["tiny"]


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return Transformer.random(TINY, device="cpu", dtype=torch.float32, seed=0).eval()


def random_cache(batch=2, max_len=300, kv_heads=2, dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(batch, max_len, kv_heads, dim, generator=gen)
    v = torch.randn(batch, max_len, kv_heads, dim, generator=gen)
    return k, v


def dense_decode(q, k, v, seq_lens):
    """float64 ``softmax(q kᵀ/√d) v`` per sequence over its visible keys, and the weights ``[B, H, L]``."""
    batch, heads, dim = q.shape
    group = heads // k.shape[2]
    kk = k.double().repeat_interleave(group, dim=2)  # [B, L, H, d]
    scores = torch.einsum("bhd,blhd->bhl", q.double(), kk) / math.sqrt(dim)
    visible = torch.arange(k.shape[1]) < seq_lens.long().unsqueeze(-1)
    probs = torch.softmax(scores.masked_fill(~visible[:, None], -math.inf), dim=-1)
    return torch.einsum("bhl,blhd->bhd", probs, v.double().repeat_interleave(group, dim=2)), probs


def variation(v, seq_lens, heads, start=0, stop=None):
    """``Σ_j ‖v_j − v_{j+1}‖_∞`` over visible keys in [start, stop), per (sequence, query head): ``[B, H]``."""
    out = torch.zeros(v.shape[0], heads, dtype=torch.float64)
    group = heads // v.shape[2]
    for b, n in enumerate(seq_lens.tolist()):
        end = n if stop is None else min(n, stop)
        if end - start < 2:
            continue
        tv = (v[b, start + 1 : end] - v[b, start : end - 1]).double().abs().amax(-1).sum(0)  # [H_kv]
        out[b] = tv.repeat_interleave(group)
    return out


def decode_with(backend, impl, q, k, v, seq_lens, budget):
    attn = Transformer(ModelArgs(n_layer=1, n_head=q.shape[1], n_kv_head=k.shape[2], dim=q.shape[1] * q.shape[2], intermediate_size=8, vocab_size=8)).layers[0].attention
    ctx = DecodeContext(backend=backend, seq_lens=seq_lens, budget=budget, offset=torch.zeros(1, dtype=torch.int64), santa_impl=impl)
    return attn.decode(q, k, v, ctx).double()


@pytest.mark.parametrize("impl", ["auto", "torch"])
def test_santa_prop_with_budget_covering_keys_is_within_the_systematic_bound(impl):
    k, v = random_cache()
    seq_lens = torch.tensor([300, 77], dtype=torch.int32)
    q = 2 * torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(1))
    budget = 512  # ≥ every n_keys
    out = decode_with("santa-prop", impl, q, k, v, seq_lens, budget)
    ref, _ = dense_decode(q, k, v, seq_lens)
    bound = variation(v, seq_lens, heads=4) / budget  # [B, H]
    err = (out - ref).abs().amax(-1)
    assert (err <= bound * (1 + 1e-3) + 1e-5).all(), (err, bound)
    assert err.max() > 0  # sampled, not an exact fallback


@pytest.mark.parametrize("impl", ["auto", "torch"])
def test_santa_flash_with_tile_budgets_covering_keys_is_within_the_per_tile_bound(impl):
    k, v = random_cache()
    seq_lens = torch.tensor([300, 77], dtype=torch.int32)  # 3 tiles of 128 keys, and 1 tile
    q = 2 * torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(2))
    budget = 1024  # S_t = ⌈1024/3⌉ = 342 ≥ 128 keys per tile
    out = decode_with("santa-flash", impl, q, k, v, seq_lens, budget)
    ref, probs = dense_decode(q, k, v, seq_lens)
    bound = torch.zeros(2, 4, dtype=torch.float64)
    for b, n in enumerate(seq_lens.tolist()):
        n_tiles = -(-n // 128)
        s_tile = -(-budget // n_tiles)
        for t in range(n_tiles):
            mass = probs[b, :, t * 128 : (t + 1) * 128].sum(-1)  # W_t / Z
            tv = variation(v[b : b + 1], seq_lens[b : b + 1], heads=4, start=t * 128, stop=(t + 1) * 128)[0]
            bound[b] += mass * tv / s_tile
    err = (out - ref).abs().amax(-1)
    assert (err <= bound * (1 + 1e-3) + 1e-5).all(), (err, bound)


def test_systematic_indices_equal_the_reference_sampler():
    probs = torch.softmax(torch.randn(3, 5, 40), dim=-1)
    probs[0, 0, 30:] = 0
    probs[0, 0] /= probs[0, 0].sum()
    u = torch.rand(3, 5, dtype=torch.float64)
    expected = sample_indices(probs, 17, "systematic", uniforms=u)
    assert torch.equal(systematic_indices(probs, 17, u), expected)


def test_torch_santa_prop_is_unbiased_over_seeds():
    k, v = random_cache(batch=1, max_len=64)
    seq_lens = torch.tensor([64], dtype=torch.int32)
    q = 3 * torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(3))
    ref, _ = dense_decode(q, k, v, seq_lens)
    torch.manual_seed(0)
    runs = torch.stack([santa_decode_torch(q, k, v, 4, kernel="prop", seq_lens=seq_lens).double() for _ in range(200)])
    spread = runs.std(0) / math.sqrt(runs.shape[0])
    assert ((runs.mean(0) - ref).abs() <= 5 * spread + 1e-6).all()


def test_cached_decode_equals_a_full_forward(tiny_model):
    prompt = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        tokens = generate(tiny_model, prompt, 5, backend="sdpa")
        full = torch.cat([prompt, tokens], dim=1)
        tiny_model.setup_caches(2, full.shape[1])
        logits = tiny_model(full, torch.arange(full.shape[1]))
    assert torch.equal(logits[:, prompt.shape[1] - 1 : -1].argmax(-1), tokens)


@pytest.mark.parametrize("backend", ["santa-prop", "santa-flash"])
def test_santa_model_with_large_budget_generates_the_dense_tokens(tiny_model, backend, monkeypatch):
    # The kernels' torch emulation, not the Triton interpreter, which takes minutes at S = 8192;
    # tests/test_kernels.py checks the kernels against that emulation.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    prompt = torch.randint(0, TINY.vocab_size, (2, 20), generator=torch.Generator().manual_seed(5))
    dense = generate(tiny_model, prompt, 4, backend="sdpa")
    sampled = generate(tiny_model, prompt, 4, backend=backend, budget=8192)
    assert torch.equal(sampled, dense)


def test_weights_only_backend_runs_and_differs_from_dense(tiny_model):
    prompt = torch.randint(0, TINY.vocab_size, (1, 12), generator=torch.Generator().manual_seed(6))
    tokens = generate(tiny_model, prompt, 3, backend="weights-only")
    assert tokens.shape == (1, 3)


def test_llama31_rope_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    args = CONFIGS["llama-3.1-8b"]
    config = LlamaConfig(
        hidden_size=args.dim, num_attention_heads=args.n_head, num_key_value_heads=args.n_kv_head,
        rope_parameters={"rope_type": "llama3", "rope_theta": args.rope_base, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    )
    assert ModelArgs.from_hf_config(config).rope_scaling == args.rope_scaling
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    cos, sin = rope_tables(args, 4)
    expected = torch.outer(torch.arange(4, dtype=torch.float64), inv_freq.double())
    assert torch.allclose(cos[:, : args.head_dim // 2].double(), expected.cos(), atol=1e-6)
    assert torch.allclose(sin[:, : args.head_dim // 2].double(), expected.sin(), atol=1e-6)


def test_bench_e2e_runs_every_cpu_backend_on_the_tiny_config(tmp_path):
    from santa.bench.cli import main

    rc = main(["e2e", "--config", "tiny", "--device", "cpu", "--dtype", "float32", "--batches", "2", "--prompts", "24",
               "--new-tokens", "3", "--warmup", "1", "--budget-flash", "256",
               "--backends", "sdpa,santa-prop,santa-flash,weights-only", "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "e2e.json").read_text())
    rows = {r["backend"]: r for r in report["runs"]}
    assert set(rows) == {"sdpa", "santa-prop", "santa-flash", "weights-only"}
    assert all("ms_per_token" in r for r in rows.values())
    assert rows["sdpa"]["attn_rel_err_layer0"] < 1e-5
    assert "amdahl_limit" in report["summary"][0]


@pytest.fixture(scope="module")
def hf_and_ours():
    from santa.assets import load_model

    hf, tokenizer = load_model("smollm2-135m")
    return hf, tokenizer, Transformer.from_hf(hf).eval()


@pytest.mark.slow
class TestBundledModel:
    def test_config_matches_the_bundled_checkpoint(self, hf_and_ours):
        hf, _, _ = hf_and_ours
        args = ModelArgs.from_hf_config(hf.config)
        expected = CONFIGS["smollm2-135m"]
        assert args.norm_eps == pytest.approx(expected.norm_eps, rel=1e-6)
        assert args == ModelArgs(**{**expected.__dict__, "norm_eps": args.norm_eps})

    def test_prefill_logits_equal_hf(self, hf_and_ours):
        hf, tokenizer, ours = hf_and_ours
        ids = tokenizer("The quick brown fox jumps over the lazy dog because", return_tensors="pt").input_ids
        with torch.inference_mode():
            expected = hf(ids).logits
            ours.setup_caches(1, ids.shape[1])
            got = ours(ids, torch.arange(ids.shape[1]))
        assert torch.allclose(got, expected, atol=2e-4, rtol=1e-4)

    def test_dense_greedy_tokens_equal_hf_generate(self, hf_and_ours):
        hf, tokenizer, ours = hf_and_ours
        text = "Paris is the capital of France. Berlin is the capital of Germany. Rome is the capital of"
        ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.inference_mode():
            expected = hf.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)[0, ids.shape[1] :]
        got = generate(ours, ids, 12, backend="sdpa")[0]
        assert torch.equal(got, expected)
