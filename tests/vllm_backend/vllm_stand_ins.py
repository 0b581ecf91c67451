"""Stand-ins for the part of vLLM 0.26.0 that santa's backend builds on, so that its metadata builder and
``forward`` run here as vLLM runs them, with no vLLM installed (CI has none); the ``backend`` fixture
(conftest.py) loads santa's backend over them.

:func:`load_backend` executes ``src/santa/vllm/backend.py`` as a fresh module while ``sys.modules`` holds
the stand-ins below for the five vLLM modules it imports (and their parents), then puts ``sys.modules``
back: the real vLLM, where it is installed, is neither replaced nor touched. The stand-ins keep vLLM
0.26.0's names, signatures and the metadata fields santa reads (``FlashAttentionMetadata``,
``CommonAttentionMetadata``, ``FlashAttentionImpl.forward`` / ``do_kv_cache_update``, the packed cache
``(num_blocks, H_kv, block_size, 2·D)``); their FlashAttention is exact causal attention over the paged
cache (float caches), and counts its calls, so a test sees which path a batch took. :func:`make_batch`
lays out a batch as vLLM's runner does: context keys already in shuffled pages, the new tokens written by
``do_kv_cache_update`` through the slot mapping, and the exact answer from contiguous K and V.
"""

from __future__ import annotations

import enum
import importlib.util
import math
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import santa.vllm
from helpers import DEVICE

BACKEND_PY = Path(santa.vllm.__file__).with_name("backend.py")
FP8 = torch.float8_e4m3fn


class AttentionCGSupport(enum.Enum):  # vllm.v1.attention.backend (values as in 0.26.0)
    ALWAYS = 3
    UNIFORM_BATCH = 2
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    NEVER = 0


class AttentionType(enum.StrEnum):  # vllm.v1.attention.backend
    DECODER = "decoder"
    ENCODER = "encoder"
    ENCODER_ONLY = "encoder_only"
    ENCODER_DECODER = "encoder_decoder"


def paged_rows(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ``[num_blocks, block_size, H_kv, D]`` views of the packed cache, as FlashAttention splits it."""
    return kv_cache.transpose(1, 2).split(head_size, dim=-1)


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, first_position: int) -> torch.Tensor:
    """Causal attention of q ``[Q, H, D]`` (positions first_position …) over k, v ``[L, H_kv, D]``, in float32."""
    group = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, dim=1), v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    positions = first_position + torch.arange(q.shape[0], device=q.device)
    scores = scores.masked_fill(torch.arange(k.shape[0], device=q.device)[None, :] > positions[:, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


class FlashAttentionImpl:
    """vLLM 0.26.0's ``FlashAttentionImpl`` as santa's subclass sees it: its constructor's arguments, ``forward``
    (exact causal attention over the paged cache; ``calls`` counts it) and ``do_kv_cache_update``."""

    calls = 0

    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                 logits_soft_cap=None, attn_type=AttentionType.DECODER, kv_sharing_target_layer_name=None, sinks=None):
        self.num_heads, self.head_size, self.scale, self.num_kv_heads = num_heads, head_size, float(scale), num_kv_heads
        self.kv_cache_dtype, self.attn_type = kv_cache_dtype, attn_type

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None):
        FlashAttentionImpl.calls += 1
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not yet supported for FlashAttentionImpl")
        if attn_metadata is None:  # the profiling run
            return output.fill_(0)
        k_cache, v_cache = paged_rows(kv_cache, self.head_size)
        starts = attn_metadata.query_start_loc.tolist()
        for i, seq_len in enumerate(attn_metadata.seq_lens.tolist()):
            pages = attn_metadata.block_table[i, : math.ceil(seq_len / k_cache.shape[1])]
            k = k_cache[pages].flatten(0, 1)[:seq_len]
            v = v_cache[pages].flatten(0, 1)[:seq_len]
            rows = slice(starts[i], starts[i + 1])
            output[rows] = exact_attention(query[rows], k, v, self.scale, seq_len - (rows.stop - rows.start)).to(output.dtype)
        return output

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        """``reshape_and_cache_flash``: token t's K and V into slot ``slot_mapping[t]`` (fp8: divided by the layer's scale)."""
        k_cache, v_cache = (c.flatten(0, 1) for c in paged_rows(kv_cache, self.head_size))
        n = slot_mapping.shape[0]
        if kv_cache.dtype == torch.uint8:
            k_cache[slot_mapping] = (key[:n].float() / layer._k_scale).to(FP8).view(torch.uint8)
            v_cache[slot_mapping] = (value[:n].float() / layer._v_scale).to(FP8).view(torch.uint8)
        else:
            k_cache[slot_mapping] = key[:n].to(kv_cache.dtype)
            v_cache[slot_mapping] = value[:n].to(kv_cache.dtype)


@dataclass
class FlashAttentionMetadata:
    """vLLM 0.26.0's ``FlashAttentionMetadata`` (a dataclass), with the fields santa's backend and the stand-in
    FlashAttention read."""

    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor
    max_seq_len: int
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    use_cascade: bool
    common_prefix_len: int
    scheduler_metadata: torch.Tensor | None = None
    max_num_splits: int = 0
    causal: bool = True


class FlashAttentionMetadataBuilder:
    """vLLM 0.26.0's builder: ``__init__(kv_cache_spec, layer_names, vllm_config, device)`` and ``build``, which returns
    :class:`FlashAttentionMetadata`."""

    _cudagraph_support = AttentionCGSupport.UNIFORM_BATCH
    reorder_batch_threshold = None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        self.kv_cache_spec, self.layer_names, self.vllm_config, self.device = kv_cache_spec, layer_names, vllm_config, device

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        cm = common_attn_metadata
        return FlashAttentionMetadata(
            num_actual_tokens=cm.num_actual_tokens, max_query_len=cm.max_query_len, query_start_loc=cm.query_start_loc,
            max_seq_len=cm.max_seq_len, seq_lens=cm.seq_lens, block_table=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping, use_cascade=common_prefix_len > 0, common_prefix_len=common_prefix_len,
            causal=cm.causal, scheduler_metadata=None, max_num_splits=0)


class FlashAttentionBackend:
    @staticmethod
    def get_name() -> str:
        return "FLASH_ATTN"

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True


def split_decodes_and_prefills(common_attn_metadata, decode_threshold: int = 1, require_uniform: bool = False,
                               treat_short_extends_as_decodes: bool = True) -> tuple[int, int, int, int]:
    """``vllm.v1.attention.backends.utils.split_decodes_and_prefills`` (0.26.0) for a reordered batch (decodes first):
    ``(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens)`` from the host copy of query_start_loc."""
    cm = common_attn_metadata
    if cm.max_query_len <= decode_threshold:
        return cm.num_reqs, 0, cm.num_actual_tokens, 0
    query_lens = cm.query_start_loc_cpu[1:] - cm.query_start_loc_cpu[:-1]
    if query_lens[0].item() > decode_threshold:
        return 0, cm.num_reqs, 0, cm.num_actual_tokens
    is_prefill = query_lens > decode_threshold
    if not torch.any(is_prefill):
        return cm.num_reqs, 0, cm.num_actual_tokens, 0
    first = int(is_prefill.int().argmax().item())
    tokens = int(cm.query_start_loc_cpu[first].item())
    return first, cm.num_reqs - first, tokens, cm.num_actual_tokens - tokens


@dataclass
class UBatchSlice:  # vllm.v1.worker.ubatch_utils
    request_slice: slice
    token_slice: slice


def split_attn_metadata(ubatch_slices, common_attn_metadata) -> list:
    """``vllm.v1.worker.ubatch_utils.split_attn_metadata`` (0.26.0) for slices on request boundaries: each slice's
    CommonAttentionMetadata, query_start_loc rebased to 0, the per-request tables and the slot mapping cut."""
    cm, out = common_attn_metadata, []
    for piece in ubatch_slices:
        requests, tokens = piece.request_slice, piece.token_slice
        starts_cpu = cm.query_start_loc_cpu[requests.start: requests.stop + 1]
        starts_cpu = starts_cpu - starts_cpu[0]
        seq_lens_cpu = cm.seq_lens_cpu_upper_bound[requests]
        out.append(types.SimpleNamespace(
            query_start_loc=starts_cpu.to(cm.query_start_loc.device), query_start_loc_cpu=starts_cpu,
            seq_lens=cm.seq_lens[requests], num_reqs=requests.stop - requests.start,
            num_actual_tokens=tokens.stop - tokens.start, max_query_len=int((starts_cpu[1:] - starts_cpu[:-1]).max()),
            max_seq_len=max(int(seq_lens_cpu.max()), cm.max_seq_len), block_table_tensor=cm.block_table_tensor[requests],
            slot_mapping=cm.slot_mapping[tokens], seq_lens_cpu_upper_bound=seq_lens_cpu, causal=cm.causal))
    return out


class CurrentConfig:
    """``vllm.config.get_current_vllm_config_or_none``: the config vLLM sets while it builds a model's layers (a test
    sets it; None outside)."""

    config = None

    @classmethod
    def get_current_vllm_config_or_none(cls):
        return cls.config


class ParallelState:
    """``vllm.distributed.parallel_state``'s tensor-parallel rank: ``rank`` None is vLLM's state before the engine
    initialises its groups (``get_tp_group`` asserts), an int a worker's rank (a test sets it: :func:`tensor_parallel`)."""

    rank: int | None = None

    @classmethod
    def get_tensor_model_parallel_rank(cls) -> int:
        assert cls.rank is not None, "tensor model parallel group is not initialized"  # vLLM 0.26's get_tp_group
        return cls.rank


def stand_ins() -> dict[str, types.ModuleType]:
    """The vLLM modules santa's backend imports (and their parents), holding the stand-ins above."""
    modules = {name: types.ModuleType(name) for name in (
        "vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backend", "vllm.v1.attention.backends",
        "vllm.v1.attention.backends.flash_attn", "vllm.v1.attention.backends.utils", "vllm.v1.worker",
        "vllm.v1.worker.ubatch_utils", "vllm.config", "vllm.distributed", "vllm.distributed.parallel_state", "vllm.envs")}
    modules["vllm.envs"].VLLM_BATCH_INVARIANT = False  # vLLM's batch-invariant mode off (a test sets it on backend.envs)
    modules["vllm"].envs = modules["vllm.envs"]
    modules["vllm.config"].__dict__.update(get_current_vllm_config_or_none=CurrentConfig.get_current_vllm_config_or_none)
    modules["vllm.v1.attention.backends.utils"].__dict__.update(split_decodes_and_prefills=split_decodes_and_prefills)
    modules["vllm.v1.worker.ubatch_utils"].__dict__.update(UBatchSlice=UBatchSlice, split_attn_metadata=split_attn_metadata)
    modules["vllm.distributed.parallel_state"].__dict__.update(
        get_tensor_model_parallel_rank=ParallelState.get_tensor_model_parallel_rank)
    modules["vllm.v1.attention.backend"].__dict__.update(AttentionCGSupport=AttentionCGSupport, AttentionType=AttentionType)
    modules["vllm.v1.attention.backends.flash_attn"].__dict__.update(
        FlashAttentionBackend=FlashAttentionBackend, FlashAttentionImpl=FlashAttentionImpl,
        FlashAttentionMetadata=FlashAttentionMetadata, FlashAttentionMetadataBuilder=FlashAttentionMetadataBuilder)
    return modules


def load_backend() -> types.ModuleType:
    """santa's backend module executed over the stand-ins (``sys.modules`` is restored before this returns)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, module in stand_ins().items():
            patch.setitem(sys.modules, name, module)
        spec = importlib.util.spec_from_file_location("santa_vllm_backend_on_stand_ins", BACKEND_PY)
        backend = importlib.util.module_from_spec(spec)
        patch.setitem(sys.modules, spec.name, backend)  # while it executes (its dataclasses look their module up)
        spec.loader.exec_module(backend)
    return backend


# ---- a model, its cache and one batch, as vLLM's runner hands them to the backend -----------------------------

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 8, 2, 32, 16


class ModelConfig:
    """The ``ModelConfig`` methods and fields santa's builder reads: a rank's heads, as vLLM 0.26 counts them
    (``H // tensor_parallel_size``; KV heads replicated once TP passes H_kv)."""

    def __init__(self, max_model_len: int, dtype: torch.dtype):
        self.max_model_len, self.dtype = max_model_len, dtype

    def get_num_attention_heads(self, parallel_config):
        return HEADS // parallel_config.tensor_parallel_size

    def get_num_kv_heads(self, parallel_config):
        return max(1, KV_HEADS // parallel_config.tensor_parallel_size)

    def get_head_size(self):
        return HEAD_DIM


def vllm_config(max_model_len: int = 96, max_num_seqs: int = 4, dtype: torch.dtype = torch.float32, tensor_parallel_size: int = 1,
                additional_config: dict | None = None, capture_sizes: tuple[int, ...] | None = None):
    """The config fields santa's builder reads; ``capture_sizes``: the compilation config's CUDA-graph batch sizes (None:
    no compilation config, as in an eager engine)."""
    config = types.SimpleNamespace(model_config=ModelConfig(max_model_len, dtype),
                                   parallel_config=types.SimpleNamespace(tensor_parallel_size=tensor_parallel_size),
                                   scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs),
                                   additional_config=additional_config or {})
    if capture_sizes is not None:
        config.compilation_config = types.SimpleNamespace(cudagraph_capture_sizes=list(capture_sizes),
                                                          max_cudagraph_capture_size=max(capture_sizes))
    return config


def kv_cache_spec(dtype: torch.dtype = torch.float32):
    return types.SimpleNamespace(block_size=BLOCK, dtype=dtype)


class MockLayer:
    """vLLM's own backend test's ``MockAttentionLayer``: scales only, no ``layer_name``, unless one is given."""

    def __init__(self, name: str | None = None, q_scale: float = 1.0, k_scale: float = 1.0, v_scale: float = 1.0):
        self._q_scale, self._k_scale, self._v_scale = (torch.tensor(s, device=DEVICE) for s in (q_scale, k_scale, v_scale))
        if name is not None:
            self.layer_name = name


@dataclass
class Batch:
    query: torch.Tensor  # [T, H, D]: the new tokens' queries
    key: torch.Tensor  # [T, H_kv, D]: the new tokens' keys and values (written by do_kv_cache_update)
    value: torch.Tensor
    kv_cache: torch.Tensor  # logical (num_blocks, H_kv, block_size, 2·D), the context already in its pages
    common: types.SimpleNamespace  # CommonAttentionMetadata's fields the builders read
    k_full: list[torch.Tensor]  # per request, every key and value [L, H_kv, D] (the exact answer's)
    v_full: list[torch.Tensor]
    query_lens: list[int]
    seq_lens: list[int]

    def exact(self, scale: float) -> torch.Tensor:
        """Exact causal attention of every new token, from contiguous K and V, float32 ``[T, H, D]``."""
        outs, start = [], 0
        for q_len, seq_len, k, v in zip(self.query_lens, self.seq_lens, self.k_full, self.v_full, strict=True):
            outs.append(exact_attention(self.query[start: start + q_len], k, v, scale, seq_len - q_len))
            start += q_len
        return torch.cat(outs)


def make_batch(seq_lens: list[int], query_lens: list[int], *, seed: int = 0, table_width: int | None = None,
               fp8_scales: tuple[float, float] | None = None, num_blocks: int = 64) -> Batch:
    """A batch as vLLM's runner hands it over: request i has seq_lens[i] keys, its last query_lens[i] new this step;
    its context sits in shuffled pages of the cache, its block table has ``table_width`` columns (the runner's
    table may be wider than the model needs), and ``slot_mapping`` points the new tokens at their slots.
    fp8_scales (k_scale, v_scale; powers of two): an fp8 cache stored as uint8, K and V made representable."""
    cache_dtype = torch.float32 if fp8_scales is None else torch.uint8
    g = torch.Generator().manual_seed(seed)
    width = table_width or max(math.ceil(n / BLOCK) for n in seq_lens)
    kv_cache = torch.zeros(num_blocks, BLOCK, KV_HEADS, 2 * HEAD_DIM).to(cache_dtype)  # physical NHD rows
    free = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()  # block 0: vLLM's null block
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    k_full, v_full, queries, keys, values, slots = [], [], [], [], [], []
    for i, (seq_len, q_len) in enumerate(zip(seq_lens, query_lens, strict=True)):
        pages = [free.pop() for _ in range(math.ceil(seq_len / BLOCK))]
        table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        k, v = torch.randn(2, seq_len, KV_HEADS, HEAD_DIM, generator=g).unbind(0)
        if fp8_scales is not None:  # values an fp8 cache holds exactly: (k / scale) in e4m3, times the scale
            k, v = ((t / s).to(FP8).float() * s for t, s in zip((k, v), fp8_scales, strict=True))
        queries.append(torch.randn(q_len, HEADS, HEAD_DIM, generator=g))
        context = seq_len - q_len
        for j in range(seq_len):
            page, row = pages[j // BLOCK], j % BLOCK
            if j < context:  # written by earlier steps
                if fp8_scales is not None:
                    kv_cache[page, row] = torch.cat([k[j] / fp8_scales[0], v[j] / fp8_scales[1]], -1).to(FP8).view(torch.uint8)
                else:
                    kv_cache[page, row] = torch.cat([k[j], v[j]], -1).to(cache_dtype)
            else:
                slots.append(page * BLOCK + row)
        k_full.append(k)
        v_full.append(v)
        keys.append(k[context:])
        values.append(v[context:])
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    common = types.SimpleNamespace(
        num_actual_tokens=sum(query_lens), max_query_len=max(query_lens), query_start_loc=starts.to(DEVICE),
        query_start_loc_cpu=starts, num_reqs=len(seq_lens), max_seq_len=max(seq_lens),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32), block_table_tensor=table.to(DEVICE),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE), causal=True)
    return Batch(torch.cat(queries).to(DEVICE), torch.cat(keys).to(DEVICE), torch.cat(values).to(DEVICE),
                 kv_cache.transpose(1, 2).to(DEVICE), common, [t.to(DEVICE) for t in k_full], [t.to(DEVICE) for t in v_full],
                 list(query_lens), list(seq_lens))
