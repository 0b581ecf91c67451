"""santa as a vLLM 0.26 attention backend (``attention_backend="CUSTOM"``, registered by
:mod:`santa.vllm.plugin`).

It is vLLM's FlashAttention backend with one change: a batch of decode tokens only (every request
adds one token, ``max_query_len == 1``) runs santa's kernel (:class:`santa.vllm.decode.PagedDecoder`)
on the same paged cache, whatever its sequences' lengths (so eager steps and CUDA-graph replays
agree); prefill and mixed batches, and every batch under ``SANTA_VLLM_KERNEL=dense`` (the exact
control), run FlashAttention itself. The cache layout, its writes (``reshape_and_cache_flash``, fp8
included) and the metadata are FlashAttention's. Decode-only batches are captured in full CUDA graphs
(``UNIFORM_SINGLE_TOKEN_DECODE``); santa's plans are made once per batch size over one workspace and
read the lengths, block table and positions from device memory. Settings: :mod:`santa.vllm.config`.

Memory: santa's workspace (:func:`santa.kernels.workspace_bytes` for ``max_num_seqs`` sequences of
``max_model_len`` keys: 35 MiB at 64 × 4k, 1.06 GiB at 256 × 32k for Llama-3.1-8B's heads) is allocated
when the metadata builder starts, after vLLM has sized its KV cache: leave that much room
(``gpu_memory_utilization``); the builder logs it, and running out names what to lower.

Refused at selection (vLLM's own check): sliding windows, sinks, MLA, encoder and cross attention,
per-head query/KV quantisation scales; decode context parallelism is refused by vLLM's own assertion
(santa returns no log-sum-exp).

Randomness: a decode token's draws are keyed on (santa's seed, the layer, the head, the token's position in
its sequence) (:mod:`santa.vllm.decode`); the head is the model's global head under tensor parallelism (the rank's
first head, ``tp_rank × local heads`` from vLLM's parallel state, 0 where that is not initialised, is the decoder's
``head_offset``), so TP = 1, 2, 4 draw the same samples; the layer is :func:`santa.vllm.layers.layer_index` of the layer's
vLLM name (its index for every layer vLLM builds; a stable key from the name, or from no name, for a layer
such as vLLM's own test mock, which has none), read once per implementation.

Run inside vLLM 0.26.0 on the H200 (offline ``LLM.generate`` with CUDA graphs, bf16 and fp8 caches, random
and real weights: benchmarks/RESULTS.md, "Standing: inside vLLM"). ``benchmarks/vllm/backend_test.py`` runs
vLLM's own backend test file (``tests/v1/attention/test_attention_backends.py``) against it. Importing this
module without vLLM raises an ImportError that names the install command (:data:`santa.vllm.plugin.INSTALL`).
"""

from __future__ import annotations

import logging
import math

import torch

from santa.vllm.plugin import INSTALL

try:
    from vllm.v1.attention.backend import AttentionCGSupport, AttentionType
    from vllm.v1.attention.backends.flash_attn import (
        FlashAttentionBackend,
        FlashAttentionImpl,
        FlashAttentionMetadataBuilder,
    )
except ImportError as error:  # vLLM absent (ModuleNotFoundError), or an install that cannot import its backend
    raise ImportError(f"santa's vLLM backend needs vLLM 0.26 ({INSTALL}): {error}") from error
try:  # after the attention modules (a broken install names those first): the tensor-parallel rank
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
except ImportError as error:
    raise ImportError(f"santa's vLLM backend needs vLLM 0.26 ({INSTALL}): {error}") from error

from santa.vllm.config import read_config
from santa.vllm.decode import FP8, PagedDecoder
from santa.vllm.layers import check_layer, layer_index

logger = logging.getLogger("vllm.santa")  # under vLLM's logger, the one vLLM gives a handler ("santa.vllm…" prints nothing)


def tensor_parallel_rank() -> int:
    """This process's rank in vLLM's tensor-parallel group (``get_tensor_model_parallel_rank``), or 0 where vLLM's
    parallel state is not initialised (a builder made outside an engine, e.g. by vLLM's own backend tests: one
    process holding every head). vLLM 0.26 asserts the group exists (``get_tp_group``); under ``python -O`` the
    missing group is an AttributeError instead."""
    try:
        return int(get_tensor_model_parallel_rank())
    except (AssertionError, AttributeError):
        return 0


class SantaMetadataBuilder(FlashAttentionMetadataBuilder):
    """FlashAttention's metadata, plus the model's :class:`PagedDecoder` (one for every layer of the group)."""

    _cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    reorder_batch_threshold = 1  # the V1 runner puts decode requests first (V2 always does)

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        config, model, parallel = read_config(), vllm_config.model_config, vllm_config.parallel_config
        block_size = kv_cache_spec.block_size
        # this group's cache (layers in --kv-cache-dtype-skip-layers have their own group in the model's dtype)
        fp8 = kv_cache_spec.dtype in (torch.uint8, FP8)
        # tensor parallelism: this rank holds heads [rank·H, (rank + 1)·H) of the model (H = its own count); the draws
        # are keyed on the global head, so TP = 1, 2, 4 draw the same samples (KV heads replicated past TP > H_kv too)
        heads = model.get_num_attention_heads(parallel)
        self.santa = PagedDecoder(
            heads=heads, kv_heads=model.get_num_kv_heads(parallel), head_offset=tensor_parallel_rank() * heads,
            head_dim=model.get_head_size(), block_size=block_size,
            max_keys=math.ceil(model.max_model_len / block_size) * block_size,
            max_batch=vllm_config.scheduler_config.max_num_seqs, budget=config.budget,
            kernel=config.kernel if config.samples else "prop", seed=config.seed, dtype=model.dtype,
            kv_dtype=FP8 if fp8 else model.dtype, device=device,
        )
        if config.samples:
            logger.info("santa: %s S=%d on decode-only batches (query heads %d–%d of the model); its workspace takes %.2f GiB, "
                        "allocated now, outside the KV cache's budget (lower gpu_memory_utilization by as much where memory "
                        "is tight)", config.kernel, config.budget, self.santa.head_offset, self.santa.head_offset + heads - 1,
                        self.santa.workspace_nbytes() / 2**30)
            self.santa.allocate()  # now, outside any CUDA-graph capture

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        metadata.santa = self.santa
        metadata.santa_positions = self.santa.positions(metadata.seq_lens)  # once per step, for every layer
        return metadata


class SantaAttentionImpl(FlashAttentionImpl):
    """FlashAttention's implementation; decode-only batches go to santa (:meth:`forward`)."""

    can_return_lse_for_decode = False  # santa's decode returns no log-sum-exp: vLLM refuses decode context parallelism

    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                 logits_soft_cap=None, attn_type=AttentionType.DECODER, kv_sharing_target_layer_name=None, sinks=None,
                 **extra):
        check_layer(alibi_slopes=alibi_slopes, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                    attn_type=attn_type, sinks=sinks, extra=extra)
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                         logits_soft_cap, attn_type, kv_sharing_target_layer_name)
        self.santa_config = read_config()
        self.layer_index: int | None = None

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None):
        decoder = getattr(attn_metadata, "santa", None)
        if (decoder is None or not self.santa_config.samples or attn_metadata.max_query_len != 1
                or output_scale is not None or output_block_scale is not None):
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale)
        if self.layer_index is None:  # once per layer: the name never changes (a mock layer may have none)
            name = getattr(layer, "layer_name", None)
            self.layer_index = layer_index(name)
            if self.layer_index == 0:  # once per engine (and per graph capture): santa's decode did run
                logger.info("santa: layer 0 decodes %d sequences with %s S=%d", attn_metadata.num_actual_tokens,
                            self.santa_config.kernel, self.santa_config.budget)
            elif self.layer_index < 0:
                logger.info("santa: attention layer %r has no layer index in its name; its draws are keyed on %d "
                            "(santa.vllm.layers.layer_index)", name, self.layer_index)
        n = attn_metadata.num_actual_tokens
        q = query[:n]
        if q.dtype != output.dtype:  # an fp8 cache: the layer quantised q for FlashAttention (with its _q_scale)
            q = (q.float() * layer._q_scale).to(output.dtype)
        # the runner's table may be wider than max_model_len (the V2 runner rounds it up to 128 keys): unused columns
        table = attn_metadata.block_table[:n, : decoder.max_keys // decoder.block_size]
        decoder.run(q, kv_cache, seq_lens=attn_metadata.seq_lens[:n], block_table=table,
                    layer=self.layer_index, scale=self.scale, out=output[:n], k_scale=layer._k_scale,
                    v_scale=layer._v_scale, positions=attn_metadata.santa_positions[:n])
        return output


class SantaAttentionBackend(FlashAttentionBackend):
    """vLLM's ``CUSTOM`` backend: FlashAttention's layout and prefill, santa's decode. Decoder
    self-attention only (no sliding windows, sinks, encoder or cross attention, MLA)."""

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return SantaAttentionImpl

    @staticmethod
    def get_builder_cls():
        return SantaMetadataBuilder

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return False

    @classmethod
    def supports_sink(cls) -> bool:
        return False

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_per_head_quant_scales(cls) -> bool:
        return False  # santa dequantises q with one scale


__all__ = ["SantaAttentionBackend", "SantaAttentionImpl", "SantaMetadataBuilder"]
