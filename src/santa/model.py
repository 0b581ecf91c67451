"""A compact Llama decoder for end-to-end decode (in the spirit of gpt-fast's ``model.py``).

One :class:`ModelArgs`, a static :class:`KVCache` with one ``update``, dense prefill, and a decode
step whose attention is chosen per call by a :class:`DecodeContext`:

- ``"sdpa"``: ``scaled_dot_product_attention`` over the whole static cache with an additive mask
  (the caller picks the SDPA backend; the benchmark pins cuDNN on the GPU);
- ``"flashinfer"``: FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` over the same cache,
  viewed as pages (planned on the host once per step, outside any CUDA graph);
- ``"santa-prop"`` / ``"santa-flash"``: :func:`santa.kernels.decode` (reads all of K, S sampled V
  rows per head); where ``santa.kernels`` cannot be imported, a torch path with the same estimator;
- ``"weights-only"``: no attention at all (its output is q): the rest of the model, for Amdahl.

Every decode-step input lives in a device buffer updated inside the step, so the whole step can be
captured in one CUDA graph and replayed with no host work (FlashInfer needs its host ``plan``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

BACKENDS = ("sdpa", "flashinfer", "santa-prop", "santa-flash", "weights-only")
CACHE_ALIGN = 256  # static cache length is a multiple of this (FlashInfer pages, kernel tiles)


@dataclass(frozen=True)
class ModelArgs:
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int = 8
    dim: int = 4096
    intermediate_size: int = 14336
    vocab_size: int = 128256
    rope_base: float = 500000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    # Llama-3.1 frequency scaling: (factor, low_freq_factor, high_freq_factor, original_max_position)
    rope_scaling: tuple[float, float, float, int] | None = None

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @classmethod
    def from_hf_config(cls, config) -> ModelArgs:
        """Arguments of a transformers ``LlamaConfig`` (llama-architecture checkpoints)."""
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        scaling = None
        if rope.get("rope_type") == "llama3":
            scaling = (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"])
        return cls(
            n_layer=config.num_hidden_layers,
            n_head=config.num_attention_heads,
            n_kv_head=config.num_key_value_heads,
            dim=config.hidden_size,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            rope_base=float(theta),
            norm_eps=float(config.rms_norm_eps),
            tie_embeddings=bool(config.tie_word_embeddings),
            rope_scaling=scaling,
        )


CONFIGS = {
    "llama-3.1-8b": ModelArgs(rope_scaling=(8.0, 1.0, 4.0, 8192)),
    "smollm2-135m": ModelArgs(
        n_layer=30, n_head=9, n_kv_head=3, dim=576, intermediate_size=1536, vocab_size=49152,
        rope_base=100000.0, tie_embeddings=True,
    ),
    "tiny": ModelArgs(n_layer=2, n_head=4, n_kv_head=2, dim=64, intermediate_size=128, vocab_size=256, rope_base=10000.0),
}


class KVCache(nn.Module):
    """Static K/V of every sequence, NHD: ``[B, L_max, H_kv, d]`` (what santa and FlashInfer read)."""

    def __init__(self, batch: int, max_len: int, n_kv_head: int, head_dim: int, dtype: torch.dtype, device=None):
        super().__init__()
        shape = (batch, max_len, n_kv_head, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: Tensor, k_val: Tensor, v_val: Tensor) -> tuple[Tensor, Tensor]:
        # input_pos: [T], k_val: [B, T, H_kv, d]
        self.k_cache.index_copy_(1, input_pos, k_val)
        self.v_cache.index_copy_(1, input_pos, v_val)
        return self.k_cache, self.v_cache


@dataclass
class DecodeContext:
    """Device state of one decode step (all updated in place, so a captured graph stays valid).

    seq_lens: int32 ``[B]``, keys visible to the new token (``input_pos + 1``).
    attn_bias: ``[B, 1, 1, L_max]`` in the model dtype, 0 on visible keys and −inf beyond (sdpa).
    offset: int64 ``[1]``, the Philox counter of santa's kernels, advanced once per step; the
        layer index goes into the seed, so every (layer, step) draws fresh uniforms.
    """

    backend: str
    seq_lens: Tensor
    attn_bias: Tensor | None = None
    budget: int = 128
    seed: int = 0
    offset: Tensor | None = None
    workspace: Tensor | None = None
    flashinfer: object | None = None
    page_size: int = 16
    santa_impl: str = "auto"  # "auto" (kernels if importable), "kernels", "torch"

    def prepare(self, input_pos: Tensor) -> None:
        """Make key ``input_pos`` visible: ``seq_lens = pos + 1``; bias at pos = 0. input_pos: [1]."""
        self.seq_lens.copy_((input_pos + 1).to(torch.int32).expand_as(self.seq_lens))
        if self.attn_bias is not None:
            self.attn_bias.index_fill_(-1, input_pos, 0.0)

    def advance(self) -> None:
        if self.offset is not None:
            self.offset.add_(1)


def make_context(model: Transformer, backend: str, *, prompt_len: int, budget: int = 128, seed: int = 0, santa_impl: str = "auto") -> DecodeContext:
    """A context for decoding after a prompt of ``prompt_len`` tokens (caches already set up)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    cache = model.layers[0].attention.kv_cache
    batch, max_len = cache.k_cache.shape[:2]
    device, dtype = cache.k_cache.device, cache.k_cache.dtype
    ctx = DecodeContext(
        backend=backend,
        seq_lens=torch.full((batch,), prompt_len, dtype=torch.int32, device=device),
        budget=budget,
        seed=seed,
        offset=torch.zeros(1, dtype=torch.int64, device=device),
        santa_impl=santa_impl,
    )
    if backend == "sdpa":
        bias = torch.full((batch, 1, 1, max_len), -math.inf, dtype=dtype, device=device)
        bias[..., :prompt_len] = 0.0
        ctx.attn_bias = bias
    elif backend in ("santa-prop", "santa-flash") and _santa_kernels(santa_impl) is not None:
        kernels = _santa_kernels(santa_impl)
        q = torch.empty(batch, model.args.n_head, model.args.head_dim, dtype=dtype, device=device)
        kernel = backend.removeprefix("santa-")
        ctx.workspace = kernels.make_workspace(q, cache.k_cache, budget, kernel=kernel)
    elif backend == "flashinfer":
        ctx.flashinfer = FlashInferDecode(model, page_size=ctx.page_size)
    return ctx


class FlashInferDecode:
    """FlashInfer paged decode over the contiguous cache viewed as ``[B·L_max/P, P, H_kv, d]`` pages."""

    def __init__(self, model: Transformer, page_size: int = 16, use_tensor_cores: bool = False):
        import flashinfer

        cache = model.layers[0].attention.kv_cache
        self.batch, self.max_len, self.n_kv_head, self.head_dim = cache.k_cache.shape
        if self.max_len % page_size:
            raise ValueError(f"cache length {self.max_len} is not a multiple of page_size {page_size}")
        self.page_size, self.pages_per_seq = page_size, self.max_len // page_size
        self.n_head, self.dtype, device = model.args.n_head, cache.k_cache.dtype, cache.k_cache.device
        self.workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=device)
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, kv_layout="NHD", use_cuda_graph=True, use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=torch.zeros(self.batch + 1, dtype=torch.int32, device=device),
            paged_kv_indices_buffer=torch.zeros(self.batch * self.pages_per_seq, dtype=torch.int32, device=device),
            paged_kv_last_page_len_buffer=torch.zeros(self.batch, dtype=torch.int32, device=device),
        )
        # page i of sequence b is b·pages_per_seq + i
        self.all_pages = torch.arange(self.batch * self.pages_per_seq, dtype=torch.int32, device=device).view(self.batch, -1)
        self.n_pages = None

    def plan(self, n_keys: int) -> None:
        """Host-side plan for ``n_keys`` visible keys per sequence (call before every step)."""
        n_pages = -(-n_keys // self.page_size)
        if n_pages != self.n_pages and self.n_pages is not None:
            torch.cuda.current_stream().synchronize()  # the plan's pinned host buffer must be free to rewrite
        self.n_pages = n_pages
        indptr = (torch.arange(self.batch + 1, dtype=torch.int32) * n_pages).pin_memory()
        last = torch.full((self.batch,), n_keys - (n_pages - 1) * self.page_size, dtype=torch.int32).pin_memory()
        indices = self.all_pages[:, :n_pages].reshape(-1)
        self.wrapper.plan(
            indptr, indices, last, self.n_head, self.n_kv_head, self.head_dim, self.page_size,
            q_data_type=self.dtype, kv_data_type=self.dtype,
        )

    def run(self, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        # q: [B, H, d]; caches: [B, L_max, H_kv, d] → pages [B·L_max/P, P, H_kv, d]
        pages = (-1, self.page_size, self.n_kv_head, self.head_dim)
        return self.wrapper.run(q, (k_cache.view(pages), v_cache.view(pages)))


def _santa_kernels(impl: str):
    """``santa.kernels`` when it is importable and wanted, else None (the torch path)."""
    if impl == "torch":
        return None
    try:
        import santa.kernels as kernels

        kernels.decode  # noqa: B018 - present only once the kernels land
    except (ImportError, AttributeError):
        if impl == "kernels":
            raise
        return None
    return kernels


def systematic_indices(probs: Tensor, budget: int, uniforms: Tensor) -> Tensor:
    """Graph-safe S²ANTA-sys draw: ``probs [..., n]``, ``uniforms [...]`` → key indices ``[..., S]``.

    Same indices as ``santa.sample_indices(probs, S, "systematic", uniforms=u)`` (which checks its
    inputs on the host and so cannot be captured): ``T_m = (m + U)/S``, ``F⁻¹(t) = min{j : F(j) > t}``,
    clamped to the last key with nonzero probability.
    """
    cdf = torch.cumsum(probs.double(), dim=-1)
    points = (torch.arange(budget, device=probs.device, dtype=torch.float64) + uniforms.double().unsqueeze(-1)) / budget
    index = torch.searchsorted(cdf.contiguous(), points.contiguous(), right=True)
    positions = torch.arange(probs.shape[-1], device=probs.device)
    last_visible = torch.where(probs > 0, positions, -1).amax(dim=-1, keepdim=True).clamp_min(0)
    return torch.minimum(index, last_visible)


def _gather_rows(v_cache: Tensor, index: Tensor) -> Tensor:
    """``v_cache [B, L, H_kv, d]``, ``index [B, H_kv, ..., S]`` → rows ``[B, H_kv, ..., S, d]``."""
    batch, _, kv_heads, dim = v_cache.shape
    flat = index.reshape(batch, kv_heads, -1)  # [B, H_kv, N]
    rows = v_cache.transpose(1, 2).gather(2, flat.unsqueeze(-1).expand(-1, -1, -1, dim))  # [B, H_kv, N, d]
    return rows.view(*index.shape, dim)


def santa_decode_torch(q: Tensor, k_cache: Tensor, v_cache: Tensor, budget: int, *, kernel: str, seq_lens: Tensor, tile: int = 128) -> Tensor:
    """Torch S²ANTA decode with the kernels' semantics (fresh ``torch.rand`` uniforms, not Philox).

    q: ``[B, H, d]``; caches ``[B, L_max, H_kv, d]``; seq_lens int32 ``[B]``. Returns ``[B, H, d]``.
    prop: global systematic sampling, ``ô = (1/S) Σ_m v_{F⁻¹(T_m)}``; graph-safe.
    flash: ``⌈S/T⌉`` systematic samples per tile of ``tile`` keys and the merge
    ``ô = Σ_t (W_t/Z) (1/S_t) Σ_{j∈t} c_j v_j``; reads ``seq_lens`` on the host (eager only).
    """
    batch, heads, dim = q.shape
    max_len, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    qg = q.view(batch, kv_heads, group, dim)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, k_cache).float() / math.sqrt(dim)  # [B, H_kv, G, L]
    visible = torch.arange(max_len, device=q.device) < seq_lens.unsqueeze(-1)  # [B, L]
    scores = scores.masked_fill(~visible[:, None, None, :], -math.inf)
    if kernel == "prop":
        probs = torch.softmax(scores, dim=-1)
        uniforms = torch.rand(batch, kv_heads, group, device=q.device)
        index = systematic_indices(probs, budget, uniforms)  # [B, H_kv, G, S]
        out = _gather_rows(v_cache, index).float().mean(dim=-2)  # (1/S) Σ_m v_{i_m}
        return out.reshape(batch, heads, dim).to(q.dtype)
    n_tiles = -(-max_len // tile)
    scores = F.pad(scores, (0, n_tiles * tile - max_len), value=-math.inf).view(batch, kv_heads, group, n_tiles, tile)
    tile_max = scores.amax(dim=-1)  # [B, H_kv, G, T]
    safe_max = tile_max.masked_fill(tile_max == -math.inf, 0.0)
    unnorm = torch.exp(scores - safe_max.unsqueeze(-1))
    tile_mass = unnorm.sum(-1)  # ℓ_t
    local = unnorm / tile_mass.masked_fill(tile_mass == 0, 1.0).unsqueeze(-1)
    row_max = safe_max.amax(dim=-1, keepdim=True)
    weight = torch.exp(safe_max - row_max) * tile_mass  # W_t = exp(m_t − m*) ℓ_t
    weight = weight / weight.sum(-1, keepdim=True)
    tiles_used = (seq_lens.long() + tile - 1) // tile  # [B]
    s_tile = (budget + tiles_used.clamp_min(1) - 1) // tiles_used.clamp_min(1)  # ⌈S/T⌉ per sequence
    out = torch.zeros(batch, kv_heads, group, dim, dtype=torch.float32, device=q.device)
    for b in range(batch):
        s_b = int(s_tile[b])
        uniforms = torch.rand(kv_heads, group, n_tiles, device=q.device)
        index = systematic_indices(local[b], s_b, uniforms) + torch.arange(n_tiles, device=q.device).view(-1, 1) * tile
        index = index.clamp_max(max_len - 1)  # empty padded tiles carry weight 0
        rows = _gather_rows(v_cache[b : b + 1], index.unsqueeze(0))[0].float()  # [H_kv, G, T, S_t, d]
        out[b] = (weight[b].unsqueeze(-1) * rows.mean(dim=-2)).sum(dim=-2)
    return out.reshape(batch, heads, dim).to(q.dtype)


def apply_rope(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    # x: [B, T, H, d]; cos, sin_signed: [T, d] in x's dtype. HF's rotate_half convention,
    # x·cos + rotate_half(x)·sin with rotate_half(x) = [−x2, x1] = roll(x, d/2)·[−1, 1]: three kernels.
    return torch.addcmul(x * cos[:, None, :], x.roll(x.shape[-1] // 2, dims=-1), sin_signed[:, None, :])


def rope_tables(args: ModelArgs, max_len: int, device=None) -> tuple[Tensor, Tensor]:
    """cos, sin ``[max_len, d]`` float32, with Llama-3.1's frequency scaling where configured."""
    d = args.head_dim
    inv_freq = 1.0 / (args.rope_base ** (torch.arange(0, d, 2, dtype=torch.float64, device=device) / d))
    if args.rope_scaling is not None:
        factor, low, high, original = args.rope_scaling
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        inv_freq = torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float64, device=device), inv_freq)  # [L, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().float(), emb.sin().float()


def signed_sin(sin: Tensor) -> Tensor:
    """``[−sin_half, sin_half]``: the sign of rotate_half folded into the table (see apply_rope)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)  # one fused kernel on the GPU


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.args, self.layer_id = args, layer_id
        d, h, hkv = args.head_dim, args.n_head, args.n_kv_head
        self.wqkv = nn.Linear(args.dim, (h + 2 * hkv) * d, bias=False)
        self.wo = nn.Linear(h * d, args.dim, bias=False)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, input_pos: Tensor, ctx: DecodeContext | None) -> Tensor:
        # x: [B, T, D]; cos, sin: [T, d]; input_pos: [T]
        bsz, seqlen, _ = x.shape
        d, h, hkv = self.args.head_dim, self.args.n_head, self.args.n_kv_head
        qkv = self.wqkv(x).view(bsz, seqlen, h + 2 * hkv, d)
        qk = apply_rope(qkv[:, :, : h + hkv], cos, sin)  # q and k rotated together: [B, T, H + H_kv, d]
        q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + hkv :]  # [B, T, H, d], [B, T, H_kv, d] ×2
        k_cache, v_cache = self.kv_cache.update(input_pos, k, v)  # [B, L_max, H_kv, d]
        if ctx is None:  # dense prefill from position 0: attend to this block, causally
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
            )  # [B, H, T, d]
            y = y.transpose(1, 2)
        else:
            y = self.decode(q[:, 0].contiguous(), k_cache, v_cache, ctx).unsqueeze(1)  # [B, 1, H, d]
        return self.wo(y.reshape(bsz, seqlen, h * d))

    def decode(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, ctx: DecodeContext) -> Tensor:
        # q: [B, H, d] contiguous → [B, H, d]
        if ctx.backend == "sdpa":
            y = F.scaled_dot_product_attention(
                q.unsqueeze(2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), attn_mask=ctx.attn_bias, enable_gqa=True
            )  # [B, H, 1, d]
            return y.squeeze(2)
        if ctx.backend == "flashinfer":
            return ctx.flashinfer.run(q, k_cache, v_cache)
        if ctx.backend == "weights-only":
            return q
        kernel = ctx.backend.removeprefix("santa-")
        kernels = _santa_kernels(ctx.santa_impl)
        if kernels is None:
            return santa_decode_torch(q, k_cache, v_cache, ctx.budget, kernel=kernel, seq_lens=ctx.seq_lens)
        return kernels.decode(
            q, k_cache, v_cache, ctx.budget, kernel=kernel, seq_lens=ctx.seq_lens,
            seed=ctx.seed * 1000003 + self.layer_id, offset=ctx.offset, workspace=ctx.workspace,
        )


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w13 = nn.Linear(args.dim, 2 * args.intermediate_size, bias=False)  # gate and up, fused
        self.w2 = nn.Linear(args.intermediate_size, args.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.attention = Attention(args, layer_id)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, input_pos: Tensor, ctx: DecodeContext | None) -> Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, input_pos, ctx)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, i) for i in range(args.n_layer))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.rope_cos: Tensor | None = None
        self.rope_sin: Tensor | None = None  # signed: [−sin_half, sin_half]

    def setup_caches(self, batch: int, max_len: int) -> int:
        """Allocate every layer's static cache; returns the cache length (rounded up to 256)."""
        max_len = -(-max_len // CACHE_ALIGN) * CACHE_ALIGN
        weight = self.output.weight
        for layer in self.layers:
            layer.attention.kv_cache = None  # free the old cache before the new one
        for layer in self.layers:
            layer.attention.kv_cache = KVCache(batch, max_len, self.args.n_kv_head, self.args.head_dim, weight.dtype, weight.device)
        cos, sin = rope_tables(self.args, max_len, weight.device)
        self.rope_cos, self.rope_sin = cos, signed_sin(sin)
        return max_len

    def forward(self, idx: Tensor, input_pos: Tensor, ctx: DecodeContext | None = None, *, last_only: bool = False) -> Tensor:
        # idx: [B, T]; input_pos: [T]. ctx None: dense prefill from position 0; else one decode step.
        # Returns logits [B, T, V] (or [B, 1, V] with last_only).
        x = self.tok_embeddings(idx)  # [B, T, D]
        cos, sin = self.rope_cos[input_pos].to(x.dtype), self.rope_sin[input_pos].to(x.dtype)  # [T, d]
        for layer in self.layers:
            x = layer(x, cos, sin, input_pos, ctx)
        if last_only:
            x = x[:, -1:]
        return self.output(self.norm(x)).float()

    @classmethod
    def from_hf(cls, hf_model, dtype: torch.dtype | None = None) -> Transformer:
        """The same weights as a transformers Llama model (``LlamaForCausalLM``)."""
        args = ModelArgs.from_hf_config(hf_model.config)
        sd = hf_model.state_dict()
        with torch.device("meta"):
            model = cls(args)
        ours = {"tok_embeddings.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"]}
        ours["output.weight"] = sd["model.embed_tokens.weight" if args.tie_embeddings else "lm_head.weight"]
        for i in range(args.n_layer):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            ours[f"layers.{i}.attention.wqkv.weight"] = torch.cat([sd[a + "q_proj.weight"], sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]])
            ours[f"layers.{i}.attention.wo.weight"] = sd[a + "o_proj.weight"]
            ours[f"layers.{i}.feed_forward.w13.weight"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
            ours[f"layers.{i}.feed_forward.w2.weight"] = sd[p + "mlp.down_proj.weight"]
            ours[f"layers.{i}.attention_norm.weight"] = sd[p + "input_layernorm.weight"]
            ours[f"layers.{i}.ffn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        model.load_state_dict(ours, assign=True, strict=True)
        if args.tie_embeddings:
            model.output.weight = model.tok_embeddings.weight
        return model.to(dtype=dtype) if dtype is not None else model

    @classmethod
    def random(cls, args: ModelArgs, *, device=None, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Transformer:
        """Random weights made on ``device`` (speed does not depend on their values)."""
        with torch.device("meta"):
            model = cls(args).to(dtype)
        model = model.to_empty(device=device)
        if args.tie_embeddings:
            model.output.weight = model.tok_embeddings.weight
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name == "tok_embeddings.weight":
                    p.normal_(0.0, 1.0, generator=gen)
                else:  # keeps activations O(1) through the residual stream
                    p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]), generator=gen)
        return model


def prefill(model: Transformer, prompt: Tensor) -> Tensor:
    """Dense prefill of ``prompt [B, T]`` into the caches; returns the first new token ``[B, 1]``."""
    input_pos = torch.arange(prompt.shape[1], device=prompt.device)
    logits = model(prompt, input_pos, last_only=True)  # [B, 1, V]
    return logits[:, -1].argmax(-1, keepdim=True)


def decode_step(model: Transformer, token: Tensor, input_pos: Tensor, ctx: DecodeContext) -> Tensor:
    """One greedy step: ``token [B, 1]`` at position ``input_pos [1]`` → next token ``[B, 1]``.

    Device work only (no host sync), so it can be captured; the caller advances input_pos and
    ctx.offset (:func:`advance`), inside the graph too.
    """
    ctx.prepare(input_pos)
    logits = model(token, input_pos, ctx)  # [B, 1, V]
    return logits[:, -1].argmax(-1, keepdim=True)


def advance(token: Tensor, next_token: Tensor, input_pos: Tensor, ctx: DecodeContext) -> None:
    token.copy_(next_token)
    input_pos.add_(1)
    ctx.advance()


@torch.inference_mode()
def generate(
    model: Transformer, prompt: Tensor, max_new_tokens: int, *, backend: str = "sdpa", budget: int = 128, seed: int = 0, santa_impl: str = "auto"
) -> Tensor:
    """Greedy generation (eager): ``prompt [B, T]`` → new tokens ``[B, max_new_tokens]``."""
    batch, length = prompt.shape
    model.setup_caches(batch, length + max_new_tokens)
    token = prefill(model, prompt)
    ctx = make_context(model, backend, prompt_len=length, budget=budget, seed=seed, santa_impl=santa_impl)
    input_pos = torch.tensor([length], device=prompt.device)
    out = [token.clone()]
    for _ in range(max_new_tokens - 1):
        if ctx.flashinfer is not None:
            ctx.flashinfer.plan(int(input_pos) + 1)
        nxt = decode_step(model, token, input_pos, ctx)
        advance(token, nxt, input_pos, ctx)
        out.append(token.clone())
    return torch.cat(out, dim=1)


__all__ = [
    "BACKENDS",
    "CONFIGS",
    "DecodeContext",
    "KVCache",
    "ModelArgs",
    "Transformer",
    "advance",
    "decode_step",
    "generate",
    "make_context",
    "prefill",
    "santa_decode_torch",
    "systematic_indices",
]
