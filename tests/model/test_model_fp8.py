"""santa.model with an fp8 (e4m3) KV cache: per-KV-head scales calibrated on the prefill, quantised
writes, santa's kernels reading the fp8 cache directly and every other backend its dequantised values."""

from __future__ import annotations

import pytest
import torch

from santa.model import FP8, FP8_MAX, generate, make_context, prefill, resolve_kv_cache_dtype

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]]


@pytest.mark.parametrize("name", [None, "auto", torch.float32])
def test_the_model_dtype_is_the_default_cache(name):
    assert resolve_kv_cache_dtype(name, torch.float32) == torch.float32


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3", torch.float8_e4m3fn])
def test_fp8_names_give_an_e4m3_cache(name):
    assert resolve_kv_cache_dtype(name, torch.bfloat16) == FP8


@pytest.mark.parametrize("name,error,match", [
    ("fp8_e5m2", ValueError, "only e4m3"), (torch.float8_e5m2, ValueError, "only e4m3"),
    (torch.float16, ValueError, "kv_cache_dtype must be one of"), ("int8", ValueError, "kv_cache_dtype must be one of"),
    (8, TypeError, "kv_cache_dtype must be a str or torch.dtype"),
])
def test_other_cache_dtypes_are_refused_by_name(name, error, match, tiny_transformer):
    with pytest.raises(error, match=match):
        tiny_transformer.setup_caches(1, 16, kv_cache_dtype=name)


def test_the_prefill_calibrates_per_head_scales_and_decode_writes_saturate(tiny_transformer):
    model = tiny_transformer
    model.setup_caches(2, 32, kv_cache_dtype="fp8")
    cache = model.layers[0].attention.kv_cache
    assert cache.k_cache.dtype == FP8 and cache.k_scale.shape == (model.args.n_kv_head,)
    padded = torch.tensor([p + [0] * (8 - len(p)) for p in PROMPTS])
    prefill(model, padded, lengths=torch.tensor([8, 4]))
    for layer in model.layers:
        kv = layer.attention.kv_cache
        stored = kv.k_cache[:, :8].float()
        assert torch.isfinite(stored).all()
        # the largest stored magnitude of each KV head is ±448: its scale is that head's amax / 448
        assert torch.allclose(stored.abs().amax(dim=(0, 1, 3)), torch.full((model.args.n_kv_head,), FP8_MAX))
        assert (kv.k_scale > 0).all() and (kv.v_scale > 0).all() and not torch.equal(kv.k_scale, torch.ones_like(kv.k_scale))
    # a decode write far beyond the prompt's range saturates instead of becoming NaN
    big = torch.full((2, 1, model.args.n_kv_head, model.args.head_dim), 1e6)
    k, _ = cache.update(torch.tensor([8, 4]), big, big)
    assert torch.isfinite(k.float()).all() and k[0, 8].float().abs().max() == FP8_MAX


def test_santa_kernels_on_the_fp8_cache_equal_the_reference_on_its_dequantised_values(tiny_transformer):
    """santa-prop reads the fp8 cache through santa.kernels (here its CPU path), santa_impl="torch" the
    dequantised cache: the same estimator, the same uniforms, the same tokens."""
    kernels = generate(tiny_transformer, PROMPTS, 5, backend="santa-prop", budget=16, seed=4, kv_cache_dtype="fp8")
    reference = generate(tiny_transformer, PROMPTS, 5, backend="santa-prop", budget=16, seed=4, kv_cache_dtype="fp8",
                         santa_impl="torch")
    assert all(torch.equal(a, b) for a, b in zip(kernels, reference, strict=True))


def test_dense_decode_on_the_fp8_cache_stays_close_to_the_full_precision_cache(tiny_transformer):
    model = tiny_transformer
    logits = {}
    for dtype in (None, "fp8"):
        model.setup_caches(2, 32, kv_cache_dtype=dtype)
        padded = torch.tensor([p + [0] * (8 - len(p)) for p in PROMPTS])
        lengths = torch.tensor([8, 4])
        ctx = make_context(model, "sdpa", prompt_len=lengths)
        token = prefill(model, padded, lengths=lengths)
        ctx.prepare(lengths)
        logits[dtype] = model(token, lengths, ctx)[:, -1]
    exact, fp8 = logits[None], logits["fp8"]
    # e4m3 keeps 3 mantissa bits: K and V off by ≤ 6.25 % each; the logits move far less than their spread
    assert (fp8 - exact).abs().max() <= 0.05 * (exact.max() - exact.min())
    assert torch.equal(fp8.argmax(-1), exact.argmax(-1))


def test_bench_e2e_runs_on_an_fp8_cache(tmp_path):
    import json

    from benchmarks.bench.cli import main

    rc = main(["e2e", "--config", "tiny", "--device", "cpu", "--dtype", "float32", "--batches", "2", "--prompts", "24",
               "--new-tokens", "3", "--warmup", "1", "--backends", "sdpa,santa-prop,weights-only", "--kv-cache-dtype", "fp8",
               "--no-prefill", "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "e2e.json").read_text())
    rows = {r["backend"]: r for r in report["runs"]}
    assert all("ms_per_token" in r for r in rows.values())
    # both attend the same dequantised cache: dense is exact there, santa within its sampling error
    assert rows["sdpa"]["attn_rel_err_layer0"] < 1e-2 and rows["santa-prop"]["attn_rel_err_layer0"] < 1.0
