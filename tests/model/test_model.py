"""The compact decoder's decode path: per-sequence lengths, stop tokens, every backend on one cache,
and santa decode within its error bound (real checkpoints: tests/model/test_model_real.py).

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

from santa import rng
from santa.kernels import flash_reference, flash_tile, prop_reference
from santa.model import (
    CONFIGS,
    REFERENCE_BACKENDS,
    DecodeContext,
    ModelArgs,
    Transformer,
    advance,
    generate,
    make_context,
    pad_prompts,
    prefill,
    rope_tables,
)

TINY = CONFIGS["tiny"]


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
    ctx = DecodeContext(backend=backend, seq_lens=seq_lens, budget=budget, positions=seq_lens.long() - 1,
                        layer_keys=torch.zeros(1, q.shape[0], dtype=torch.int64), santa_impl=impl)
    return ctx.attend(q, k, v, ctx, attn.layer_id).double()


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


def prompts_of_lengths(*lengths, seed=4):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, TINY.vocab_size, (n,), generator=gen) for n in lengths]


def test_cached_decode_equals_a_full_forward(tiny_transformer):
    prompt = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(4))
    tokens = torch.stack(generate(tiny_transformer, prompt, 5, backend="sdpa"))
    with torch.inference_mode():
        full = torch.cat([prompt, tokens], dim=1)
        tiny_transformer.setup_caches(2, full.shape[1])
        logits = tiny_transformer(full, torch.arange(full.shape[1]))
    assert torch.equal(logits[:, prompt.shape[1] - 1 : -1].argmax(-1), tokens)


def test_batch_of_prompts_of_different_lengths_generates_each_prompts_own_tokens(tiny_transformer):
    prompts = prompts_of_lengths(5, 23, 12)
    batch = generate(tiny_transformer, prompts, 12, backend="sdpa")
    alone = [generate(tiny_transformer, [p], 12, backend="sdpa")[0] for p in prompts]
    assert all(torch.equal(b, a) for b, a in zip(batch, alone, strict=True))


def test_stop_token_ends_its_sequence_and_leaves_the_others_running(tiny_transformer):
    prompts = prompts_of_lengths(5, 23, 12)
    free = generate(tiny_transformer, prompts, 12)
    stop = int(free[1][4])
    stopped = generate(tiny_transformer, prompts, 12, stop_tokens=[stop])
    for tokens, full in zip(stopped, free, strict=True):
        hits = (full == stop).nonzero()
        end = int(hits[0]) + 1 if len(hits) else len(full)  # up to and with the first stop token
        assert torch.equal(tokens, full[:end])
    assert len(stopped[1]) <= 5


def test_advance_freezes_finished_sequences_and_marks_new_stops():
    token, input_pos = torch.tensor([[7], [8], [9]]), torch.tensor([10, 20, 30])
    done = torch.tensor([True, False, False])
    advance(token, torch.tensor([[1], [2], [3]]), input_pos, stop_tokens=torch.tensor([3, 5]), done=done)
    assert token.flatten().tolist() == [7, 2, 3]
    assert input_pos.tolist() == [10, 21, 31]
    assert done.tolist() == [True, False, True]


@pytest.mark.parametrize("backend", ["santa-prop", "santa-flash"])
def test_santa_model_with_large_budget_generates_the_dense_tokens(tiny_transformer, backend, monkeypatch):
    # The kernels' torch emulation, not the Triton interpreter, which takes minutes at S = 8192;
    # tests/kernels/test_kernels.py checks the kernels against that emulation.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    prompts = prompts_of_lengths(20, 7, 13, seed=5)
    dense = generate(tiny_transformer, prompts, 4, backend="sdpa")
    sampled = generate(tiny_transformer, prompts, 4, backend=backend, budget=8192)
    assert all(torch.equal(s, d) for s, d in zip(sampled, dense, strict=True))


def test_dense_below_gives_short_decode_steps_to_the_dense_backend(tiny_transformer, monkeypatch):
    """The longest prompt holds 20 tokens, so decode step i sees at most 20 + i keys. Above every step the sampled
    backend generates the dense tokens. At 23, steps 1 and 2 are dense and the later ones sampled. At 0 (the default)
    every step samples."""
    import santa.model as model_module

    ran = []  # (attention, the longest sequence's keys) of layer 0's calls

    def recording(kind, attention):
        def attend(q, k_cache, v_cache, ctx, layer):
            if layer == 0:
                ran.append((kind, int(ctx.seq_lens.max())))
            return attention(q, k_cache, v_cache, ctx, layer)
        return attend

    monkeypatch.setattr(model_module, "dense_decode", recording("dense", model_module.dense_decode))
    monkeypatch.setattr(model_module, "reference_decode", recording("sampled", model_module.reference_decode))
    prompts = prompts_of_lengths(20, 7, 13, seed=5)
    dense = generate(tiny_transformer, prompts, 8, backend="sdpa")
    sampled = generate(tiny_transformer, prompts, 8, backend="iid", budget=2, seed=3)
    assert any(not torch.equal(s, d) for s, d in zip(sampled, dense, strict=True))  # S = 2 moves the greedy tokens
    above = generate(tiny_transformer, prompts, 8, backend="iid", budget=2, seed=3, dense_below=100)
    assert all(torch.equal(a, d) for a, d in zip(above, dense, strict=True))
    ran.clear()
    split = generate(tiny_transformer, prompts, 8, backend="iid", budget=2, seed=3, dense_below=23)
    assert ran == [("dense", 21), ("dense", 22)] + [("sampled", n) for n in range(23, 28)]
    assert all(torch.equal(t[:3], d[:3]) for t, d in zip(split, dense, strict=True))  # the prefill's token, steps 1-2
    assert not all(torch.equal(t, d) for t, d in zip(split, dense, strict=True))
    assert all(torch.equal(t, s) for t, s in zip(generate(tiny_transformer, prompts, 8, backend="iid", budget=2, seed=3,
                                                          dense_below=0), sampled, strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_dense_below_in_cuda_graphs_is_the_eager_loop():
    """Two graphs, one per kind of step, taking turns on one loop state: the tokens of the eager loop."""
    model = Transformer.random(TINY, device="cuda", dtype=torch.bfloat16, seed=0).eval()
    prompts = [p.cuda() for p in prompts_of_lengths(20, 7, 13, seed=5)]
    kwargs = dict(backend="santa-prop", budget=4, seed=3, dense_below=23)
    graphed = generate(model, prompts, 8, cuda_graph=True, **kwargs)
    eager = generate(model, prompts, 8, cuda_graph=False, **kwargs)
    assert all(torch.equal(g, e) for g, e in zip(graphed, eager, strict=True))


def test_topk_reference_backend_covering_every_key_generates_the_dense_tokens(tiny_transformer):
    prompts = prompts_of_lengths(20, 7, 13, seed=6)
    dense = generate(tiny_transformer, prompts, 6, backend="sdpa")
    topk = generate(tiny_transformer, prompts, 6, backend="topk", budget=256)  # k = the whole 256-key cache
    assert all(torch.equal(t, d) for t, d in zip(topk, dense, strict=True))


def prefilled_layer(model, lengths, seed=7):
    """Layer 0 after a right-padded prefill of prompts of ``lengths``, the next query ``[B, H, d]``
    and the cache, with every sequence's next key already written (as a decode step has it)."""
    prompts = prompts_of_lengths(*lengths, seed=seed)
    padded, lens = pad_prompts(prompts, vocab_size=TINY.vocab_size)
    model.setup_caches(len(lengths), padded.shape[1] + 1)
    with torch.inference_mode():
        prefill(model, padded, lengths=lens)
    cache = model.layers[0].attention.kv_cache
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(len(lengths), TINY.n_head, TINY.head_dim, generator=gen)
    for b, n in enumerate(lengths):  # the new token's K/V at position n
        cache.k_cache[b, n] = torch.randn(TINY.n_kv_head, TINY.head_dim, generator=gen)
        cache.v_cache[b, n] = torch.randn(TINY.n_kv_head, TINY.head_dim, generator=gen)
    return model.layers[0].attention, q, cache, lens + 1  # seq_lens: prompt + the new key


@pytest.mark.parametrize("kernel", ["prop", "flash"])
def test_santa_decode_of_the_model_equals_the_kernel_reference_on_its_cache(tiny_transformer, kernel):
    # Under TRITON_INTERPRET=1 this runs the Triton kernel; its oracle is santa.kernels.reference.
    attn, q, cache, seq_lens = prefilled_layer(tiny_transformer, (5, 130, 40))
    ctx = make_context(tiny_transformer, f"santa-{kernel}", prompt_len=seq_lens, budget=16, seed=3)
    with torch.inference_mode():
        out = ctx.attend(q, cache.k_cache, cache.v_cache, ctx, attn.layer_id)
    kwargs = {"tile": flash_tile(TINY.head_dim)} if kernel == "flash" else {}
    ref = prop_reference if kernel == "prop" else flash_reference
    keys = torch.full((3,), rng.layer_key(3, 0))  # layer 0's key for every sequence, at its query's position
    expected, _ = ref(q, cache.k_cache, cache.v_cache, 16, seq_lens=ctx.seq_lens, seed=keys, positions=seq_lens - 1, **kwargs)
    assert torch.allclose(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "santa-prop", "santa-flash", *REFERENCE_BACKENDS])
def test_keys_beyond_a_sequences_length_never_reach_its_output(tiny_transformer, backend):
    attn, q, cache, seq_lens = prefilled_layer(tiny_transformer, (5, 130, 40))
    beyond = torch.arange(cache.k_cache.shape[1]) >= seq_lens.unsqueeze(-1)  # [B, L_max]: pads and unwritten slots

    def decode():
        ctx = make_context(tiny_transformer, backend, prompt_len=seq_lens, budget=8, seed=1)
        with torch.inference_mode():
            return ctx.attend(q, cache.k_cache, cache.v_cache, ctx, attn.layer_id)

    cache.k_cache[beyond], cache.v_cache[beyond] = 0.0, 0.0
    clean = decode()
    cache.k_cache[beyond], cache.v_cache[beyond] = 1e4, 1e4  # would dominate any score or value it entered
    assert torch.equal(decode(), clean)


def test_make_context_gives_each_sequence_its_own_visible_keys(tiny_transformer):
    tiny_transformer.setup_caches(3, 10)
    ctx = make_context(tiny_transformer, "sdpa", prompt_len=torch.tensor([2, 9, 4]))
    ctx.prepare(torch.tensor([3, 9, 4]))  # new tokens at these positions
    assert ctx.seq_lens.tolist() == [4, 10, 5]
    visible = (ctx.attn_bias[:, 0, 0] == 0).sum(-1)
    assert visible.tolist() == [4, 10, 5] and torch.isinf(ctx.attn_bias[0, 0, 0, 4:]).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"prompts": []}, ValueError, "non-empty list"),
        ({"prompts": [[1, 2], []]}, ValueError, r"prompts\[1\] is empty"),
        ({"prompts": [[1.5, 2.0]]}, TypeError, r"prompts\[0\] must be a 1-D sequence of int"),
        ({"prompts": [[1, 999]]}, ValueError, r"outside \[0, 256\)"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be an int ≥ 1"),
        ({"budget": 0}, ValueError, "budget must be ≥ 1"),
        ({"backend": "dense"}, ValueError, "backend must be one of"),
        ({"backend": "flashinfer"}, ValueError, "santa bench e2e"),
        ({"backend": "weights-only"}, ValueError, "santa bench e2e"),
        ({"santa_impl": "cuda"}, ValueError, "santa_impl must be one of"),
        ({"cuda_graph": True}, ValueError, "cuda_graph=True needs a CUDA model"),
        ({"dense_below": -1}, ValueError, "dense_below must be an int ≥ 0"),
        ({"dense_below": 8192.0}, TypeError, "dense_below must be an int"),
    ],
)
def test_generate_refuses_bad_arguments_by_name(tiny_transformer, kwargs, error, message):
    call = {"prompts": [[1, 2, 3]], "max_new_tokens": 2, **kwargs}
    with pytest.raises(error, match=message):
        generate(tiny_transformer, call.pop("prompts"), call.pop("max_new_tokens"), **call)


def test_random_qwen_shaped_model_carries_qkv_biases():
    args = ModelArgs(**{**TINY.__dict__, "qkv_bias": True, "tie_embeddings": True})
    model = Transformer.random(args, device="cpu", dtype=torch.float32)
    bias = model.layers[0].attention.wqkv.bias
    assert bias.shape == ((args.n_head + 2 * args.n_kv_head) * args.head_dim,) and bias.abs().sum() > 0
    assert model.output.weight is model.tok_embeddings.weight


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
    from benchmarks.bench.cli import main

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


@pytest.mark.parametrize("backend", ["santa-prop", "systematic"])
def test_layer_budgets_set_the_budget_of_each_layer(backend, monkeypatch, tiny_transformer):
    """A ``santa tune budgets`` schedule: layer 1 samples 7 per head, layer 0 the default 5."""
    import santa.model as model_mod

    seen = []
    if backend == "santa-prop":  # one DecodePlan per budget, run per layer
        real = model_mod.santa_kernels.DecodePlan.run
        monkeypatch.setattr(model_mod.santa_kernels.DecodePlan, "run", lambda plan, *a, **kw: seen.append(plan.budget) or real(plan, *a, **kw))
    else:
        real = model_mod.sampled_attention
        monkeypatch.setattr(model_mod, "sampled_attention", lambda q, k, v, budget, **kw: seen.append(budget) or real(q, k, v, budget, **kw))
    generate(tiny_transformer, [[1, 2, 3, 4, 5]], 3, backend=backend, budget=5, layer_budgets={1: 7}, cuda_graph=False)
    assert seen == [5, 7] * 2  # two decode steps after the prefill's token, layers 0 and 1


@pytest.mark.parametrize("layer_budgets,error,match", [
    ({2: 4}, ValueError, r"layer_budgets key \(a layer index\) must be an int in \[0, 2\)"),
    ({"0": 4}, TypeError, r"layer_budgets key \(a layer index\) must be an int"),
    ({0: 0}, ValueError, r"layer_budgets\[0\]"),
    ([4, 4], TypeError, "layer_budgets must be a dict"),
])
def test_layer_budgets_are_checked(layer_budgets, error, match, tiny_transformer):
    with pytest.raises(error, match=match):
        generate(tiny_transformer, [[1, 2, 3]], 2, backend="santa-prop", budget=4, layer_budgets=layer_budgets, cuda_graph=False)


@pytest.mark.parametrize(("seed", "error"), [(-1, ValueError), (2**63, ValueError), (1.5, TypeError), ("3", TypeError)])
def test_seeds_the_kernels_would_refuse_are_refused_by_name(seed, error, tiny_transformer):
    with pytest.raises(error, match="seed must be an int"):
        generate(tiny_transformer, [[1, 2, 3]], 2, backend="santa-prop", seed=seed, cuda_graph=False)


def test_prefill_names_what_its_caches_lack():
    """santa.model.prefill before setup_caches, or with a prompt the caches cannot hold, names the call to make
    (a TypeError for a prompt that is not token ids), where it raised from inside the model."""
    model = Transformer.random(CONFIGS["tiny"], device="cpu", dtype=torch.float32, seed=0).eval()  # no caches yet
    prompt = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"call model.setup_caches\(batch=2, max_len ≥ 8"):
        prefill(model, prompt)
    model.setup_caches(1, 8)
    with pytest.raises(ValueError, match=r"does not fit the caches set up for batch 1 and 256 positions"):
        prefill(model, prompt)
    model.setup_caches(2, 8)
    with pytest.raises(ValueError, match=r"\[B=2, T=300\] does not fit"):
        prefill(model, torch.zeros(2, 300, dtype=torch.long))
    with pytest.raises(TypeError, match="prompt must be an int64 tensor of token ids"):
        prefill(model, torch.zeros(2, 8))
    assert prefill(model, prompt).shape == (2, 1)
