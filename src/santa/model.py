"""A compact Llama / Qwen2 decoder for end-to-end decode (in the spirit of gpt-fast's ``model.py``).

One :class:`ModelArgs`, a static :class:`KVCache` with one ``update``, dense prefill, and a decode
step whose attention is chosen per call by a :class:`DecodeContext`:

- ``"sdpa"``: ``scaled_dot_product_attention`` over the whole static cache with an additive mask
  (the caller picks the SDPA backend; the benchmark pins cuDNN on the GPU);
- ``"santa-prop"`` / ``"santa-flash"``: santa's kernels (reads all of K, S sampled V rows per head)
  through one :class:`santa.kernels.DecodePlan` per budget, held by the context and ``run`` every
  step (no module-level plan cache); ``santa_impl="torch"`` runs :mod:`santa.kernels.reference`
  instead (eager);
- ``"iid"``, ``"stratified"``, ``"systematic"``, ``"topk"`` (:data:`REFERENCE_BACKENDS`): the spec,
  :func:`santa.attention.sampled_attention`, on the same cache (eager: it checks on the host);
- any other attention, plugged in with ``make_context(..., attention=fn)`` (benchmarks): ``fn(q,
  k_cache, v_cache, ctx, layer) → out``. ``santa bench e2e`` plugs in two (benchmarks/bench/e2e.py):
  ``"flashinfer"`` (FlashInfer's paged decode over the same cache) and ``"weights-only"`` (no
  attention, for Amdahl).

Each sequence of a batch has its own length: prefill is right-padded and causal (a real token never
sees a pad), and decode gives sequence b its own position ``input_pos[b]`` and ``seq_lens[b]``.
Every decode-step input lives in a device buffer updated inside the step, so the whole step can be
captured in one CUDA graph and replayed with no host work (a plugged-in attention may need its own
host work between steps: the benchmark's FlashInfer plans each step on the host).

The greedy loop (:func:`decode_tokens`, one :func:`greedy_step` per token) and :func:`generate` live
here; :mod:`santa.engine` times them for the sweeps and the main job and holds the path rules.

Weights: :meth:`Transformer.from_hf` (a transformers model), :meth:`Transformer.from_checkpoint`
(a local folder of config.json + safetensors), :func:`load_bundled` (the bundled models).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import santa.kernels as santa_kernels
from santa import rng, schedule_file
from santa.attention import check_flag, sampled_attention
from santa.checkpoint import (  # noqa: F401 (ModelArgs: re-exported as santa.model.ModelArgs)
    ModelArgs,
    args_from_config,
    checked_device,
    checkpoint_folder,
    read_config,
    read_state_dict,
    state_dict_from_hf,
)
from santa.checks import integer
from santa.error_target import DEFAULT_PILOT, check_error_target, check_pilot
from santa.kernels import reference
from santa.kernels.plan import FP8, dequantised  # FP8: re-exported as santa.model.FP8
from santa.methods import METHODS, by_model_backend
from santa.sampling import check_budget

# santa.methods' backends: exact SDPA, the kernels, and the reference samplers (eager). The benchmarks
# plug their own attentions in (make_context(attention=...)); the two that used to be built in here are
# refused by name with where they went.
BACKENDS = (METHODS["dense"].model_backend, *(m.model_backend for m in METHODS.values() if m.kernel))
MOVED_TO_BENCHMARKS = ("flashinfer", "weights-only")
REFERENCE_BACKENDS = tuple(m.model_backend for m in METHODS.values() if m.sampler and not m.exact)  # sampled_attention's samplers
SANTA_IMPLS = ("auto", "kernels", "torch")
CACHE_ALIGN = 256  # static cache length is a multiple of this (kernel tiles; the benchmark's FlashInfer pages)
STOP_CHECK_EVERY = 16  # decode steps between host checks that every sequence has stopped (a sync)
MAX_POSITIONS = 2**31 - CACHE_ALIGN  # prompt + new tokens: seq_lens and positions are int32 on the device


CONFIGS = {
    "llama-3.1-8b": ModelArgs(rope_scaling=(8.0, 1.0, 4.0, 8192)),
    "smollm2-135m": ModelArgs(
        n_layer=30, n_head=9, n_kv_head=3, dim=576, intermediate_size=1536, vocab_size=49152,
        rope_base=100000.0, tie_embeddings=True,
    ),
    "qwen2.5-0.5b": ModelArgs(
        n_layer=24, n_head=14, n_kv_head=2, dim=896, intermediate_size=4864, vocab_size=151936,
        rope_base=1000000.0, norm_eps=1e-6, tie_embeddings=True, qkv_bias=True,
    ),
    "tiny": ModelArgs(n_layer=2, n_head=4, n_kv_head=2, dim=64, intermediate_size=128, vocab_size=256, rope_base=10000.0),
}


FP8_MAX = 448.0  # the largest finite float8_e4m3fn
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # kv_cache_dtype by name, as vLLM spells them


def resolve_kv_cache_dtype(kv_cache_dtype: object, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's dtype: ``None`` / ``"auto"`` → the model's; ``"fp8"`` / ``"fp8_e4m3"`` /
    ``torch.float8_e4m3fn`` → e4m3 with per-KV-head scales; the model's own dtype as a torch dtype.
    e5m2 and other dtypes: ValueError naming ``kv_cache_dtype``."""
    if kv_cache_dtype is None or kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype in ("fp8", "fp8_e4m3", FP8):
        return FP8
    if kv_cache_dtype == model_dtype:
        return model_dtype
    if isinstance(kv_cache_dtype, str) or isinstance(kv_cache_dtype, torch.dtype):
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, torch.float8_e4m3fn or the model's dtype "
                         f"{model_dtype}, got {kv_cache_dtype!r}" + (": only e4m3 fp8 caches are supported"
                                                                    if "e5m2" in str(kv_cache_dtype) else ""))
    raise TypeError(f"kv_cache_dtype must be a str or torch.dtype, got {type(kv_cache_dtype).__name__} {kv_cache_dtype!r}")


class KVCache(nn.Module):
    """Static K/V of every sequence, NHD: ``[B, L_max, H_kv, d]`` (what santa's kernels read).

    An fp8 cache (``dtype=torch.float8_e4m3fn``) holds ``K / k_scale`` rounded to e4m3, with one float32
    scale per KV head (``k_scale``, ``v_scale`` ``[H_kv]``): calibrated on every prefill write as
    ``amax / 448`` over that block (pad tokens included), so the prompt fits exactly; later decode
    writes that exceed it saturate at ±448 · scale. The prefill attends the block's fresh K/V in the
    model dtype; decode steps read the fp8 cache. On CUDA a decode step's write is one Triton launch
    (:mod:`santa.kernels.cache_write`, the same bytes as :func:`quantise` and the indexed copy).
    """

    def __init__(self, batch: int, max_len: int, n_kv_head: int, head_dim: int, dtype: torch.dtype, device=None):
        super().__init__()
        shape = (batch, max_len, n_kv_head, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("rows", torch.arange(batch, device=device), persistent=False)
        self.fp8 = dtype == FP8
        if self.fp8:
            self.register_buffer("k_scale", torch.ones(n_kv_head, dtype=torch.float32, device=device), persistent=False)
            self.register_buffer("v_scale", torch.ones(n_kv_head, dtype=torch.float32, device=device), persistent=False)

    def update(self, input_pos: Tensor, k_val: Tensor, v_val: Tensor) -> tuple[Tensor, Tensor]:
        # k_val: [B, T, H_kv, d]. T > 1: input_pos [T], shared by the batch (prefill);
        # T = 1: input_pos [B] (or [1]), sequence b writes at its own position input_pos[b].
        if self.fp8:
            if k_val.shape[1] == 1 and k_val.is_cuda and santa_kernels.use_triton(k_val.device):
                # one launch instead of ten (santa.kernels.cache_write): the same bytes as the lines below
                from santa.kernels.cache_write import fp8_decode_write

                fp8_decode_write(k_val, v_val, k_scale=self.k_scale, v_scale=self.v_scale, k_cache=self.k_cache,
                                 v_cache=self.v_cache, positions=input_pos)
                return self.k_cache, self.v_cache
            if k_val.shape[1] > 1:  # a prefill block: calibrate the scales on it (in place: graphs keep their pointers)
                self.k_scale.copy_(per_head_scale(k_val))
                self.v_scale.copy_(per_head_scale(v_val))
            k_val, v_val = quantise(k_val, self.k_scale), quantise(v_val, self.v_scale)
        # an fp8 cache is written through uint8 views of the same bytes (torch's indexed copies lack fp8 on the CPU)
        as_stored = (lambda t: t.view(torch.uint8)) if self.fp8 else (lambda t: t)
        k_cache, v_cache, k_val, v_val = as_stored(self.k_cache), as_stored(self.v_cache), as_stored(k_val), as_stored(v_val)
        if k_val.shape[1] == 1:
            k_cache.index_put_((self.rows, input_pos), k_val[:, 0])
            v_cache.index_put_((self.rows, input_pos), v_val[:, 0])
        else:
            k_cache.index_copy_(1, input_pos, k_val)
            v_cache.index_copy_(1, input_pos, v_val)
        return self.k_cache, self.v_cache

    def scales(self) -> tuple[Tensor | float, Tensor | float]:
        """``(k_scale, v_scale)`` as santa's kernels take them (1.0 for a cache that is not fp8)."""
        return (self.k_scale, self.v_scale) if self.fp8 else (1.0, 1.0)

    def dequantised(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The caches' values in ``dtype`` (a copy for an fp8 cache: ``cache.float() * scale``)."""
        if not self.fp8:
            return self.k_cache, self.v_cache
        return (dequantised(self.k_cache, self.k_scale, "NHD").to(dtype),
                dequantised(self.v_cache, self.v_scale, "NHD").to(dtype))


def per_head_scale(x: Tensor) -> Tensor:
    """float32 ``[H_kv]``: ``amax / 448`` of ``x [B, T, H_kv, d]`` per KV head (1.0 for an all-zero head)."""
    amax = x.detach().abs().amax(dim=(0, 1, 3)).float()
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def quantise(x: Tensor, scale: Tensor) -> Tensor:
    """``x [B, T, H_kv, d] / scale`` (per KV head), saturated to ±448 and rounded to e4m3."""
    return (x.float() / scale.view(1, 1, -1, 1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8)


def visibility_bias(seq_lens: Tensor, max_len: int, dtype: torch.dtype) -> Tensor:
    """``[B, 1, 1, L_max]``: 0 on the first ``seq_lens[b]`` keys of sequence b, −inf beyond."""
    visible = torch.arange(max_len, device=seq_lens.device) < seq_lens.unsqueeze(-1)  # [B, L_max]
    return torch.zeros(visible.shape, dtype=dtype, device=seq_lens.device).masked_fill_(~visible, -math.inf)[:, None, None]


@dataclass
class DecodeContext:
    """Device state of one decode step (all updated in place, so a captured graph stays valid).

    seq_lens: int32 ``[B]``, keys visible to each sequence's new token (``input_pos + 1``).
    attn_bias: ``[B, 1, 1, L_max]`` in the model dtype, 0 on visible keys and −inf beyond (sdpa).
    positions: int64 ``[B]``, each sequence's query position (``input_pos``, set by :meth:`prepare`):
        with ``layer_keys`` (int64 ``[n_layer, B]``, :func:`santa.rng.layer_key` per sequence)
        the counter of santa's kernels, so a sequence draws by (seed, layer, head, position) whatever
        its batch row, the cache's length or the steps taken (:mod:`santa.rng`).
    plans: the kernels' :class:`~santa.kernels.DecodePlan` per budget in use (each owns its
        workspace), planned by :func:`make_context` outside any CUDA graph.
    attention: a plugged-in attention ``(q [B, H, d], k_cache, v_cache, ctx, layer) → [B, H, d]``
        that replaces the backend's in every decode step (benchmarks), or None.
    kv_scales: per layer, the cache's ``(k_scale, v_scale)`` (float32 ``[H_kv]`` device tensors for an fp8
        cache, 1.0 otherwise), read by the attention of every layer (:func:`make_context` sets them; a context built by
        hand without them attends a cache that is not fp8).
    attend: the attention every layer's decode calls, bound once when the context is made: ``attention`` where one
        is plugged in, else the backend's (:func:`bound_attention`): no per-step choice.
    reads: int64 ``[B, H]`` or None: where given, the kernels add each (sequence, head)'s value rows drawn in every layer
        and step (:meth:`santa.kernels.DecodePlan.run`'s ``reads``): how :mod:`santa.engine` measures an error
        target's reads.
    """

    backend: str
    seq_lens: Tensor
    attn_bias: Tensor | None = None
    budget: int = 128
    layer_budgets: dict[int, int] | None = None  # {layer: S} overriding ``budget`` there (santa tune budgets)
    error_target: float | None = None  # each head's budget from a relative error target; budget is then the cap
    pilot: int = DEFAULT_PILOT  # the error target's pilot draws per head
    seed: int = 0
    positions: Tensor | None = None
    layer_keys: Tensor | None = None
    plans: dict[int, santa_kernels.DecodePlan] | None = None  # the kernels' plan per budget in use
    santa_impl: str = "auto"  # "auto" / "kernels": santa.kernels.decode; "torch": santa.kernels.reference
    attention: Callable[[Tensor, Tensor, Tensor, DecodeContext, int], Tensor] | None = None
    kv_scales: list[tuple[Tensor | float, Tensor | float]] | None = None  # per layer (k_scale, v_scale): an fp8 cache's
    reads: Tensor | None = None  # int64 [B, H]: value rows drawn, summed over layers and steps (the kernels add them)
    batch_invariant: bool = False  # the kernels' plans run the Triton prop (santa.kernels.BATCH_INVARIANT): make_context
    attend: Callable[[Tensor, Tensor, Tensor, DecodeContext, int], Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.attend = self.attention if self.attention is not None else bound_attention(self.backend, self.santa_impl)

    def prepare(self, input_pos: Tensor) -> None:
        """Make key ``input_pos[b]`` visible to sequence b: ``seq_lens = input_pos + 1``, ``positions =
        input_pos``. input_pos: [B] or [1]."""
        self.seq_lens.copy_((input_pos + 1).to(torch.int32).expand_as(self.seq_lens))
        if self.positions is not None:
            self.positions.copy_(input_pos.expand_as(self.positions))
        if self.attn_bias is not None:
            self.attn_bias.copy_(visibility_bias(self.seq_lens, self.attn_bias.shape[-1], self.attn_bias.dtype))

    def budget_for(self, layer: int) -> int:
        """S in ``layer``: its entry of ``layer_budgets``, else ``budget``."""
        return schedule_file.budget_for(layer, layer_budgets=self.layer_budgets, budget=self.budget)

    def plan_of(self, layer: int, q: Tensor, k_cache: Tensor) -> santa_kernels.DecodePlan:
        """The kernels' plan for ``layer``'s budget (planned here on first use where
        :func:`make_context` did not plan it: a context built by hand)."""
        budget = self.budget_for(layer)
        plan = None if self.plans is None else self.plans.get(budget)
        if plan is None:
            plan = plan_kernel(self.backend, q, k_cache, budget, error_target=self.error_target, pilot=self.pilot,
                               batch_invariant=self.batch_invariant)
            self.plans = {**(self.plans or {}), budget: plan}
        return plan


def plan_kernel(backend: str, q: Tensor, k_cache: Tensor, budget: int, *, error_target: float | None = None,
                pilot: int = DEFAULT_PILOT, batch_invariant: bool = False) -> santa_kernels.DecodePlan:
    """The :class:`~santa.kernels.DecodePlan` of a ``santa-*`` backend for ``q [B, H, d]`` over the
    NHD cache ``k_cache [B, L_max, H_kv, d]`` at ``budget`` samples per head (the cap, with an error target);
    ``batch_invariant``: the Triton prop's two launches on every call (:func:`make_context`)."""
    batch, heads, head_dim = q.shape
    return santa_kernels.plan_decode(
        batch=batch, heads=heads, kv_heads=k_cache.shape[2], head_dim=head_dim, n_keys=k_cache.shape[1], budget=budget,
        dtype=q.dtype, device=q.device, kernel=by_model_backend(backend).kernel, kv_dtype=k_cache.dtype,
        error_target=error_target, pilot=pilot, tuning=santa_kernels.BATCH_INVARIANT if batch_invariant else None,
    )


def make_context(
    model: Transformer, backend: str, *, prompt_len: int | Tensor, budget: int = 128, seed: int = 0, santa_impl: str = "auto",
    layer_budgets: dict[int, int] | None = None, attention: Callable[..., Tensor] | None = None,
    error_target: float | None = None, pilot: int = DEFAULT_PILOT, batch_invariant: bool = False,
) -> DecodeContext:
    """A context for decoding after prompts of ``prompt_len`` tokens (caches already set up).

    prompt_len: one int for the batch, or int ``[B]`` per sequence.
    layer_budgets: ``{layer: S}`` for the sampled backends (e.g. from
    :func:`santa.budgets.schedule.load_layer_budgets`); layers not in it use ``budget``. Refused with
    the dense backend, which has no budget to override.
    error_target: a relative error ε > 0 for the sampled backends but top-k (:mod:`santa.error_target`): each head
    draws ``min(S, max(S₀, ⌈T̂ / (ε² N̂)⌉))`` samples from a pilot of ``pilot`` draws, S (``budget`` or the layer's) the cap.
    attention: plug in an attention of your own (benchmarks): a callable ``(q [B, H, d], k_cache,
    v_cache [B, L_max, H_kv, d], ctx, layer) → [B, H, d]``, run in every layer of every decode step
    (sequence b sees its first ``ctx.seq_lens[b]`` keys); ``backend`` then names it and must not be
    one of santa's (:data:`santa.methods.METHODS`). Whether it can be captured in a CUDA graph is
    the caller's business.
    batch_invariant: a bool. A prompt draws the same uniforms alone or batched on every path (:mod:`santa.rng`), and
    the same samples wherever its CDF does not depend on the batch: the kernels' torch reference, the Triton prop. On
    Hopper the prop kernel's default, the one-launch CUDA prop, sums its float32 CDF in slices that follow the batch
    and the cache's length, so a sample lying within float32 rounding of a CDF step may move with them. True makes
    the kernels' plans run the Triton prop on every call (``santa.kernels.BATCH_INVARIANT``): the same samples, bit for bit,
    alone or batched, at the Triton prop's speed (slower than the one launch on Hopper: benchmarks/RESULTS.md).
    """
    check_flag("batch_invariant", batch_invariant)
    if attention is not None:
        if not callable(attention):
            raise TypeError(f"attention must be a callable (q, k_cache, v_cache, ctx, layer) -> out, got {type(attention).__name__}")
        if not isinstance(backend, str) or not backend or by_model_backend(backend) is not None:
            raise ValueError(f"backend names a plugged-in attention: a string that is not one of santa's backends "
                             f"{tuple(m.model_backend for m in METHODS.values())}, got {backend!r}")
    else:
        check_backend(backend)
    if santa_impl not in SANTA_IMPLS:
        raise ValueError(f"santa_impl must be one of {SANTA_IMPLS}, got {santa_impl!r}")
    check_model(model)
    budget = check_budget(budget)
    seed = rng.check_seed(seed)  # every seed in [0, 2**63) is legal: layer keys come from santa.rng
    layer_budgets = checked_layer_budgets(layer_budgets, model.args.n_layer)
    method = by_model_backend(backend)
    if layer_budgets is not None and method is METHODS["dense"]:
        raise ValueError(f"layer_budgets sets samples per layer for a sampling backend; backend {backend!r} reads every key")
    pilot = check_pilot(pilot, targeted=error_target is not None)  # a pilot without a target is refused, not ignored
    if error_target is not None:
        error_target = check_error_target(error_target)
        if method is None or not method.takes_error_target:
            raise ValueError(f"error_target needs a sampling backend with a global draw (prop or a reference sampler), "
                             f"got backend {backend!r}")
    if method is not None and method.kernel:  # the kernels' limit, for santa_impl="torch" too: one contract per backend
        for name, s in [("budget", budget), *((f"layer_budgets[{k}]", v) for k, v in (layer_budgets or {}).items())]:
            if s > santa_kernels.MAX_BUDGET:
                raise ValueError(f"{name} must lie in [1, {santa_kernels.MAX_BUDGET}] samples per head for backend {backend!r}, got {s}")
    cache = model.layers[0].attention.kv_cache
    if cache is None:
        raise ValueError("model has no KV cache: call model.setup_caches(batch, max_len) before make_context")
    batch, max_len = cache.k_cache.shape[:2]
    device, dtype = cache.k_cache.device, model.output.weight.dtype  # q's dtype (the cache may be fp8)
    seq_lens = checked_prompt_len(prompt_len, batch, max_len).to(device)
    ctx = DecodeContext(
        backend=backend,
        seq_lens=seq_lens.expand(batch).clone(),
        budget=budget,
        layer_budgets=layer_budgets,
        error_target=error_target,
        pilot=pilot,
        seed=seed,
        positions=(seq_lens.expand(batch) - 1).long().clone(),
        layer_keys=torch.tensor([[rng.layer_key(seed, layer)] * batch for layer in range(model.args.n_layer)],
                                dtype=torch.int64, device=device),
        santa_impl=santa_impl,
        attention=attention,
        kv_scales=[layer.attention.kv_cache.scales() for layer in model.layers],
        batch_invariant=batch_invariant,
    )
    if backend == "sdpa":
        ctx.attn_bias = visibility_bias(ctx.seq_lens, max_len, dtype)
    elif ctx.attend is kernel_decode:
        q = torch.empty(batch, model.args.n_head, model.args.head_dim, dtype=dtype, device=device)
        ctx.plans = {s: plan_kernel(backend, q, cache.k_cache, s, error_target=error_target, pilot=pilot,
                                    batch_invariant=batch_invariant)
                     for s in {budget, *(layer_budgets or {}).values()}}
        for plan in ctx.plans.values():
            plan.workspace  # noqa: B018 (allocated now, outside any CUDA graph)
    return ctx


def check_backend(backend: object) -> None:
    """One of :data:`BACKENDS` or :data:`REFERENCE_BACKENDS`; the benchmarks' former backends
    (:data:`MOVED_TO_BENCHMARKS`) are refused naming where they went."""
    if backend in MOVED_TO_BENCHMARKS:
        raise ValueError(f"backend {backend!r} is not santa.model's: it is an attention of the benchmarks, which santa bench e2e "
                         f"plugs in with make_context(..., attention=fn) (benchmarks/bench/e2e.py, in a source checkout)")
    if backend not in BACKENDS + REFERENCE_BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS + REFERENCE_BACKENDS}, got {backend!r}")


def check_model(model: object) -> None:
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a santa.model.Transformer, got {type(model).__name__}")


def checked_layer_budgets(layer_budgets: object, n_layer: int) -> dict[int, int] | None:
    """``{layer: S}`` with layers in [0, n_layer) and budgets ≥ 1 (numpy ints accepted), or None."""
    if layer_budgets is None:
        return None
    if not isinstance(layer_budgets, Mapping):
        raise TypeError(f"layer_budgets must be a dict {{layer: budget}}, got {type(layer_budgets).__name__}")
    checked = {}
    for layer, s in layer_budgets.items():
        layer = integer("layer_budgets key (a layer index)", layer, low=0, high=n_layer)
        checked[layer] = check_budget(s, f"layer_budgets[{layer}]")
    return checked


def checked_prompt_len(prompt_len: object, batch: int, max_len: int) -> Tensor:
    """int32 ``[1]`` or ``[B]``: one int for the batch, or B ints (a list or an integer tensor), each in [1, max_len]."""
    expected = f"an int or [B={batch}] ints in [1, {max_len}]"
    if isinstance(prompt_len, Tensor):
        if prompt_len.is_floating_point() or prompt_len.is_complex() or prompt_len.dtype == torch.bool or prompt_len.dim() > 1:
            raise TypeError(f"prompt_len must be {expected}, got a {prompt_len.dtype} tensor of shape {tuple(prompt_len.shape)}")
        values = prompt_len.reshape(-1).tolist()
    elif isinstance(prompt_len, Sequence) and not isinstance(prompt_len, (str, bytes)):
        values = list(prompt_len)
    else:
        values = [prompt_len]
    if len(values) not in (1, batch):
        raise ValueError(f"prompt_len must be {expected}, got {len(values)} values")
    values = [integer("prompt_len", n, low=1, high=max_len + 1) for n in values]
    return torch.tensor(values, dtype=torch.int32)


def _santa_kernels(impl: str):
    """:mod:`santa.kernels` (Triton on CUDA or under TRITON_INTERPRET=1, its torch reference
    otherwise), or None for ``impl="torch"``: :mod:`santa.kernels.reference` on every device."""
    return None if impl == "torch" else santa_kernels


def apply_rope(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    # x: [B, T, H, d]; cos, sin_signed: [B or 1, T, 1, d] in x's dtype. HF's rotate_half convention,
    # x·cos + rotate_half(x)·sin with rotate_half(x) = [−x2, x1] = roll(x, d/2)·[−1, 1]: three kernels.
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


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
        self.wqkv = nn.Linear(args.dim, (h + 2 * hkv) * d, bias=args.qkv_bias)
        self.wo = nn.Linear(h * d, args.dim, bias=False)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, input_pos: Tensor, ctx: DecodeContext | None) -> Tensor:
        # x: [B, T, D]; cos, sin: [B or 1, T, 1, d]; input_pos: [T] (prefill) or [B] (decode, T = 1)
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
            # the context's bound attention: q [B, H, d] contiguous, caches [B, L_max, H_kv, d], sequence b seeing its
            # first seq_lens[b] keys → [B, H, d]
            y = ctx.attend(q[:, 0].contiguous(), k_cache, v_cache, ctx, self.layer_id).unsqueeze(1)  # [B, 1, H, d]
        return self.wo(y.reshape(bsz, seqlen, h * d))


# The decode attentions a context binds (DecodeContext.attend): q [B, H, d], the layer's caches [B, L_max, H_kv, d] as
# stored (e4m3 with ctx.kv_scales[layer] for an fp8 cache), sequence b seeing its first ctx.seq_lens[b] keys → [B, H, d].


def layer_scales(ctx: DecodeContext, layer: int, k_cache: Tensor) -> tuple[Tensor | float, Tensor | float]:
    """``(k_scale, v_scale)`` of ``layer``'s cache: ``ctx.kv_scales[layer]``, or 1.0 for a cache that is not fp8."""
    if ctx.kv_scales is not None:
        return ctx.kv_scales[layer]
    if k_cache.dtype == FP8:
        raise ValueError("an fp8 cache needs the context's kv_scales (make_context sets them)")
    return 1.0, 1.0


def stored_values(q: Tensor, k_cache: Tensor, v_cache: Tensor, ctx: DecodeContext, layer: int) -> tuple[Tensor, Tensor]:
    """The caches' values in q's dtype (dequantised copies for an fp8 cache): what the torch attentions read."""
    if k_cache.dtype != FP8:
        return k_cache, v_cache
    k_scale, v_scale = layer_scales(ctx, layer, k_cache)
    return dequantised(k_cache, k_scale, "NHD").to(q.dtype), dequantised(v_cache, v_scale, "NHD").to(q.dtype)


def dense_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, ctx: DecodeContext, layer: int) -> Tensor:
    """Exact attention (SDPA) under the context's visibility bias."""
    k_cache, v_cache = stored_values(q, k_cache, v_cache, ctx, layer)
    y = F.scaled_dot_product_attention(q.unsqueeze(2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                       attn_mask=ctx.attn_bias, enable_gqa=True)  # [B, H, 1, d]
    return y.squeeze(2)


def reference_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, ctx: DecodeContext, layer: int) -> Tensor:
    """:func:`santa.sampled_attention` with the backend's sampler, request-keyed as the kernels draw, and exact where
    the budget covers a sequence's live keys (eager: it reads the host)."""
    k_cache, v_cache = stored_values(q, k_cache, v_cache, ctx, layer)
    sampler, keys, budget = ctx.backend, ctx.layer_keys[layer], ctx.budget_for(layer)
    visible = torch.arange(k_cache.shape[1], device=q.device) < ctx.seq_lens.unsqueeze(-1)  # [B, L_max]
    uniforms = None
    if sampler != "topk":  # request-keyed, as the kernels draw: [B, H, 1(, S)]
        uniforms = reference.sampler_uniforms(keys, ctx.positions.unsqueeze(1), q.shape[1], sampler, budget)
        uniforms = uniforms.to(q.device, torch.float64)
        if ctx.error_target is not None:  # the pilot's too (systematic for every sampler, on a stream of its own)
            pilot = reference.pilot_uniforms(keys, ctx.positions.unsqueeze(1), q.shape[1], sampler)
            uniforms = (pilot.to(q.device, torch.float64), uniforms)
    y = sampled_attention(q.unsqueeze(2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), budget, sampler=sampler,
                          attn_mask=visible[:, None, None], enable_gqa=True, uniforms=uniforms,
                          error_target=ctx.error_target, pilot=ctx.pilot)  # [B, H, 1, d]
    covered = ctx.seq_lens <= budget  # the one rule of every path: S covers the sequence's live keys → exact
    if bool(covered.any()):  # (a host read: this path is eager)
        exact = F.scaled_dot_product_attention(q.unsqueeze(2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                               attn_mask=visible[:, None, None], enable_gqa=True)
        y = torch.where(covered[:, None, None, None], exact.to(y.dtype), y)
    return y.squeeze(2)


def kernel_reference_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, ctx: DecodeContext, layer: int) -> Tensor:
    """The backend's kernel as :mod:`santa.kernels.reference` computes it (``santa_impl="torch"``; eager)."""
    k_cache, v_cache = stored_values(q, k_cache, v_cache, ctx, layer)
    kernel = by_model_backend(ctx.backend).kernel
    kwargs = {"tile": santa_kernels.flash_tile(q.shape[-1])} if kernel == "flash" else {}
    ref = reference.prop_reference if kernel == "prop" else reference.flash_reference
    if ctx.error_target is not None:
        kwargs.update(error_target=ctx.error_target, pilot=ctx.pilot)
    return ref(q, k_cache, v_cache, ctx.budget_for(layer), seq_lens=ctx.seq_lens, seed=ctx.layer_keys[layer],
               positions=ctx.positions, **kwargs)[0]


def kernel_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, ctx: DecodeContext, layer: int) -> Tensor:
    """The layer budget's plan, run (:meth:`DecodePlan.run`: the tensors' host metadata checked, no value read, no host
    sync; the keys and positions are device tensors, so a captured graph follows them); an fp8 cache is read as stored,
    with its scales."""
    k_scale, v_scale = layer_scales(ctx, layer, k_cache)
    return ctx.plan_of(layer, q, k_cache).run(q, k_cache, v_cache, seq_lens=ctx.seq_lens, seed=ctx.layer_keys[layer],
                                              positions=ctx.positions, k_scale=k_scale, v_scale=v_scale, reads=ctx.reads)


def bound_attention(backend: str, santa_impl: str = "auto") -> Callable[[Tensor, Tensor, Tensor, DecodeContext, int], Tensor]:
    """The decode attention of one of santa.model's backends (:data:`BACKENDS`, :data:`REFERENCE_BACKENDS`)."""
    if backend == METHODS["dense"].model_backend:
        return dense_decode
    if backend in REFERENCE_BACKENDS:
        return reference_decode
    return kernel_decode if _santa_kernels(santa_impl) is not None else kernel_reference_decode


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

    def setup_caches(self, batch: int, max_len: int, *, kv_cache_dtype: str | torch.dtype | None = None) -> int:
        """Allocate every layer's static cache; returns the cache length (rounded up to 256).

        batch ≥ 1 sequences; max_len in [1, MAX_POSITIONS] positions (int32 on the device).
        kv_cache_dtype: ``None`` / ``"auto"`` (the model's dtype) or ``"fp8"`` / ``"fp8_e4m3"`` /
        ``torch.float8_e4m3fn``: an e4m3 cache with per-KV-head scales calibrated on each prefill
        (:class:`KVCache`); santa's kernels read it directly, the other backends dequantise it.
        """
        batch = integer("batch", batch, low=1)
        max_len = integer("max_len", max_len, low=1, high=MAX_POSITIONS + 1)
        max_len = -(-max_len // CACHE_ALIGN) * CACHE_ALIGN
        weight = self.output.weight
        cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype, weight.dtype)
        for layer in self.layers:
            layer.attention.kv_cache = None  # free the old cache before the new one
        for layer in self.layers:
            layer.attention.kv_cache = KVCache(batch, max_len, self.args.n_kv_head, self.args.head_dim, cache_dtype, weight.device)
        cos, sin = rope_tables(self.args, max_len, weight.device)
        self.rope_cos, self.rope_sin = cos, signed_sin(sin)
        return max_len

    def forward(self, idx: Tensor, input_pos: Tensor, ctx: DecodeContext | None = None, *, lengths: Tensor | None = None) -> Tensor:
        # idx: [B, T]. ctx None: dense prefill from position 0, input_pos [T] shared by the batch;
        # else one decode step (T = 1), input_pos [B] (or [1]): each sequence at its own position.
        # Returns logits [B, T, V] float32, or [B, 1, V] at position lengths[b] − 1 with lengths [B].
        x = self.tok_embeddings(idx)  # [B, T, D]
        cos, sin = self.rope_cos[input_pos].to(x.dtype), self.rope_sin[input_pos].to(x.dtype)  # [T or B, d]
        rope_shape = (1, -1, 1, cos.shape[-1]) if ctx is None else (-1, 1, 1, cos.shape[-1])
        cos, sin = cos.view(rope_shape), sin.view(rope_shape)  # [1, T, 1, d] or [B, 1, 1, d]
        for layer in self.layers:
            x = layer(x, cos, sin, input_pos, ctx)
        if lengths is not None:  # the last real token of each right-padded prompt
            x = x[torch.arange(x.shape[0], device=x.device), lengths - 1].unsqueeze(1)  # [B, 1, D]
        return self.output(self.norm(x)).float()

    @classmethod
    def from_hf(cls, hf_model, dtype: torch.dtype | None = None) -> Transformer:
        """The same weights as a transformers ``LlamaForCausalLM`` or ``Qwen2ForCausalLM``."""
        if not hasattr(hf_model, "config") or not hasattr(hf_model, "state_dict"):
            raise TypeError(f"hf_model must be a transformers causal LM (with .config), got {type(hf_model).__name__}")
        args = ModelArgs.from_hf_config(hf_model.config)
        return cls.from_hf_state_dict(args, hf_model.state_dict(), dtype=dtype)

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> Transformer:
        """A local Llama / Qwen2 checkpoint folder: config.json and model.safetensors, or shards with
        model.safetensors.index.json. Read with safetensors (no transformers, no hub); dtype None
        keeps the checkpoint's (else a floating torch.dtype).

        Raises ValueError naming the file and key of what cannot be used: a malformed config.json
        value, an unreadable (empty, truncated, random) safetensors file, an index naming shards
        outside the folder, tensors that do not match the config; and what santa.model does not
        implement (:func:`santa.checkpoint.args_from_config`).
        """
        dtype = checked_dtype(dtype)
        device = checked_device(device)
        config = checkpoint_folder(path) / "config.json"
        args = ModelArgs(**args_from_config(read_config(path), source=str(config)))
        return cls.from_hf_state_dict(args, read_state_dict(path, device=device), dtype=dtype)

    @classmethod
    def from_hf_state_dict(cls, args: ModelArgs, state: Mapping[str, Tensor], *, dtype: torch.dtype | None = None) -> Transformer:
        """Our model from tensors under transformers' names (checked against ``args``: see check_hf_state_dict)."""
        if not isinstance(args, ModelArgs):
            raise TypeError(f"args must be a santa.model.ModelArgs, got {type(args).__name__}")
        dtype = checked_dtype(dtype)
        ours = state_dict_from_hf(args, state)
        with torch.device("meta"):
            model = cls(args)
        model.load_state_dict(ours, assign=True, strict=True)
        if args.tie_embeddings:
            model.output.weight = model.tok_embeddings.weight
        return model.to(dtype=dtype or model.tok_embeddings.weight.dtype)

    @classmethod
    def random(cls, args: ModelArgs, *, device=None, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Transformer:
        """Random weights made on ``device`` (speed does not depend on their values)."""
        if not isinstance(args, ModelArgs):
            raise TypeError(f"args must be a santa.model.ModelArgs, got {type(args).__name__}")
        dtype = checked_dtype(dtype, allow_none=False)
        seed = integer("seed", seed, low=0, high=2**63)
        with torch.device("meta"):
            model = cls(args).to(dtype)
        model = model.to_empty(device=torch.get_default_device() if device is None else device)  # not left on meta
        if args.tie_embeddings:
            model.output.weight = model.tok_embeddings.weight
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name == "tok_embeddings.weight":
                    p.normal_(0.0, 1.0, generator=gen)
                elif name.endswith(".bias"):
                    p.normal_(0.0, 0.02, generator=gen)
                else:  # keeps activations O(1) through the residual stream
                    p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]), generator=gen)
        return model


def checked_dtype(dtype: object, *, allow_none: bool = True) -> torch.dtype | None:
    """``dtype`` if it is a floating torch.dtype (or None where allowed), else TypeError / ValueError."""
    if dtype is None and allow_none:
        return None
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a floating torch.dtype{' or None' if allow_none else ''}, got {type(dtype).__name__} {dtype!r:.80}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype (the weights are real numbers), got {dtype}")
    return dtype


def load_bundled(name: str = "smollm2-135m", *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """A bundled model (:data:`santa.assets.MODELS`) as ``(Transformer, tokenizer)``, offline."""
    from santa.assets import load_model

    hf_model, tokenizer = load_model(name, dtype=dtype, device=device)
    return Transformer.from_hf(hf_model).eval(), tokenizer


def pad_prompts(prompts: Tensor | Sequence, *, vocab_size: int, device=None) -> tuple[Tensor, Tensor]:
    """Right-padded tokens ``[B, T_max]`` int64 (pad 0) and lengths ``[B]`` int64 on ``device``.

    prompts: an int tensor ``[B, T]`` (every prompt T tokens), or a non-empty sequence of 1-D int
    tensors, arrays or lists of ints, each at least one token in ``[0, vocab_size)``. A prompt
    that is not a sequence of ints is a TypeError; an empty one or an id outside the vocabulary
    a ValueError, naming ``prompts[i]``.
    """
    vocab_size = integer("vocab_size", vocab_size, low=1)
    if isinstance(prompts, Tensor):
        if prompts.dim() != 2 or prompts.shape[0] < 1 or prompts.shape[1] < 1:
            raise ValueError(f"prompts as a tensor must be [B ≥ 1, T ≥ 1] token ids, got shape {tuple(prompts.shape)}")
        prompts = list(prompts)
    if hasattr(prompts, "__array__") and hasattr(prompts, "ndim") and prompts.ndim == 2:  # a numpy [B, T]
        prompts = list(prompts)
    if not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes)):
        raise TypeError(f"prompts must be a non-empty list of token-id sequences or a [B, T] tensor, got {type(prompts).__name__} {prompts!r:.80}")
    if len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token-id sequences or a [B, T] tensor, got an empty one")
    rows = [prompt_row(i, p, vocab_size) for i, p in enumerate(prompts)]
    lengths = torch.tensor([len(r) for r in rows])
    padded = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
    for i, r in enumerate(rows):
        padded[i, : len(r)] = r
    return padded.to(device), lengths.to(device)


def prompt_row(i: int, prompt: object, vocab_size: int) -> Tensor:
    """``prompts[i]`` as int64 ``[T ≥ 1]`` of ids in [0, vocab_size), or TypeError / ValueError naming it."""
    if isinstance(prompt, (str, bytes)):
        raise TypeError(f"prompts[{i}] must be a 1-D sequence of int token ids (tokenize text first), got {prompt!r:.80}")
    try:
        row = torch.as_tensor(prompt)
    except (TypeError, ValueError, RuntimeError):  # ragged, non-numeric, or an id past int64
        items = list(prompt) if isinstance(prompt, Sequence) else None
        if items and all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in items):
            raise ValueError(f"prompts[{i}] holds token ids outside [0, {vocab_size})") from None
        row = None
    if row is None or row.dim() != 1 or (row.numel() and (row.is_floating_point() or row.is_complex() or row.dtype == torch.bool)):
        raise TypeError(f"prompts[{i}] must be a 1-D sequence of int token ids, got {prompt!r:.80}")
    if row.numel() == 0:
        raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token")
    if ((row < 0) | (row >= vocab_size)).any():
        raise ValueError(f"prompts[{i}] holds token ids outside [0, {vocab_size})")
    return row.long()


def prefill(model: Transformer, prompt: Tensor, *, lengths: Tensor | None = None) -> Tensor:
    """Dense prefill of right-padded ``prompt [B, T]`` into the caches; returns the first new token ``[B, 1]``.

    lengths: int64 ``[B]``, real tokens per sequence (default T). Causal attention keeps the pads
    after a sequence's last token out of its logits; their K/V lie beyond its seq_lens. The caches must hold the
    batch and the prompt (:meth:`Transformer.setup_caches`): ValueError naming what is missing otherwise.
    """
    cache = model.layers[0].attention.kv_cache if len(model.layers) else None
    if not isinstance(prompt, Tensor) or prompt.dim() != 2 or prompt.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"prompt must be an int64 tensor of token ids [B, T], got "
                        f"{prompt.dtype if isinstance(prompt, Tensor) else type(prompt).__name__}"
                        f"{f' {tuple(prompt.shape)}' if isinstance(prompt, Tensor) else ''}")
    if cache is None:
        raise ValueError(f"prefill needs the model's caches: call model.setup_caches(batch={prompt.shape[0]}, "
                         f"max_len ≥ {prompt.shape[1]} + the tokens to generate) first")
    cache_batch, cache_len = cache.k_cache.shape[:2]
    if prompt.shape[0] != cache_batch or prompt.shape[1] > cache_len:
        raise ValueError(f"prompt [B={prompt.shape[0]}, T={prompt.shape[1]}] does not fit the caches set up for batch "
                         f"{cache_batch} and {cache_len} positions: call model.setup_caches(batch={prompt.shape[0]}, "
                         f"max_len ≥ {prompt.shape[1]} + the tokens to generate)")
    input_pos = torch.arange(prompt.shape[1], device=prompt.device)
    if lengths is None:
        lengths = torch.full((prompt.shape[0],), prompt.shape[1], device=prompt.device)
    logits = model(prompt, input_pos, lengths=lengths)  # [B, 1, V]
    return logits[:, -1].argmax(-1, keepdim=True)


def decode_step(model: Transformer, token: Tensor, input_pos: Tensor, ctx: DecodeContext) -> Tensor:
    """One greedy step: ``token [B, 1]``, sequence b at position ``input_pos[b]`` (``[B]``, or ``[1]``
    shared) → next token ``[B, 1]``.

    Device work only (no host sync), so it can be captured; the caller advances input_pos
    (:func:`advance`), inside the graph too.
    """
    ctx.prepare(input_pos)
    logits = model(token, input_pos, ctx)  # [B, 1, V]
    return logits[:, -1].argmax(-1, keepdim=True)


def advance(token: Tensor, next_token: Tensor, input_pos: Tensor, *, stop_tokens: Tensor | None = None, done: Tensor | None = None) -> None:
    """``token ← next_token``, ``input_pos += 1``: device work only (capturable).

    With ``done`` (bool ``[B]``, input_pos ``[B]``) and ``stop_tokens`` (int64 ``[n_stop]``): a
    finished sequence keeps its token and position (it is no longer extended), and ``done`` gains
    every sequence whose new token is a stop token.
    """
    if done is not None:
        next_token = torch.where(done.unsqueeze(-1), token, next_token)  # [B, 1]
        input_pos.add_((~done).to(input_pos.dtype))
        done.logical_or_((next_token == stop_tokens).any(-1))
    else:
        input_pos.add_(1)
    token.copy_(next_token)


def greedy_step(model: Transformer, ctx: DecodeContext, token: Tensor, input_pos: Tensor, *, stop_tokens: Tensor | None = None,
                done: Tensor | None = None) -> Callable[[], None]:
    """The loop's step as a zero-argument function over device buffers (``token [B, 1]``, ``input_pos``
    ``[B]`` or ``[1]``, and ``done``/``stop_tokens`` as in :func:`advance`): :func:`decode_step` then
    :func:`advance`, in place, device work only, so one CUDA graph can hold it."""

    def step() -> None:
        advance(token, decode_step(model, token, input_pos, ctx), input_pos, stop_tokens=stop_tokens, done=done)

    return step


def capturable(model: Transformer, backend: str, santa_impl: str = "auto") -> bool:
    """Whether the decode step of ``backend`` on ``model`` can be one CUDA graph: a CUDA model and a
    capturable method (:data:`santa.methods.METHODS`; a plugged-in attention counts as capturable), not the kernels' torch reference (``santa_impl="torch"`` reads the keys and positions on the host)."""
    method = by_model_backend(backend)  # None: a plugged-in attention (a benchmark's)
    if model.output.weight.device.type != "cuda" or (method is not None and not method.capturable):
        return False
    return not (method is not None and method.kernel and santa_impl == "torch")


def cuda_graph_of(step) -> torch.cuda.CUDAGraph:
    """Run ``step()`` once on a side stream (a real step that warms up Triton, cuBLAS and the
    allocator), then capture it; replaying the graph runs one more step."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


@torch.inference_mode()
def generate(
    model: Transformer,
    prompts: Tensor | Sequence,
    max_new_tokens: int,
    *,
    backend: str = "sdpa",
    budget: int = 128,
    layer_budgets: dict[int, int] | None = None,
    seed: int = 0,
    santa_impl: str = "auto",
    stop_tokens: Iterable[int] = (),
    cuda_graph: bool | None = None,
    kv_cache_dtype: str | torch.dtype | None = None,
    error_target: float | None = None,
    pilot: int = DEFAULT_PILOT,
    dense_below: int = 0,
    batch_invariant: bool = False,
) -> list[Tensor]:
    """Greedy batched generation: prompts of any lengths (see :func:`pad_prompts`) → one int64 1-D
    tensor of new tokens per prompt, ``max_new_tokens`` long or ending at its first stop token.

    max_new_tokens: an int ≥ 1 (prompt + new tokens at most :data:`MAX_POSITIONS`).
    backend: one of :data:`BACKENDS` or :data:`REFERENCE_BACKENDS`; budget: S
    (k for topk), an int ≥ 1; layer_budgets: ``{layer: S}`` overriding it per layer (a ``santa
    tune budgets`` schedule). seed: an int in [0, 2**63). stop_tokens: an iterable (list, tuple, set,
    1-D int tensor or array) of token ids, ints in ``[0, vocab_size)``; ``()`` for none (a bare
    int, a string or None is refused: wrap one id as ``[id]``). cuda_graph: None or a bool:
    replay the decode step from one CUDA graph (default: on CUDA whenever the backend is
    capturable, i.e. not a reference backend or santa_impl="torch"). kv_cache_dtype: the cache's
    dtype, ``None`` for the model's or ``"fp8"`` (:meth:`Transformer.setup_caches`). error_target, pilot:
    budgets from a relative error target, budget the cap (:func:`make_context`). dense_below: keys, an int ≥ 0 (0, the
    default: no such step): a decode step whose longest sequence sees fewer keys runs the dense backend ("sdpa"), as
    santa's vLLM backend does by default (:func:`decode_tokens`); such a step costs what ``backend="sdpa"`` costs (the
    whole cache, masked). batch_invariant: a bool; True: the same samples bit for bit alone or batched on Hopper too,
    at the Triton prop's speed (:func:`make_context`).

    Integers may be Python or numpy ints; the wrong type (a float, a string, a bool) is a
    TypeError, a bad value a ValueError, both naming the argument.
    """
    check_model(model)
    seed = rng.check_seed(seed)
    max_new_tokens = integer("max_new_tokens", max_new_tokens, low=1)
    if cuda_graph is not None and not isinstance(cuda_graph, bool):
        raise TypeError(f"cuda_graph must be None or a bool, got {type(cuda_graph).__name__} {cuda_graph!r:.80}")
    check_backend(backend)
    device = model.output.weight.device
    can_capture = capturable(model, backend, santa_impl)
    if cuda_graph and not can_capture:
        raise ValueError(f"cuda_graph=True needs a CUDA model and a capturable backend, got {device.type} and {backend!r} ({santa_impl=})")
    use_graph = can_capture if cuda_graph is None else cuda_graph
    stops = torch.tensor(checked_stop_tokens(stop_tokens, model.args.vocab_size), dtype=torch.long, device=device)  # [n_stop]
    padded, lengths = pad_prompts(prompts, vocab_size=model.args.vocab_size, device=device)  # [B, T_max], [B]
    if padded.shape[1] + max_new_tokens > MAX_POSITIONS:
        raise ValueError(f"max_new_tokens must keep prompt + new tokens ≤ {MAX_POSITIONS}, got {padded.shape[1]} + {max_new_tokens}")
    dense_below = integer("dense_below", dense_below, low=0)
    if dense_below and check_flag("batch_invariant", batch_invariant):
        raise ValueError(f"dense_below must be 0 with batch_invariant=True (a step runs dense attention when its longest "
                         f"sequence sees fewer keys, so a prompt's tokens would depend on its batch), got {dense_below}")
    model.setup_caches(padded.shape[0], padded.shape[1] + max_new_tokens, kv_cache_dtype=kv_cache_dtype)
    ctx = make_context(model, backend, prompt_len=lengths, budget=budget, seed=seed, santa_impl=santa_impl,
                       layer_budgets=layer_budgets, error_target=error_target, pilot=pilot, batch_invariant=batch_invariant)
    dense = dense_steps(model, backend, lengths, dense_below)
    token = prefill(model, padded, lengths=lengths)  # [B, 1]
    rows = decode_tokens(model, ctx, token, lengths, max_new_tokens, stop_tokens=stops, cuda_graph=use_graph, dense=dense)
    return [torch.tensor(row, dtype=torch.long) for row in rows]


def checked_stop_tokens(stop_tokens: object, vocab_size: int) -> list[int]:
    """``stop_tokens`` as a list of ints in [0, vocab_size): an iterable of ints (numpy ints and
    1-D int tensors too); a bare int, a string, None or a float is a TypeError."""
    if isinstance(stop_tokens, Tensor):
        if stop_tokens.dim() > 1 or stop_tokens.is_floating_point() or stop_tokens.is_complex() or stop_tokens.dtype == torch.bool:
            raise TypeError(f"stop_tokens as a tensor must be 1-D integer token ids, got {stop_tokens.dtype} of shape {tuple(stop_tokens.shape)}")
        stop_tokens = stop_tokens.reshape(-1).tolist()
    if isinstance(stop_tokens, (str, bytes)) or not isinstance(stop_tokens, Iterable):
        hint = f" (wrap one id: [{stop_tokens}])" if isinstance(stop_tokens, numbers.Integral) else ""
        raise TypeError(f"stop_tokens must be an iterable of token ids (ints), () for none, got {type(stop_tokens).__name__} {stop_tokens!r:.80}{hint}")
    return [integer(f"stop_tokens[{i}]", t, low=0, high=vocab_size) for i, t in enumerate(stop_tokens)]


class DenseSteps(NamedTuple):
    """The steps :func:`decode_tokens` gives to dense attention: those whose longest sequence sees fewer than ``below``
    keys (``longest`` + the step's index: the longest prompt's keys and the tokens since), decoded with ``ctx``."""

    ctx: DecodeContext
    below: int
    longest: int


def dense_steps(model: Transformer, backend: str, lengths: Tensor, below: int) -> DenseSteps | None:
    """The dense steps of a loop after prompts of ``lengths`` tokens (``[B]``; one host read), or None: ``below`` 0, a
    dense backend, or no step short enough."""
    if below == 0 or by_model_backend(backend) is METHODS["dense"]:
        return None
    longest = int(lengths.max())
    if longest + 1 >= below:  # the first decode step already sees ≥ below keys
        return None
    return DenseSteps(make_context(model, METHODS["dense"].model_backend, prompt_len=lengths), below, longest)


def decode_tokens(
    model: Transformer, ctx: DecodeContext, token: Tensor, lengths: Tensor, max_new_tokens: int, *,
    stop_tokens: Tensor, cuda_graph: bool, dense: DenseSteps | None = None, on_step: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """The greedy decode loop after a prefill (the one loop: :func:`generate` and :mod:`santa.engine`
    run it): ``token`` ``[B, 1]`` (the prefill's next tokens, at positions ``lengths`` ``[B]``) → each
    row's ``max_new_tokens`` tokens, cut after its first stop token (``stop_tokens`` int64
    ``[n_stop]``). With ``cuda_graph`` the first step is captured and the others replay it; the host
    reads the device only every :data:`STOP_CHECK_EVERY` steps (has every sequence stopped?). ``dense``
    (:func:`dense_steps`): the steps whose longest sequence sees fewer than ``dense.below`` keys run ``dense.ctx``
    instead (chosen on the host, one graph each: no launch of the other). ``on_step(i)``: called on the host after
    step i (1, 2, …) is launched (a timer's hook: :func:`santa.engine.decode` starts its clock after step 1, which
    captures the graph)."""
    token, input_pos = token.clone(), lengths.clone()  # [B, 1], [B]: the position of each sequence's `token`
    done = (token == stop_tokens).any(-1)  # [B]
    steps = {False: greedy_step(model, ctx, token, input_pos, stop_tokens=stop_tokens, done=done)}
    if dense is not None:  # the same buffers: the two steps take turns on one loop state
        steps[True] = greedy_step(model, dense.ctx, token, input_pos, stop_tokens=stop_tokens, done=done)
    out, graphs = [token.clone()], {}
    for i in range(1, max_new_tokens):
        if i % STOP_CHECK_EVERY == 0 and bool(done.all()):
            break
        short = dense is not None and dense.longest + i < dense.below  # step i's longest sequence sees longest + i keys
        if not short and graphs.pop(True, None) is not None:  # past the dense steps for good: free their graph
            del steps[True]
        if short in graphs:
            graphs[short].replay()
        elif cuda_graph:
            graphs[short] = cuda_graph_of(steps[short])  # this step runs eagerly, the next ones replay
        else:
            steps[short]()
        out.append(token.clone())
        if on_step is not None:
            on_step(i)
    rows = torch.cat(out, dim=1).tolist()
    stop_set = set(stop_tokens.tolist())
    return [row[: next((j + 1 for j, t in enumerate(row) if t in stop_set), len(row))] for row in rows]


__all__ = [
    "BACKENDS",
    "CONFIGS",
    "REFERENCE_BACKENDS",
    "DecodeContext",
    "KVCache",
    "ModelArgs",
    "Transformer",
    "advance",
    "capturable",
    "decode_step",
    "decode_tokens",
    "dense_steps",
    "generate",
    "greedy_step",
    "load_bundled",
    "make_context",
    "pad_prompts",
    "prefill",
]
