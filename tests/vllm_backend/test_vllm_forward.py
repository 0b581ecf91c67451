"""santa's metadata builder and ``SantaAttentionImpl.forward`` called as vLLM 0.26 calls them, over the
stand-ins of conftest.py (no vLLM needed): a decode-only batch runs santa's kernel and equals exact attention
where S covers every sequence's live keys (the new token written by ``do_kv_cache_update`` first, then read); a
layer without ``layer_name`` (vLLM's own test mock) or without an index in it decodes under a defined key; a mixed
batch's decode rows run santa and its prefill rows FlashAttention on their own metadata, in the same step; prefill
batches, the dense setting, fused output quantisation and the profiling run go to FlashAttention; an fp8 cache and
an fp8 query (quantised by the layer with its ``_q_scale``) are read with their scales."""

import math

import pytest
import torch

from helpers import DEVICE
from santa import rng
from santa.kernels import decode
from santa.vllm.decode import PagedDecoder
from santa.vllm.layers import layer_index
from vllm_stand_ins import (
    BLOCK,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    FlashAttentionImpl,
    MockLayer,
    kv_cache_spec,
    make_batch,
    vllm_config,
)

SCALE = 1 / math.sqrt(HEAD_DIM)


def impl_of(backend, kv_cache_dtype="auto"):
    """The implementation vLLM builds for a plain decoder layer (the keywords vLLM's own backend test passes)."""
    return backend.SantaAttentionImpl(num_heads=HEADS, head_size=HEAD_DIM, scale=SCALE, num_kv_heads=KV_HEADS,
                                      alibi_slopes=None, sliding_window=None, kv_cache_dtype=kv_cache_dtype,
                                      attn_type="decoder")


def step(backend, batch, layer, *, config=None, spec=None, impl=None, output_dtype=torch.float32, query=None):
    """One layer's step as vLLM's runner takes it: build the metadata, write the new tokens' K/V, call forward."""
    builder = backend.SantaMetadataBuilder(spec or kv_cache_spec(), ["model.layers.0.self_attn.attn"],
                                           config or vllm_config(), DEVICE)
    metadata = builder.build(0, batch.common)
    impl = impl or impl_of(backend)
    impl.do_kv_cache_update(layer, batch.key, batch.value, batch.kv_cache, metadata.slot_mapping)
    query = batch.query if query is None else query
    output = torch.full((query.shape[0], HEADS, HEAD_DIM), float("nan"), dtype=output_dtype, device=DEVICE)
    return impl.forward(layer, query, batch.key, batch.value, batch.kv_cache, metadata, output=output), metadata, impl


def no_santa(monkeypatch):
    """Make santa's decode fail if called: a batch that must go to FlashAttention."""
    def refuse(*args, **kwargs):
        raise AssertionError("santa's decode ran on a batch that FlashAttention must take")

    monkeypatch.setattr(PagedDecoder, "run", refuse)


@pytest.mark.parametrize("kernel", ["prop", "flash"])
def test_a_decode_batch_runs_santa_and_is_exact_where_s_covers_every_sequence(backend, monkeypatch, kernel):
    monkeypatch.setenv("SANTA_VLLM_KERNEL", kernel)
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "96")  # ≥ every sequence's keys: santa computes each one exactly
    batch = make_batch([37, 96, 5], [1, 1, 1], seed=1, table_width=8)  # the runner's table: wider than 96 keys
    out, metadata, impl = step(backend, batch, MockLayer())
    assert FlashAttentionImpl.calls == 0  # santa's decode, not FlashAttention
    decoder = metadata.santa.decoder
    assert isinstance(decoder, PagedDecoder) and decoder.max_keys == 96 and decoder.max_batch == 4
    assert metadata.santa.positions.tolist() == [36, 95, 4] and metadata.santa.split is None
    torch.testing.assert_close(out, batch.exact(SCALE), rtol=1e-5, atol=1e-5)


def test_a_sampled_decode_step_is_santas_decode_keyed_on_the_layer_index(backend, monkeypatch):
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "24")
    monkeypatch.setenv("SANTA_VLLM_SEED", "7")
    batch = make_batch([90, 50], [1, 1], seed=2)
    out, _, impl = step(backend, batch, MockLayer("model.layers.3.self_attn.attn"))
    assert impl.layer_index == 3 and FlashAttentionImpl.calls == 0
    k_pages, v_pages = batch.kv_cache.transpose(1, 2).split(HEAD_DIM, dim=-1)
    seq_lens = batch.common.seq_lens
    want = decode(batch.query, k_pages.contiguous(), v_pages.contiguous(), 24, seq_lens=seq_lens,
                  block_table=batch.common.block_table_tensor, scale=SCALE, seed=rng.layer_key(7, 3), positions=seq_lens - 1)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    assert (out - batch.exact(SCALE)).abs().max() > 1e-3  # S < the keys: sampled, not exact


@pytest.mark.parametrize("name", [None, "placeholder", "model.layers.1.blocks.2.attn"])
def test_a_layer_without_an_index_in_its_name_decodes_under_a_defined_key(backend, monkeypatch, name):
    """vLLM's own backend test hands forward a mock layer with no layer_name; other names may hold no index, or two."""
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "24")
    batch = make_batch([90, 50], [1, 1], seed=3)
    out, _, impl = step(backend, batch, MockLayer(name))
    assert impl.layer_index == layer_index(name) < 0
    again, _, _ = step(backend, make_batch([90, 50], [1, 1], seed=3), MockLayer(name))
    assert torch.equal(out, again)  # the same key in every run (no construction order, no process salt)
    indexed, _, _ = step(backend, make_batch([90, 50], [1, 1], seed=3), MockLayer("model.layers.0.self_attn.attn"))
    assert not torch.equal(out, indexed)  # never a real layer's draws


def test_layer_index_follows_vllms_rule_and_keys_the_rest_stably():
    assert layer_index("model.layers.31.self_attn.attn") == 31 and layer_index("2.self_attn") == 2
    assert layer_index(None) == layer_index("") < 0
    assert layer_index("placeholder") < 0 and layer_index("placeholder") != layer_index("other")
    assert layer_index("model.layers.1.blocks.2.attn") < 0  # two integers: vLLM's rule names no single layer
    # pinned: a key is part of what a seed reproduces (BLAKE2b of the name, not Python's per-process salted hash)
    assert (layer_index("placeholder"), layer_index(None)) == (-10877430270814766, -22125486566988443)


@pytest.mark.parametrize(("seq_lens", "query_lens"), [([40, 33], [8, 8]), ([40, 33, 20], [6, 1, 1])],
                         ids=["prefill", "prefill first"])
def test_prefill_batches_run_flash_attention(backend, monkeypatch, seq_lens, query_lens):
    """A batch without decode requests first (the runner orders decodes first: a prefill in row 0 means none) goes to
    FlashAttention whole."""
    no_santa(monkeypatch)
    batch = make_batch(seq_lens, query_lens, seed=4)
    out, metadata, _ = step(backend, batch, MockLayer("model.layers.0.self_attn.attn"))
    assert FlashAttentionImpl.calls == 1 and metadata.santa.split is None
    torch.testing.assert_close(out, batch.exact(SCALE), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("budget", ["64", "8"])
def test_a_mixed_step_splits_decode_rows_to_santa_and_prefill_rows_to_flash_attention(backend, monkeypatch, budget):
    """Chunked prefill: two running requests decode one token each beside two prompt chunks. The decode rows are
    santa's decode of those requests alone (S = 64 covers their 45 and 60 keys: exact; S = 8: the same samples as santa's decode
    called directly), the prefill rows FlashAttention's on metadata built for them alone, in one forward call."""
    monkeypatch.setenv("SANTA_VLLM_BUDGET", budget)
    batch = make_batch([45, 60, 30, 20], [1, 1, 12, 20], seed=8)
    out, metadata, _ = step(backend, batch, MockLayer("model.layers.3.self_attn.attn"))
    split = metadata.santa.split
    assert split.decodes == 2 and split.prefill.num_actual_tokens == 32 and split.prefill.query_start_loc.tolist() == [0, 12, 32]
    assert FlashAttentionImpl.calls == 1  # the prefill rows, once
    exact = batch.exact(SCALE)
    torch.testing.assert_close(out[2:], exact[2:], rtol=1e-5, atol=1e-5)
    if budget == "64":
        torch.testing.assert_close(out[:2], exact[:2], rtol=1e-5, atol=1e-5)
    else:
        direct = PagedDecoder(heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK, max_keys=96, max_batch=4,
                              budget=8, kernel="prop", seed=0, dtype=torch.float32, kv_dtype=torch.float32, device=DEVICE)
        want = direct.run(batch.query[:2], batch.kv_cache, seq_lens=batch.common.seq_lens[:2],
                          block_table=batch.common.block_table_tensor[:2], layer=3, scale=SCALE,
                          out=torch.empty(2, HEADS, HEAD_DIM, device=DEVICE))
        assert torch.equal(out[:2], want)
        assert not torch.allclose(out[:2], exact[:2], atol=1e-3)  # sampled, not FlashAttention's exact answer


@pytest.mark.parametrize(("capture_sizes", "prompts", "extra", "rows"),
                         [((1, 2, 4), [12], 0, 4), ((1, 2, 4), [12], 5, 4), ((1, 6), [2], 0, 6), ((1, 2, 4), [], 0, 4),
                          ((1, 8), [], 2, 8)])
def test_a_steps_decode_rows_run_a_plan_made_at_start_up(backend, monkeypatch, capture_sizes, prompts, extra, rows):
    """Three decode rows, beside a prompt chunk or alone (an eager decode step), run on the plan the builder made at
    start-up for the next captured batch size, the rows past three empty: no plan is made while a server runs (nor
    its kernels compiled). The three rows equal santa's decode of those requests alone (the samples
    do not depend on the batch) and a prompt's rows FlashAttention's exact ones. Rows are read in place where the query
    has them (a 12-token chunk; ``extra``: the runner's padding rows past the step's tokens), else through copies of
    the query, the output and the block table (a 2-token chunk beside 6 rows; a decode step alone)."""
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "8")
    batch = make_batch([45, 60, 33, 20][: 3 + len(prompts)], [1, 1, 1, *prompts], seed=9, table_width=6)  # 96 keys wide
    builder = backend.SantaMetadataBuilder(kv_cache_spec(), ["model.layers.5.self_attn.attn"],
                                           vllm_config(max_num_seqs=8, capture_sizes=capture_sizes), DEVICE)
    made = set(builder.santa._plans)
    assert {key[0] for key in made} == set(capture_sizes)
    metadata = builder.build(0, batch.common)
    assert (metadata.santa.split is None) == (not prompts)
    impl = backend.SantaAttentionImpl(num_heads=HEADS, head_size=HEAD_DIM, scale=HEAD_DIM ** -0.5, num_kv_heads=KV_HEADS,
                                      alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto", attn_type="decoder")
    layer = MockLayer("model.layers.5.self_attn.attn")
    impl.do_kv_cache_update(layer, batch.key, batch.value, batch.kv_cache, metadata.slot_mapping)
    tokens = batch.query.shape[0]
    query = torch.cat([batch.query, torch.randn(extra, HEADS, HEAD_DIM, device=DEVICE)])
    out = torch.full((tokens + extra, HEADS, HEAD_DIM), float("nan"), device=DEVICE)
    impl.forward(layer, query, batch.key, batch.value, batch.kv_cache, metadata, output=out)
    padded = metadata.santa.padded[3]
    assert padded.rows == rows and padded.seq_lens.tolist() == [45, 60, 33] + [0] * (rows - 3)
    assert set(builder.santa._plans) == made
    direct = PagedDecoder(heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK, max_keys=96, max_batch=3,
                          budget=8, kernel="prop", seed=0, dtype=torch.float32, kv_dtype=torch.float32, device=DEVICE)
    want = direct.run(batch.query[:3], batch.kv_cache, seq_lens=batch.common.seq_lens[:3],
                      block_table=batch.common.block_table_tensor[:3], layer=5, scale=HEAD_DIM ** -0.5,
                      out=torch.empty(3, HEADS, HEAD_DIM, device=DEVICE))
    assert torch.equal(out[:3], want)
    torch.testing.assert_close(out[3:tokens], batch.exact(HEAD_DIM ** -0.5)[3:], rtol=1e-5, atol=1e-5)


def test_the_dense_setting_runs_flash_attention_on_decode_batches_and_allocates_nothing(backend, monkeypatch):
    monkeypatch.setenv("SANTA_VLLM_KERNEL", "dense")
    no_santa(monkeypatch)
    batch = make_batch([60, 17], [1, 1], seed=5)
    out, metadata, _ = step(backend, batch, MockLayer())
    assert FlashAttentionImpl.calls == 1 and metadata.santa.decoder._scratch is None
    torch.testing.assert_close(out, batch.exact(SCALE), rtol=1e-5, atol=1e-5)
    # nothing to split, so the runner is not asked to put decode requests first (FlashAttention's builder asks for none)
    builder = backend.SantaMetadataBuilder(kv_cache_spec(), ["layer"], vllm_config(), DEVICE)
    assert builder.reorder_batch_threshold is None


def test_fused_output_quantisation_and_the_profiling_run_go_to_flash_attention(backend, monkeypatch):
    no_santa(monkeypatch)
    batch = make_batch([60, 17], [1, 1], seed=6)
    builder = backend.SantaMetadataBuilder(kv_cache_spec(), ["layer"], vllm_config(), DEVICE)
    metadata, impl, output = builder.build(0, batch.common), impl_of(backend), torch.empty(2, HEADS, HEAD_DIM, device=DEVICE)
    with pytest.raises(NotImplementedError, match="fused output quantization"):  # FlashAttention's own refusal
        impl.forward(MockLayer(), batch.query, batch.key, batch.value, batch.kv_cache, metadata, output=output,
                     output_scale=torch.ones((), device=DEVICE))
    assert torch.equal(impl.forward(MockLayer(), batch.query, batch.key, batch.value, batch.kv_cache, None, output=output),
                       torch.zeros_like(output))


def test_an_fp8_cache_and_query_are_read_with_the_layers_scales(backend, monkeypatch):
    """The layer quantises q to e4m3 for FlashAttention (dividing by _q_scale); santa dequantises it into the output's
    dtype, and reads the uint8 cache written by do_kv_cache_update with _k_scale and _v_scale."""
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "128")  # exact: the comparison is with dequantised exact attention
    scales = (0.5, 0.25)
    batch = make_batch([70, 128], [1, 1], seed=7, fp8_scales=scales)
    q_scale = 0.125
    q8 = (batch.query / q_scale).to(torch.float8_e4m3fn)
    batch.query = q8.float() * q_scale  # the query the cache's keys meet
    out, metadata, _ = step(backend, batch, MockLayer("model.layers.2.attn", q_scale, *scales), spec=kv_cache_spec(torch.uint8),
                            config=vllm_config(max_model_len=128, dtype=torch.float32), impl=impl_of(backend, "fp8"), query=q8)
    assert metadata.santa.decoder.kv_dtype == torch.float8_e4m3fn and FlashAttentionImpl.calls == 0
    torch.testing.assert_close(out, batch.exact(SCALE), rtol=1e-4, atol=1e-4)


def test_the_builder_sizes_santas_decoder_from_vllms_config(backend, monkeypatch):
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "32")
    monkeypatch.setenv("SANTA_VLLM_KERNEL", "flash")
    builder = backend.SantaMetadataBuilder(kv_cache_spec(), ["layer"], vllm_config(max_model_len=100, max_num_seqs=3), DEVICE)
    santa = builder.santa
    assert (santa.heads, santa.kv_heads, santa.head_dim, santa.block_size) == (HEADS, KV_HEADS, HEAD_DIM, BLOCK)
    assert (santa.max_keys, santa.max_batch, santa.budget, santa.kernel) == (112, 3, 32, "flash")
    assert santa._scratch is not None and santa._scratch.numel() == santa.workspace_nbytes()  # allocated at start-up
    assert builder._cudagraph_support == backend.AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert builder.reorder_batch_threshold == 1


def test_the_stand_ins_split_a_mixed_step_as_vllm_does():
    """Where vLLM 0.26 is installed: its own split_decodes_and_prefills and split_attn_metadata give, on a mixed step
    laid out as make_batch lays it, what the stand-ins santa's CPU tests use give."""
    pytest.importorskip("vllm")
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills as vllm_split
    from vllm.v1.worker.ubatch_utils import UBatchSlice as VllmSlice
    from vllm.v1.worker.ubatch_utils import split_attn_metadata as vllm_split_metadata

    import vllm_stand_ins as stand_ins

    common = make_batch([45, 60, 30, 20], [1, 1, 12, 20], seed=8).common
    real = CommonAttentionMetadata(**vars(common))
    assert vllm_split(real, decode_threshold=1) == stand_ins.split_decodes_and_prefills(common, decode_threshold=1) == (2, 2, 2, 32)
    ours = stand_ins.split_attn_metadata([stand_ins.UBatchSlice(slice(2, 4), slice(2, 34))], common)[0]
    theirs = vllm_split_metadata([VllmSlice(request_slice=slice(2, 4), token_slice=slice(2, 34))], real)[0]
    for name in ("query_start_loc", "query_start_loc_cpu", "seq_lens", "block_table_tensor", "slot_mapping"):
        assert torch.equal(getattr(ours, name).cpu(), getattr(theirs, name).cpu()), name
    for name in ("num_reqs", "num_actual_tokens", "max_query_len", "max_seq_len"):
        assert getattr(ours, name) == getattr(theirs, name), name


def test_the_builder_and_the_layers_read_santas_settings_from_vllms_additional_config(backend, monkeypatch, caplog):
    """The builder reads ``vllm_config.additional_config["santa"]`` and logs every setting with its source; the layers,
    built while vLLM's current config is set, read the same; a bad value stops the builder naming the setting."""
    import logging

    import vllm_stand_ins

    config = vllm_config(additional_config={"santa": {"budget": 16, "kernel": "flash"}})
    monkeypatch.setattr(vllm_stand_ins.CurrentConfig, "config", config)
    with caplog.at_level(logging.INFO, logger="vllm.santa"):
        builder = backend.SantaMetadataBuilder(kv_cache_spec(), ["model.layers.0.self_attn.attn"], config, DEVICE)
    assert builder.santa.budget == 16 and builder.santa.kernel == "flash"
    assert "budget=16 (--additional-config), kernel=flash (--additional-config), seed=0 (default)" in caplog.text
    assert impl_of(backend).santa_config.budget == 16
    with pytest.raises(ValueError, match="--additional-config santa.buget: unknown setting"):
        backend.SantaMetadataBuilder(kv_cache_spec(), ["layer"], vllm_config(additional_config={"santa": {"buget": 16}}), DEVICE)


def test_the_metadata_is_typed_and_a_copy_keeps_santas_step(backend, monkeypatch):
    """santa's step is a field of a FlashAttentionMetadata subclass: a copy (dataclasses.replace) still decodes with
    santa; FlashAttention's own metadata (no santa field) runs FlashAttention."""
    import dataclasses

    import vllm_stand_ins

    monkeypatch.setenv("SANTA_VLLM_BUDGET", "24")
    batch = make_batch([90, 50], [1, 1], seed=2)
    out, metadata, impl = step(backend, batch, MockLayer("model.layers.3.self_attn.attn"))
    assert isinstance(metadata, backend.SantaMetadata) and isinstance(metadata, vllm_stand_ins.FlashAttentionMetadata)
    again = impl.forward(MockLayer("model.layers.3.self_attn.attn"), batch.query, batch.key, batch.value, batch.kv_cache,
                         dataclasses.replace(metadata), output=torch.empty_like(out))
    assert torch.equal(again, out) and FlashAttentionImpl.calls == 0
    fields = {f.name: getattr(metadata, f.name) for f in dataclasses.fields(vllm_stand_ins.FlashAttentionMetadata)}
    flash = impl.forward(MockLayer("model.layers.3.self_attn.attn"), batch.query, batch.key, batch.value, batch.kv_cache,
                         vllm_stand_ins.FlashAttentionMetadata(**fields), output=torch.empty_like(out))
    assert FlashAttentionImpl.calls == 1
    torch.testing.assert_close(flash, batch.exact(SCALE), rtol=1e-5, atol=1e-5)
