"""santa under vLLM tensor parallelism (issue 43), no vLLM needed: each rank holds H/TP query heads and their KV heads
(replicated once TP passes H_kv, as vLLM does), and its decoder keys the draws on the model's global heads
(``head_offset = tp_rank × H/TP``), so TP = 1, 2, 4 decode the same samples: santa's decoder as the backend calls it
(:meth:`santa.vllm.decode.PagedDecoder.run`, bf16 and fp8 caches, prop and flash, Triton's interpreter and the torch
fallback) and the metadata builder and ``forward`` over the stand-ins, which read the rank from vLLM's parallel state
(rank 0 where it is not initialised)."""

import math

import pytest
import torch

from helpers import CUDA, DEVICE, KERNELS, make_inputs, to_paged
from santa.vllm.decode import PagedDecoder
from vllm_stand_ins import HEAD_DIM, HEADS, KV_HEADS, MockLayer, ParallelState, kv_cache_spec, make_batch, vllm_config

BLOCK, BUDGET = 16, 16
FP8 = torch.float8_e4m3fn
SCALE = 1 / math.sqrt(HEAD_DIM)


def packed(k_pages: torch.Tensor, v_pages: torch.Tensor) -> torch.Tensor:
    """K and V pages [nb, bs, H_kv, D] as vLLM 0.26's FlashAttention cache: physical [nb, bs, H_kv, 2D], logical
    (nb, H_kv, bs, 2D)."""
    return torch.cat([k_pages, v_pages], dim=-1).permute(0, 2, 1, 3)


def rank_heads(tp: int, rank: int) -> tuple[slice, slice]:
    """Rank ``rank``'s query heads and KV heads (one replicated KV head per rank once tp > H_kv, as in vLLM)."""
    heads = slice(rank * HEADS // tp, (rank + 1) * HEADS // tp)
    kv = rank * KV_HEADS // tp if tp > KV_HEADS else None
    return heads, slice(kv, kv + 1) if kv is not None else slice(rank * KV_HEADS // tp, (rank + 1) * KV_HEADS // tp)


def decoder(kernel: str, kv_dtype: torch.dtype, tp: int = 1, head_offset: int = 0) -> PagedDecoder:
    return PagedDecoder(heads=HEADS // tp, kv_heads=max(1, KV_HEADS // tp), head_dim=HEAD_DIM, block_size=BLOCK, max_keys=96,
                        max_batch=4, budget=BUDGET, kernel=kernel, seed=11, dtype=torch.bfloat16, kv_dtype=kv_dtype,
                        device=DEVICE, head_offset=head_offset)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_rank_decodes_its_heads_as_one_gpu_decodes_them(decode_path, kernel, cache, tp):
    """santa's decode step as the backend calls it, once with every head and once per rank on its slice of the query
    and of the packed cache (TP = 4: KV heads replicated, two ranks per KV head): the same outputs."""
    q, k, v = make_inputs(3, HEADS, KV_HEADS, HEAD_DIM, 90, seed=40 + tp, device="cpu")
    q = q.bfloat16().to(DEVICE)
    if cache == "fp8":  # vLLM's uint8 storage of e4m3 values, dequantised with the layer's 0-d scales
        k_scale, v_scale = torch.tensor(0.25, device=DEVICE), torch.tensor(0.5, device=DEVICE)
        k, v = (k / 0.25).to(FP8).view(torch.uint8), (v / 0.5).to(FP8).view(torch.uint8)
        scales, kv_dtype = dict(k_scale=k_scale, v_scale=v_scale), FP8
    else:
        k, v, scales, kv_dtype = k.bfloat16(), v.bfloat16(), {}, torch.bfloat16
    k_pages, table = to_paged(k.to(DEVICE), BLOCK, seed=5)
    v_pages, _ = to_paged(v.to(DEVICE), BLOCK, seed=5)
    cache_ = packed(k_pages, v_pages)
    seq_lens = torch.tensor([90, 61, 33], dtype=torch.int32, device=DEVICE)
    step = dict(seq_lens=seq_lens, block_table=table, layer=2, scale=SCALE, **scales)
    whole = decoder(kernel, kv_dtype).run(q, cache_, out=torch.empty_like(q), **step)
    parts = []
    for rank in range(tp):
        heads, kv = rank_heads(tp, rank)
        part = q[:, heads].contiguous()
        run = decoder(kernel, kv_dtype, tp, head_offset=rank * HEADS // tp)
        parts.append(run.run(part, cache_[:, kv], out=torch.empty_like(part), **step))
    if CUDA:
        torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-2, atol=1e-3)
    else:
        assert torch.equal(torch.cat(parts, dim=1), whole)  # bitwise: each head's work is its own at these shapes
    # without its offset, rank 1 draws rank 0's uniforms for its heads: other samples than one GPU's
    heads, kv = rank_heads(tp, 1)
    unkeyed = decoder(kernel, kv_dtype, tp).run(q[:, heads].contiguous(), cache_[:, kv], out=torch.empty_like(q[:, heads]),
                                                **step)
    assert not torch.equal(unkeyed, whole[:, heads])


def test_the_decoder_refuses_a_bad_head_offset_by_name():
    with pytest.raises(TypeError, match="head_offset"):
        decoder("prop", torch.bfloat16, head_offset=1.0)
    with pytest.raises(ValueError, match="head_offset"):
        decoder("prop", torch.bfloat16, head_offset=-4)
    assert decoder("prop", torch.bfloat16).head_offset == 0


def rank_step(backend, batch, *, tp: int, rank: int | None, monkeypatch, layer):
    """One layer's decode step on rank ``rank`` of ``tp`` (None: vLLM's parallel state not initialised) as vLLM's
    runner takes it: the rank's builder and implementation, its query heads and its slice of the written cache."""
    monkeypatch.setattr(ParallelState, "rank", rank)
    heads, kv = rank_heads(tp, rank or 0)
    builder = backend.SantaMetadataBuilder(kv_cache_spec(), ["model.layers.1.self_attn.attn"],
                                           vllm_config(tensor_parallel_size=tp), DEVICE)
    metadata = builder.build(0, batch.common)
    impl = backend.SantaAttentionImpl(num_heads=HEADS // tp, head_size=HEAD_DIM, scale=SCALE,
                                      num_kv_heads=max(1, KV_HEADS // tp), alibi_slopes=None, sliding_window=None,
                                      kv_cache_dtype="auto", attn_type="decoder")
    query = batch.query[:, heads].contiguous()
    output = torch.full(query.shape, float("nan"), device=DEVICE)
    impl.forward(layer, query, batch.key[:, kv], batch.value[:, kv], batch.kv_cache[:, kv], metadata, output=output)
    return output, builder.santa


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_backend_keys_each_rank_on_its_global_heads(backend, monkeypatch, decode_path, kernel):
    """The builder reads the rank from vLLM's parallel state: head_offset = tp_rank × H/TP; the ranks' forwards give
    the TP = 1 step's output, with sampled (not covered) sequences."""
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "24")
    monkeypatch.setenv("SANTA_VLLM_KERNEL", kernel)
    batch = make_batch([90, 50], [1, 1], seed=8)
    layer = MockLayer("model.layers.1.self_attn.attn")
    from vllm_stand_ins import FlashAttentionImpl

    FlashAttentionImpl(HEADS, HEAD_DIM, SCALE, KV_HEADS, None, None, "auto").do_kv_cache_update(
        layer, batch.key, batch.value, batch.kv_cache, batch.common.slot_mapping)  # the step's new K/V, every head
    whole, santa = rank_step(backend, batch, tp=1, rank=None, monkeypatch=monkeypatch, layer=layer)
    assert santa.head_offset == 0  # no parallel state: one process holds every head
    assert (whole - batch.exact(SCALE)).abs().max() > 1e-3  # S < the keys: sampled
    parts = []
    for rank in range(2):
        out, santa = rank_step(backend, batch, tp=2, rank=rank, monkeypatch=monkeypatch, layer=layer)
        assert (santa.heads, santa.kv_heads, santa.head_offset) == (HEADS // 2, KV_HEADS // 2, rank * HEADS // 2)
        parts.append(out)
    if CUDA:
        torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-5, atol=1e-6)
    else:
        assert torch.equal(torch.cat(parts, dim=1), whole)
    assert FlashAttentionImpl.calls == 0  # santa decoded every step


def test_rank_0_and_an_uninitialised_parallel_state_give_offset_0(backend, monkeypatch):
    for rank in (None, 0):
        monkeypatch.setattr(ParallelState, "rank", rank)
        assert backend.tensor_parallel_rank() == 0
    monkeypatch.setattr(ParallelState, "rank", 3)
    assert backend.tensor_parallel_rank() == 3
    builder = backend.SantaMetadataBuilder(kv_cache_spec(), ["layer"], vllm_config(tensor_parallel_size=4), DEVICE)
    assert (builder.santa.heads, builder.santa.kv_heads, builder.santa.head_offset) == (2, 1, 6)
