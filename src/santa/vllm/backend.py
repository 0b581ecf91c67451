"""santa as a vLLM 0.26 attention backend (``attention_backend="CUSTOM"``, registered by
:mod:`santa.vllm.plugin`).

It is vLLM's FlashAttention backend with one change: decode tokens (requests that add one token this step)
run santa's kernel (:class:`santa.vllm.decode.PagedDecoder`) on the same paged cache, whatever their sequences'
lengths (so eager steps and CUDA-graph replays agree). A mixed step (chunked prefill puts new requests' prompt
chunks beside the running requests' decode tokens) is split as vLLM's FlashInfer and MLA backends split it: the
runner puts decode requests first (``reorder_batch_threshold = 1``), vLLM's ``split_decodes_and_prefills`` finds
the boundary, the decode rows go to santa and the rest to FlashAttention with metadata built for those rows alone
(``split_attn_metadata``: no cascade for them). The decode rows of an eager step run on the plan made at start-up
for the next batch size vLLM captures (rows past them empty: ``SantaStep.rows``), so a running server makes no plan and
compiles no kernel (a count past the largest captured size still makes its own). Prefill-only batches, and every batch under
``SANTA_VLLM_KERNEL=dense`` (the exact control), run FlashAttention itself.

Short steps run FlashAttention too (``dense_below``; by default by the model's head shape,
:func:`santa.vllm.config.default_dense_below`: 1,024 keys at Llama-3.1-8B's, 8,192 elsewhere): a step whose
longest sequence holds fewer keys is computed exactly by FlashAttention, where santa's kernels lose to it. Eager steps
decide on the host (``max_seq_len``). A captured decode graph holds both kernels, FlashAttention first: the builder
writes, before each replay, a device int that santa's launch reads (0: it returns at once, writing nothing; prop's
gate, :meth:`santa.kernels.DecodePlan.run`'s ``enabled``) and FlashAttention's lengths (``seqused_k``: the step's own
on a short step, zeros on a sampled one, so that it reads no key and santa overwrites its rows), so a replay runs
the one that the step's lengths pick. The cache layout, its writes (``reshape_and_cache_flash``, fp8
included) and the metadata are FlashAttention's. Decode-only batches are captured in full CUDA graphs
(``UNIFORM_SINGLE_TOKEN_DECODE``); santa's plans are made once per batch size over one workspace and
read the lengths, block table and positions from device memory. Settings: :mod:`santa.vllm.config` (vLLM's
``--additional-config '{"santa": {...}}'`` or ``SANTA_VLLM_*`` variables), validated and logged with their sources when
the metadata builder starts.

Memory: santa's workspace (:func:`santa.kernels.workspace_bytes` for ``max_num_seqs`` sequences of
``max_model_len`` keys: 35 MiB at 64 × 4k, 1.06 GiB at 256 × 32k for Llama-3.1-8B's heads) is allocated
when the metadata builder starts, after vLLM has sized its KV cache: leave that much room
(``gpu_memory_utilization``); the builder logs it, and running out names what to lower.

Under vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``; the backend inherits FlashAttention's support of it, and
FlashAttention's parts follow it) every decode step is sampled (``dense_below`` 0: a short step's route follows the
batch's longest sequence) by the Triton prop, whose samples are the same alone or batched
(:func:`santa.vllm.config.batch_invariant_config`).

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

import dataclasses
import logging
import math
from dataclasses import dataclass, field

import torch

from santa.vllm.plugin import INSTALL

try:
    from vllm.v1.attention.backend import AttentionCGSupport, AttentionType
    from vllm.v1.attention.backends.flash_attn import (
        FlashAttentionBackend,
        FlashAttentionImpl,
        FlashAttentionMetadata,
        FlashAttentionMetadataBuilder,
    )
except ImportError as error:  # vLLM absent (ModuleNotFoundError), or an install that cannot import its backend
    raise ImportError(f"santa's vLLM backend needs vLLM 0.26 ({INSTALL}): {error}") from error
try:  # after the attention modules (a broken install names those first): the tensor-parallel rank, the batch split
    from vllm import envs
    from vllm.config import get_current_vllm_config_or_none
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills
    from vllm.v1.worker.ubatch_utils import UBatchSlice, split_attn_metadata
except ImportError as error:
    raise ImportError(f"santa's vLLM backend needs vLLM 0.26 ({INSTALL}): {error}") from error

from santa.kernels import BATCH_INVARIANT
from santa.vllm.config import batch_invariant_config, describe, read_config
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


def capturing_a_graph() -> bool:
    """Whether this forward call is being captured into a CUDA graph (vLLM's full decode graphs; a replay calls no
    Python), rather than run eagerly (eager mode, piecewise graphs: attention runs between the pieces)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@dataclass(frozen=True)
class MixedSplit:
    """A mixed step as santa runs it: its first ``decodes`` requests decode one token each (tokens ``[0, decodes)``) with
    santa; ``prefill`` is FlashAttention's metadata of the other requests alone (tokens from ``decodes`` on), which
    runs after santa and so rewrites whatever santa wrote past its rows (:meth:`SantaStep.rows`)."""

    decodes: int
    prefill: object


@dataclass(frozen=True)
class DecodeRows:
    """The rows santa's launch runs on for ``decodes`` decode requests: ``rows`` ≥ ``decodes``
    (:meth:`santa.vllm.decode.PagedDecoder.padded_batch`, a plan made at start-up), those past ``decodes`` empty."""

    rows: int
    seq_lens: torch.Tensor  # int32 [rows]: the decode requests' lengths, then zeros (length 0: output 0, no page read)
    positions: torch.Tensor  # int32 [rows]: seq_lens − 1, 0 on the empty rows
    block_table: torch.Tensor  # int32 [rows, width]: the decode requests' rows of the table, then any (never followed)


@dataclass(frozen=True)
class SantaStep:
    """What santa adds to one step's FlashAttention metadata (``metadata.santa``): the model's decoder, each row's
    position (computed once per step for every layer) and, for a mixed step, its split."""

    decoder: PagedDecoder
    positions: torch.Tensor  # int32 [rows]: seq_lens − 1
    seq_lens: torch.Tensor  # int32 [rows]: the step's lengths (the metadata's seq_lens are FlashAttention's on a gated step)
    dense: bool  # the step's longest sequence is shorter than dense_below: FlashAttention's (eager steps)
    gate: torch.Tensor | None  # int32 [1]: santa's launch runs while it is 1 (decode-only steps under dense_below > 0)
    split: MixedSplit | None
    padded: dict = field(default_factory=dict, compare=False, repr=False)  # DecodeRows by count, made by the first layer

    def rows(self, decodes: int, block_table: torch.Tensor) -> DecodeRows:
        """The rows of this step's ``decodes`` decode requests (the first ones), padded to the next batch size whose plan
        was made at start-up, so that an eager step (a mixed one, or a decode count without a captured graph) makes no
        plan and compiles no kernel while a server runs (vLLM 0.26 warned of three such compiles in Qwen2.5-0.5B's mixed
        workload, whose mean TPOT was then 2.27× FLASH_ATTN's; H100, 2026-12-05). Made by the first layer that asks, once
        per step (a captured graph's replay asks nothing); a count that is a prepared size takes views, no copy."""
        if decodes not in self.padded:
            rows = self.decoder.padded_batch(decodes)
            if rows == decodes:
                made = DecodeRows(rows, self.seq_lens[:rows], self.positions[:rows], block_table[:rows])
            else:
                seq_lens = torch.zeros(rows, dtype=torch.int32, device=self.seq_lens.device)
                seq_lens[:decodes] = self.seq_lens[:decodes]
                table = block_table[:rows]
                if table.shape[0] < rows:  # fewer requests than rows: the empty rows' table rows are zeros
                    table = torch.cat([table, table.new_zeros(rows - table.shape[0], table.shape[1])])
                made = DecodeRows(rows, seq_lens, (seq_lens - 1).clamp_min_(0), table)
            self.padded[decodes] = made
        return self.padded[decodes]


@dataclass
class SantaMetadata(FlashAttentionMetadata):
    """FlashAttention's metadata of one step plus santa's (:class:`SantaStep`): a field, not an attribute set on vLLM's
    object, so a copy of the metadata (``dataclasses.replace``) keeps it; ``None`` (a copy made without it) runs
    FlashAttention."""

    santa: SantaStep | None = None


FLASH_FIELDS = tuple(f.name for f in dataclasses.fields(FlashAttentionMetadata) if f.init)  # what SantaMetadata copies


class SantaMetadataBuilder(FlashAttentionMetadataBuilder):
    """FlashAttention's metadata as :class:`SantaMetadata`, whose :class:`SantaStep` holds the model's
    :class:`PagedDecoder` (one for every layer of the group), the rows' positions, the gate of short steps and a mixed
    step's split."""

    _cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    reorder_batch_threshold = 1  # the V1 runner puts decode requests first (V2 always does)
    # no reuse of another KV-cache group's metadata (vLLM's update_block_table): build() writes this builder's own gate,
    # FlashAttention lengths and positions every step, which a reused group's captured layers read
    supports_update_block_table = False

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        additional = getattr(vllm_config, "additional_config", None)
        config, model, parallel = read_config(additional_config=additional), vllm_config.model_config, vllm_config.parallel_config
        # vLLM's batch-invariant mode (FlashAttention's parts, inherited, follow it already): no short steps, and the
        # Triton prop, whose samples are the same alone or batched (the one launch's CDF follows its slices)
        invariant = bool(envs.VLLM_BATCH_INVARIANT)
        if invariant:
            config = batch_invariant_config(config)
        # tensor parallelism: this rank holds heads [rank·H, (rank + 1)·H) of the model (H = its own count); the draws
        # are keyed on the global head, so TP = 1, 2, 4 draw the same samples (KV heads replicated past TP > H_kv too)
        heads, kv_heads = model.get_num_attention_heads(parallel), model.get_num_kv_heads(parallel)
        shape = {"head_dim": model.get_head_size(), "group": heads // kv_heads}  # dense_below's default follows it
        self.dense_below = config.short_steps(**shape)  # decode steps shorter than this (keys) run FlashAttention; 0: never
        block_size = kv_cache_spec.block_size
        # this group's cache (layers in --kv-cache-dtype-skip-layers have their own group in the model's dtype)
        fp8 = kv_cache_spec.dtype in (torch.uint8, FP8)
        # no gate where no step can reach dense_below (max_model_len below it): every decode step is FlashAttention's
        gated = self.dense_below > 0 and model.max_model_len >= self.dense_below
        self.santa = PagedDecoder(
            heads=heads, kv_heads=kv_heads, head_offset=tensor_parallel_rank() * heads,
            head_dim=shape["head_dim"], block_size=block_size,
            max_keys=math.ceil(model.max_model_len / block_size) * block_size,
            max_batch=vllm_config.scheduler_config.max_num_seqs, budget=config.budget,
            kernel=config.kernel if config.samples else "prop", seed=config.seed, dtype=model.dtype,
            kv_dtype=FP8 if fp8 else model.dtype, device=device, error_target=config.error_target, gated=gated,
            tuning=BATCH_INVARIANT if invariant else None,
        )
        logger.info("santa: %s%s", describe(config, additional_config=additional, **shape),
                    "; VLLM_BATCH_INVARIANT=1: every decode step sampled by the Triton prop (dense_below 0)" if invariant else "")
        # the gate and FlashAttention's lengths of gated decode steps: buffers that keep their addresses (graphs)
        rows = max(vllm_config.scheduler_config.max_num_seqs,
                   getattr(getattr(vllm_config, "compilation_config", None), "max_cudagraph_capture_size", None) or 0)
        self.gate = torch.ones(1, dtype=torch.int32, device=device) if gated else None
        self.dense_lens = torch.zeros(rows, dtype=torch.int32, device=device) if gated else None
        if self.dense_below and not gated:
            logger.info("santa: max_model_len %d < dense_below %d: FlashAttention decodes every step", model.max_model_len,
                        self.dense_below)
        self.samples = config.samples and (gated or not self.dense_below)  # else FlashAttention decodes every step
        if not self.samples:  # no step to split: the runner need not reorder each step's requests (FlashAttention's own
            self.reorder_batch_threshold = None  # builder asks for none; vLLM reads the builder's value after it is made)
        if self.samples:
            self.santa.allocate()  # now, outside any CUDA-graph capture
            # the plans of the batch sizes vLLM captures, made before its captures (the layers' usual scale, 1/√d); an eager
            # step's decode count pads to the next of them (SantaStep.rows). Not to max_num_seqs past the largest: 513 rows
            # padded to 1,024 would run twice the empty rows (a plan's cost follows its batch, issue 39), so such a count
            # makes its own plan at run time, as before
            sizes = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_capture_sizes", None) or ()
            self.santa.prepare(sizes, model.get_head_size() ** -0.5)
            logger.info("santa: %s S=%d on decode-only steps%s (query heads %d–%d of the model); its workspace takes %.2f GiB, "
                        "allocated now, outside the KV cache's budget (lower gpu_memory_utilization by as much where memory "
                        "is tight)", config.kernel, config.budget,
                        f" whose longest sequence holds ≥ {self.dense_below} keys (shorter: FlashAttention)" if gated else "",
                        self.santa.head_offset, self.santa.head_offset + heads - 1,
                        (self.santa.workspace_nbytes() + self.santa.one_launch_nbytes()) / 2**30)

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        seq_lens = flash_lens = metadata.seq_lens
        dense = self.dense_below > 0 and common_attn_metadata.max_seq_len < self.dense_below
        gate = None
        if self.gate is not None and common_attn_metadata.max_query_len == 1 and seq_lens.shape[0] <= self.dense_lens.shape[0]:
            # a decode-only step (a captured graph may replay it): the gate, and FlashAttention's lengths in a buffer of
            # santa's, which the metadata now names (its own on a dense step, zeros on a sampled one)
            gate = self.gate
            gate.fill_(0 if dense else 1)
            self.dense_lens.zero_()  # all of it: a graph captured for more rows than this step's reads the rest
            flash_lens = self.dense_lens[: seq_lens.shape[0]]
            if dense:
                flash_lens.copy_(seq_lens)
        # the split is built after the full metadata: FlashAttention's builder keeps one AOT-schedule buffer, and a split
        # step reads the prefill part's (a dense step has none: FlashAttention takes it whole)
        step = SantaStep(decoder=self.santa, positions=self.santa.positions(seq_lens), seq_lens=seq_lens, dense=dense,
                         gate=gate, split=None if dense else self.split(common_attn_metadata, fast_build))
        fields = {name: getattr(metadata, name) for name in FLASH_FIELDS}
        return SantaMetadata(**{**fields, "seq_lens": flash_lens}, santa=step)

    def split(self, common, fast_build=False) -> MixedSplit | None:
        """A mixed step's split (decode requests first, as the runner orders them), or None: a decode-only or
        prefill-only step, or santa off (``kernel="dense"``)."""
        if not self.samples or common.max_query_len <= 1:
            return None
        decodes, prefills, decode_tokens, _ = split_decodes_and_prefills(common, decode_threshold=1)
        if decodes == 0 or prefills == 0:
            return None
        rest = UBatchSlice(request_slice=slice(decodes, common.num_reqs),
                           token_slice=slice(decode_tokens, common.num_actual_tokens))
        return MixedSplit(decodes=decodes, prefill=super().build(0, split_attn_metadata([rest], common)[0], fast_build))


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
        current = get_current_vllm_config_or_none()  # set while vLLM builds the model's layers
        self.santa_config = read_config(additional_config=getattr(current, "additional_config", None))
        self.layer_index: int | None = None

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None):
        step = attn_metadata.santa if isinstance(attn_metadata, SantaMetadata) else None  # None: the profiling run
        split = None if step is None else step.split
        gated = step is not None and step.gate is not None and capturing_a_graph()  # a graph that replays both, gated
        if (step is None or not self.santa_config.samples or (attn_metadata.max_query_len != 1 and split is None)
                or (step.dense and not gated) or output_scale is not None or output_block_scale is not None):
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale)
        if gated:  # FlashAttention first (zero lengths on a sampled step), then santa's launch (returns on a dense one)
            super().forward(layer, query, key, value, kv_cache, attn_metadata, output)
        decoder, n = step.decoder, attn_metadata.num_actual_tokens if split is None else split.decodes  # one token per request
        if self.layer_index is None:  # once per layer: the name never changes (a mock layer may have none)
            name = getattr(layer, "layer_name", None)
            self.layer_index = layer_index(name)
            if self.layer_index == 0:  # once per engine (and per graph capture): santa's decode did run
                target = self.santa_config.error_target
                logger.info("santa: layer 0 decodes %d sequences with %s S=%d%s", n, self.santa_config.kernel,
                            self.santa_config.budget, "" if target is None else f" (the cap; error target ε={target:g})")
            elif self.layer_index < 0:
                logger.info("santa: attention layer %r has no layer index in its name; its draws are keyed on %d "
                            "(santa.vllm.layers.layer_index)", name, self.layer_index)
        # padded to a plan made at start-up; the query's and output's rows past n are the prefill tokens' (or the runner's
        # padding): santa reads them as empty rows and FlashAttention then rewrites the prefill rows
        padded = step.rows(n, attn_metadata.block_table)
        rows, seq_lens, positions, table = padded.rows, padded.seq_lens, padded.positions, padded.block_table
        q = query[:rows] if rows <= query.shape[0] else query[:n]
        if q.dtype != output.dtype:  # an fp8 cache: the layer quantised q for FlashAttention (with its _q_scale)
            q = (q.float() * layer._q_scale).to(output.dtype)
        if q.shape[0] < rows:  # fewer tokens than rows (a step of few prefill tokens): empty rows of zeros
            q = torch.cat([q, q.new_zeros(rows - n, *q.shape[1:])])
        out = output[:rows] if rows <= output.shape[0] else output.new_empty(rows, *output.shape[1:])
        # the runner's table may be wider than max_model_len (the V2 runner rounds it up to 128 keys): unused columns
        decoder.run(q, kv_cache, seq_lens=seq_lens, block_table=table[:, : decoder.max_keys // decoder.block_size],
                    layer=self.layer_index, scale=self.scale, out=out, k_scale=layer._k_scale,
                    v_scale=layer._v_scale, positions=positions, enabled=step.gate if gated else None)
        if out.data_ptr() != output.data_ptr():
            output[:n].copy_(out[:n])
        if split is not None:  # the prefill rows: FlashAttention on their own metadata (the query as the layer gave it)
            end = attn_metadata.num_actual_tokens
            super().forward(layer, query[n:end], key[n:end], value[n:end], kv_cache, split.prefill, output[n:end])
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
