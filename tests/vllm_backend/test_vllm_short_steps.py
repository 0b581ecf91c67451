"""Short steps run FlashAttention (``dense_below``; by default with prop, by the model's head shape: 8192 keys at the
stand-ins', 1024 at Llama-3.1-8B's): an eager step is routed on the host
by its longest sequence; a captured decode graph holds FlashAttention and santa's gated launch, and the builder's
gate and FlashAttention's lengths pick one per replay — FlashAttention's exact answer on a short step (santa's launch
writes nothing), santa's samples on a long one (FlashAttention reads zero lengths, santa overwrites its rows)."""

import math

import pytest
import torch

from helpers import DEVICE
from santa import rng
from santa.kernels import decode
from test_vllm_forward import impl_of, no_santa, step
from vllm_stand_ins import (
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
LAYER = "model.layers.3.self_attn.attn"


def santas_decode(batch, budget: int, seed: int = 0, layer: int = 3) -> torch.Tensor:
    """santa's decode of the batch called directly (the sampled answer a long step must give)."""
    k_pages, v_pages = batch.kv_cache.transpose(1, 2).split(HEAD_DIM, dim=-1)
    seq_lens = batch.common.seq_lens
    return decode(batch.query, k_pages.contiguous(), v_pages.contiguous(), budget, seq_lens=seq_lens,
                  block_table=batch.common.block_table_tensor, scale=SCALE, seed=rng.layer_key(seed, layer),
                  positions=seq_lens - 1)


def test_by_default_an_eager_short_decode_step_is_flash_attentions(backend, monkeypatch):
    monkeypatch.delenv("SANTA_VLLM_DENSE_BELOW")  # the default: 8192 keys
    no_santa(monkeypatch)
    batch = make_batch([90, 50], [1, 1], seed=2)
    out, metadata, _ = step(backend, batch, MockLayer(LAYER), config=vllm_config(max_model_len=8192))  # steps can pass 8192
    assert FlashAttentionImpl.calls == 1 and metadata.santa.dense
    assert metadata.santa.gate.tolist() == [0] and metadata.seq_lens.tolist() == [90, 50]  # FlashAttention's: the step's
    torch.testing.assert_close(out, batch.exact(SCALE), rtol=1e-5, atol=1e-5)


def test_an_eager_step_at_or_past_dense_below_is_sampled(backend, monkeypatch):
    monkeypatch.setenv("SANTA_VLLM_DENSE_BELOW", "90")  # the longest sequence holds 90 keys: not below
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "24")
    batch = make_batch([90, 50], [1, 1], seed=2)
    out, metadata, _ = step(backend, batch, MockLayer(LAYER))
    assert FlashAttentionImpl.calls == 0 and not metadata.santa.dense
    assert metadata.santa.gate.tolist() == [1] and metadata.seq_lens.tolist() == [0, 0]  # FlashAttention would read none
    assert metadata.santa.seq_lens.tolist() == [90, 50] and metadata.santa.positions.tolist() == [89, 49]
    torch.testing.assert_close(out, santas_decode(batch, 24), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("dense_below", "dense"), [("91", True), ("90", False)])
def test_a_captured_step_launches_both_and_the_gate_picks_one(backend, monkeypatch, dense_below, dense):
    """What a full CUDA graph records: FlashAttention, then santa's launch with the gate. The same calls give
    FlashAttention's exact rows when the step is short and santa's samples when it is not."""
    monkeypatch.setenv("SANTA_VLLM_DENSE_BELOW", dense_below)
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "24")
    monkeypatch.setattr(backend, "capturing_a_graph", lambda: True)
    batch = make_batch([90, 50], [1, 1], seed=2)
    out, metadata, _ = step(backend, batch, MockLayer(LAYER))
    assert FlashAttentionImpl.calls == 1 and metadata.santa.dense is dense
    torch.testing.assert_close(out, batch.exact(SCALE) if dense else santas_decode(batch, 24), rtol=1e-5, atol=1e-6)


def test_a_short_mixed_step_is_flash_attentions_whole(backend, monkeypatch):
    monkeypatch.delenv("SANTA_VLLM_DENSE_BELOW")
    no_santa(monkeypatch)
    batch = make_batch([45, 60, 30, 20], [1, 1, 12, 20], seed=8)
    out, metadata, _ = step(backend, batch, MockLayer(LAYER))
    assert metadata.santa.split is None and metadata.santa.gate is None and FlashAttentionImpl.calls == 1
    assert metadata.seq_lens.tolist() == [45, 60, 30, 20]  # a mixed step keeps vLLM's own lengths
    torch.testing.assert_close(out, batch.exact(SCALE), rtol=1e-5, atol=1e-5)


def test_dense_below_zero_never_gates(backend, monkeypatch):
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "24")  # the fixture's SANTA_VLLM_DENSE_BELOW=0
    monkeypatch.setattr(backend, "capturing_a_graph", lambda: True)
    batch = make_batch([90, 50], [1, 1], seed=2)
    out, metadata, _ = step(backend, batch, MockLayer(LAYER))
    assert metadata.santa.gate is None and not metadata.santa.dense and FlashAttentionImpl.calls == 0
    assert metadata.seq_lens is batch.common.seq_lens  # vLLM's lengths, untouched
    torch.testing.assert_close(out, santas_decode(batch, 24), rtol=1e-5, atol=1e-6)


def test_no_gate_where_max_model_len_is_below_dense_below(backend, monkeypatch):
    """Every step is short then: captured graphs hold FlashAttention alone (no empty santa launch per layer)."""
    monkeypatch.setenv("SANTA_VLLM_DENSE_BELOW", "97")  # the stand-ins' max_model_len is 96
    monkeypatch.setattr(backend, "capturing_a_graph", lambda: True)
    no_santa(monkeypatch)
    batch = make_batch([90, 50], [1, 1], seed=2)
    out, metadata, _ = step(backend, batch, MockLayer(LAYER))
    assert metadata.santa.gate is None and metadata.santa.dense and FlashAttentionImpl.calls == 1
    assert metadata.santa.decoder._scratch is None  # santa allocates nothing it would never run
    torch.testing.assert_close(out, batch.exact(SCALE), rtol=1e-5, atol=1e-5)


def test_each_build_rewrites_the_buffers_a_captured_graph_reads(backend, monkeypatch):
    """A long step, then a short one with fewer rows, then long again: the gate and FlashAttention's lengths buffer
    (every row of it: a graph captured for more rows reads past the step's) follow each build."""
    monkeypatch.setenv("SANTA_VLLM_DENSE_BELOW", "80")
    builder = backend.SantaMetadataBuilder(kv_cache_spec(), [LAYER], vllm_config(), DEVICE)
    long, short = make_batch([90, 50, 30], [1, 1, 1], seed=1), make_batch([40, 20], [1, 1], seed=1)
    builder.build(0, long.common)
    assert builder.gate.tolist() == [1] and builder.dense_lens.eq(0).all()
    metadata = builder.build(0, short.common)
    assert builder.gate.tolist() == [0] and builder.dense_lens.tolist() == [40, 20, 0, 0]
    assert metadata.seq_lens.data_ptr() == builder.dense_lens.data_ptr()  # FlashAttention reads santa's buffer
    builder.build(0, long.common)
    assert builder.gate.tolist() == [1] and builder.dense_lens.eq(0).all()


def test_a_captured_step_replayed_after_the_next_build_follows_that_build(backend, monkeypatch):
    """The replay of a graph is the captured calls on the buffers as the latest build left them. Here the calls of
    the captured forward are run again on the captured metadata after the builder built the next step: short when
    captured and long when replayed gives santa's samples, and the reverse gives FlashAttention's exact rows."""
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "24")
    monkeypatch.setenv("SANTA_VLLM_DENSE_BELOW", "91")
    monkeypatch.setattr(backend, "capturing_a_graph", lambda: True)
    batch = make_batch([90, 50], [1, 1], seed=2)
    builder = backend.SantaMetadataBuilder(kv_cache_spec(), [LAYER], vllm_config(), DEVICE)
    impl, layer = impl_of(backend), MockLayer(LAYER)
    captured = builder.build(0, batch.common)  # short: the gate closed
    impl.do_kv_cache_update(layer, batch.key, batch.value, batch.kv_cache, captured.slot_mapping)

    def replay() -> torch.Tensor:
        out = torch.full((2, *batch.query.shape[1:]), float("nan"), device=DEVICE)
        return impl.forward(layer, batch.query, batch.key, batch.value, batch.kv_cache, captured, output=out)

    torch.testing.assert_close(replay(), batch.exact(SCALE), rtol=1e-5, atol=1e-5)
    builder.dense_below = 90  # the next step is long
    builder.build(0, batch.common)
    torch.testing.assert_close(replay(), santas_decode(batch, 24), rtol=1e-5, atol=1e-6)
    builder.dense_below = 91
    builder.build(0, batch.common)
    torch.testing.assert_close(replay(), batch.exact(SCALE), rtol=1e-5, atol=1e-5)


def test_under_vllms_batch_invariant_mode_every_step_samples_on_the_triton_prop(backend, monkeypatch):
    """VLLM_BATCH_INVARIANT=1: the default dense_below gives way (a short step is sampled, no gate) and the decoder's plans
    run the Triton prop (whose samples are the same alone or batched: tests/kernels/test_request_keys.py)."""
    monkeypatch.delenv("SANTA_VLLM_DENSE_BELOW")  # the default, 8192: would make these steps FlashAttention's
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "24")
    monkeypatch.setattr(backend.envs, "VLLM_BATCH_INVARIANT", True)
    monkeypatch.setattr(backend, "capturing_a_graph", lambda: True)
    batch = make_batch([90, 50], [1, 1], seed=2)
    out, metadata, _ = step(backend, batch, MockLayer(LAYER), config=vllm_config(max_model_len=8192))
    assert metadata.santa.gate is None and not metadata.santa.dense and FlashAttentionImpl.calls == 0
    assert metadata.santa.decoder.tuning.one_launch is False
    torch.testing.assert_close(out, santas_decode(batch, 24), rtol=1e-5, atol=1e-6)


def test_under_vllms_batch_invariant_mode_a_dense_below_is_refused_at_start(backend, monkeypatch):
    monkeypatch.setenv("SANTA_VLLM_DENSE_BELOW", "4096")
    monkeypatch.setattr(backend.envs, "VLLM_BATCH_INVARIANT", True)
    with pytest.raises(ValueError, match="dense_below must be 0 under VLLM_BATCH_INVARIANT=1"):
        backend.SantaMetadataBuilder(kv_cache_spec(), [LAYER], vllm_config(), DEVICE)


def test_the_default_dense_below_follows_the_models_head_shape(backend, monkeypatch):
    """The builder asks santa.vllm.config for its shape's default (d and query heads per KV head, as vLLM reports them):
    a shape with a measured default gets it, any other 8192; an explicit dense_below wins over both."""
    import santa.vllm.config as config

    monkeypatch.delenv("SANTA_VLLM_DENSE_BELOW")
    build = lambda: backend.SantaMetadataBuilder(kv_cache_spec(), [LAYER], vllm_config(max_model_len=8192), DEVICE)  # noqa: E731
    assert build().dense_below == config.DENSE_BELOW == 8192  # the stand-ins' shape (d = 32, G = 4) was never measured
    monkeypatch.setitem(config.DENSE_BELOW_BY_SHAPE, (HEAD_DIM, HEADS // KV_HEADS), 64)
    assert build().dense_below == 64
    monkeypatch.setenv("SANTA_VLLM_DENSE_BELOW", "80")
    assert build().dense_below == 80
