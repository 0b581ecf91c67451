"""``sampled_attention``: the SDPA-shaped reference of SANTA / S²ANTA, with dense and top-k baselines.

Computed in float32 on any device that holds values (not ``meta``); returns the input dtype. This
is the spec every kernel is tested against, not a fast path.
"""

from __future__ import annotations

import math

import torch

from santa.bernoulli import SCORE_SAMPLERS, bernoulli_query
from santa.checks import has_values
from santa.checks import scale as checked_scale
from santa.error_target import (
    DEFAULT_PILOT,
    ErrorTargetDraw,
    adaptive_budgets,
    check_error_target,
    check_pilot,
    pilot_statistics,
)
from santa.sampling import (
    SAMPLERS,
    check_budget,
    check_draws,
    check_generator,
    check_sampler,
    sample_counts,
    sample_counts_per_row,
)

ATTENTION_SAMPLERS = (*SAMPLERS, "topk", "dense")


def _check_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16, float32, float64), got {x.dtype}")
    if x.dim() != 4:
        raise ValueError(f"{name} must have shape [B, H, L, D] (4 dims), got {tuple(x.shape)}")
    return x


def check_qkv(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, enable_gqa: bool
) -> tuple[int, int]:
    """Validate SDPA-shaped q ``[B, Hq, Lq, D]``, k/v ``[B, Hkv, Lk, D]``; return ``(Hq, Hkv)``."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        _check_tensor(name, x)
    if not (query.device == key.device == value.device):
        raise ValueError(
            f"query, key and value must be on one device, got {query.device}, {key.device}, {value.device}"
        )
    for name, x in (("query", query), ("key", key), ("value", value)):
        has_values(name, x)  # the samplers read the probabilities' values (meta tensors have none)
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key and value must have one dtype (as in SDPA), got {query.dtype}, {key.dtype}, {value.dtype}")
    check_flag("enable_gqa", enable_gqa)
    batch, hq, _, dim = query.shape
    if hq < 1 or dim < 1:
        raise ValueError(f"query must have Hq ≥ 1 heads and head dim D ≥ 1, got shape {tuple(query.shape)}")
    if key.shape != value.shape:
        raise ValueError(f"key and value must have the same shape [B, Hkv, Lk, D], got {tuple(key.shape)} and {tuple(value.shape)}")
    if key.shape[0] != batch:
        raise ValueError(f"key batch {key.shape[0]} does not match query batch {batch}")
    if key.shape[3] != dim:
        raise ValueError(f"key head dim D={key.shape[3]} does not match query D={dim}")
    if key.shape[2] < 1:
        raise ValueError("key must hold at least one key (Lk ≥ 1)")
    hkv = key.shape[1]
    if hkv != hq:
        if not enable_gqa:
            raise ValueError(f"query has {hq} heads but key/value have {hkv}: pass enable_gqa=True for grouped-query attention")
        if hkv < 1 or hq % hkv != 0:
            raise ValueError(f"query heads Hq={hq} must be a multiple of key/value heads Hkv={hkv}")
    return hq, hkv


def check_flag(name: str, value: object) -> bool:
    """Return ``value``, or raise unless it is a bool (``is_causal="no"`` is truthy, not False)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_scale(scale: object, dim: int) -> float:
    """The score scale: ``1/√D`` for None, else ``scale`` as a finite float (0 and negatives are allowed)."""
    scale = checked_scale(scale)
    if scale is None:
        if dim < 1:
            raise ValueError(f"head dim D must be ≥ 1 for the default scale 1/√D, got D={dim}")
        return 1.0 / math.sqrt(dim)
    return scale


def check_mask(attn_mask: object, shape: tuple[int, int, int, int], device: torch.device) -> torch.Tensor:
    """Return ``attn_mask``, or raise unless it is a bool or float tensor on ``device`` that
    broadcasts to ``shape = [B, Hq, Lq, Lk]`` (the output's batch and heads stay those of q)."""
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(f"attn_mask must be bool or floating point, got {attn_mask.dtype}")
    if attn_mask.device != device:
        raise ValueError(f"attn_mask is on {attn_mask.device} but query is on {device}")
    try:
        broadcast = torch.broadcast_shapes(attn_mask.shape, shape)
    except RuntimeError:
        broadcast = None
    if broadcast != torch.Size(shape):
        raise ValueError(f"attn_mask must broadcast to [B, Hq, Lq, Lk] = {list(shape)}, got {list(attn_mask.shape)}")
    return attn_mask


def attention_bias(
    shape: tuple[int, int, int, int],
    *,
    is_causal: bool,
    attn_mask: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor | None:
    """Additive float32 bias broadcastable to ``shape = [B, Hq, Lq, Lk]`` (−inf where masked), or None.

    A causal mask aligns the last query with the last key (as in KV-cached decoding), so
    ``Lq = 1`` sees every key; bool masks mark *visible* keys with True, as in SDPA. Given both,
    both apply. A float mask is added as is: NaN or +inf in it gives NaN rows, as in SDPA.
    """
    check_flag("is_causal", is_causal)
    n_queries, n_keys = shape[2], shape[3]
    bias = None
    if is_causal:
        q_pos = torch.arange(n_queries, device=device).unsqueeze(-1) + (n_keys - n_queries)
        visible = torch.arange(n_keys, device=device) <= q_pos
        bias = torch.zeros(n_queries, n_keys, device=device).masked_fill(~visible, -math.inf)
    if attn_mask is not None:
        check_mask(attn_mask, shape, device)
        if attn_mask.dtype == torch.bool:
            extra = torch.zeros(attn_mask.shape, device=device).masked_fill(~attn_mask, -math.inf)
        else:
            extra = attn_mask.float()
        bias = extra if bias is None else bias + extra
    return bias


def attention_probs(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax weights ``p = softmax(q·kᵀ·scale + bias)`` in float32: ``[B, Hq, Lq, Lk]``.

    key may have fewer heads (GQA, ``Hkv`` dividing ``Hq``): query head h reads KV head
    h // (Hq / Hkv), without copying K. A fully masked row gets all-zero weights (not NaN).
    Non-finite scores follow SDPA: a NaN or +inf score (from NaN/inf in q or k, or in a float
    mask) gives a NaN row; a −inf score is a masked key.
    """
    b, hq, lq, d = query.shape
    hkv, lk = key.shape[1], key.shape[2]
    _check_groups(hq, hkv, "key")
    scale = check_scale(scale, d)
    # Query head h reads KV head h // G: view the G heads of a group as G·Lq rows, no copy of K.
    grouped = query.float().reshape(b, hkv, (hq // hkv) * lq, d)
    scores = torch.matmul(grouped, key.float().transpose(-1, -2)).reshape(b, hq, lq, lk) * scale
    bias = attention_bias((b, hq, lq, lk), is_causal=is_causal, attn_mask=attn_mask, device=query.device)
    if bias is not None:
        scores = scores + bias
    row_max = scores.amax(dim=-1, keepdim=True)
    fully_masked = row_max == -math.inf
    weights = torch.exp(scores - row_max.masked_fill(fully_masked, 0.0))
    return weights / weights.sum(dim=-1, keepdim=True).masked_fill(fully_masked, 1.0)


def topk_probs(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest weights per row and renormalise (biased baseline): ``[..., n]`` → ``[..., n]``."""
    k = min(k, probs.shape[-1])
    top = torch.topk(probs, k, dim=-1)
    kept = torch.zeros_like(probs).scatter_(-1, top.indices, top.values)
    total = kept.sum(dim=-1, keepdim=True)
    return kept / total.masked_fill(total == 0, 1.0)


def value_weights(
    probs: torch.Tensor, budget: int, sampler: str, *, generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weights ``w [..., n]`` with ``ô = Σ_j w_j v_j``, and the sample counts (None for dense, top-k).

    ``"dense"``: w = p. ``"topk"``: the k = budget largest p, renormalised. Samplers: w = c / S, from
    ``uniforms`` when given (the shape :func:`santa.sample_counts` takes), else drawn from ``generator``;
    uniforms with dense or top-k (which draw nothing) are refused (ValueError).
    """
    if uniforms is not None and sampler not in SAMPLERS:
        raise ValueError(f"uniforms are for a stochastic sampler ({', '.join(SAMPLERS)}); sampler {sampler!r} draws none")
    if sampler == "dense":
        return probs, None
    if sampler == "topk":
        return topk_probs(probs, budget), None
    counts = sample_counts(probs, budget, sampler, generator=generator, uniforms=uniforms)
    return counts.float() / budget, counts  # ô = (1/S) Σ_j c_j v_j


def weighted_values(weights: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``ô = w·V`` in float32 (float64 for a float64 value): weights ``[B, Hq, Lq, n]``, value
    ``[B, Hkv, n, D]`` (each KV head serves ``Hq / Hkv`` query heads) → ``[B, Hq, Lq, D]``."""
    b, hq, lq, n = weights.shape
    hkv = value.shape[1]
    _check_groups(hq, hkv, "value")
    grouped = weights.reshape(b, hkv, (hq // hkv) * lq, n)  # the G query heads of a KV head, as rows
    value = value if value.dtype == torch.float64 else value.float()
    return torch.matmul(grouped.to(value.dtype), value).reshape(b, hq, lq, value.shape[-1])


def sampled_values(
    probs: torch.Tensor, value: torch.Tensor, budget: int, sampler: str, *, generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``ô [B, Hq, Lq, D]`` float32 from ``probs [B, Hq, Lq, n]`` and ``value [B, Hkv, n, D]``, and the
    counts (None for dense, top-k).

    A NaN row of probs (NaN or +inf among its scores) gives a NaN output row and zero counts; the
    other rows are drawn as if it were finite (the same uniforms). NaN or inf in value reaches
    every output row of its batch element and KV group through ``w·V`` (``0·NaN = NaN``), as in SDPA.
    """
    nan_rows = torch.isnan(probs).any(dim=-1, keepdim=True)
    weights, counts = value_weights(probs.masked_fill(nan_rows, 0.0), budget, sampler, generator=generator, uniforms=uniforms)
    return weighted_values(weights, value).masked_fill(nan_rows, math.nan), counts


def error_target_weights(
    probs: torch.Tensor, value: torch.Tensor, cap: int, sampler: str, *, error_target: float, pilot: int = DEFAULT_PILOT,
    generator: torch.Generator | None = None, uniforms: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ErrorTargetDraw]:
    """Weights ``w [B, Hq, Lq, n]`` float32 with ``ô = Σ_j w_j v_j`` and each row's budget chosen for a relative
    error ε (:mod:`santa.error_target`), and what was drawn.

    probs ``[B, Hq, Lq, n]`` (finite rows: mask NaN rows first), value ``[B, Hkv, n, D]`` (GQA as
    :func:`weighted_values`). A pilot of ``pilot`` systematic draws per row estimates the variance trace T̂ and
    ‖o‖² (N̂) — systematic draws whatever ``sampler`` (:mod:`santa.error_target`: its T̂ varies far less); the row
    then draws ``S_r = min(cap, max(pilot, ⌈T̂ / (ε² N̂)⌉))`` samples of ``sampler`` on fresh uniforms: ``w = c / S_r``.
    uniforms: ``(pilot's, output's)``: the pilot's one systematic offset per row ``[B, Hq, Lq]``, the output's as
    :func:`santa.sample_counts` takes them for ``cap`` draws of ``sampler`` (:func:`santa.sampling.sample_counts_per_row`);
    else both drawn from ``generator``, the pilot's first.
    """
    (error_target, pilot), cap = _checked_target(error_target, pilot, sampler), check_budget(cap, "budget")
    if uniforms is not None and (not isinstance(uniforms, tuple) or len(uniforms) != 2):
        raise TypeError("uniforms with error_target must be a pair (the pilot's uniforms, the output's uniforms)")
    pilot_uniforms, output_uniforms = uniforms if uniforms is not None else (None, None)
    pilot_counts = sample_counts(probs, pilot, "systematic", generator=generator, uniforms=pilot_uniforms)
    trace, norm2 = pilot_statistics(*pilot_moments(pilot_counts, value, pilot), pilot)
    budgets = adaptive_budgets(trace, norm2, error_target, cap, pilot)
    counts = sample_counts_per_row(probs, budgets, sampler, cap=cap, generator=generator, uniforms=output_uniforms)
    weights = counts.float() / budgets.unsqueeze(-1).float()  # ô = (1/S_r) Σ_j c_j v_j
    return weights, ErrorTargetDraw(counts, budgets, pilot_counts, trace, norm2)


def _checked_target(error_target: object, pilot: object, sampler: str) -> tuple[float, int]:
    """``(ε, S₀)`` checked, and a stochastic sampler (a pilot sizes a draw: dense and top-k have none)."""
    error_target, pilot = check_error_target(error_target), check_pilot(pilot)
    if sampler not in SAMPLERS:
        raise ValueError(f"error_target needs a stochastic sampler {SAMPLERS}, got sampler={sampler!r}")
    return error_target, pilot


def pilot_moments(counts: torch.Tensor, value: torch.Tensor, pilot: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A pilot's mean row ``ȳ [B, Hq, Lq, D]`` and mean squared norm ``(1/S₀) Σ_m ‖y_m‖² [B, Hq, Lq]``, float64, from
    its counts ``[B, Hq, Lq, n]`` over ``value [B, Hkv, n, D]``: the sampled rows alone are read (≤ S₀ per row)."""
    b, hq, lq, _ = counts.shape
    group = hq // value.shape[1]
    bi, hi, li, ji = counts.nonzero(as_tuple=True)
    rows = value[bi, torch.div(hi, group, rounding_mode="floor"), ji].double()  # [reads, D]
    weights = counts[bi, hi, li, ji].double() / pilot
    flat = (bi * hq + hi) * lq + li
    mean = torch.zeros(b * hq * lq, value.shape[-1], dtype=torch.float64, device=value.device)
    mean.index_add_(0, flat, weights.unsqueeze(-1) * rows)
    square_mean = torch.zeros(b * hq * lq, dtype=torch.float64, device=value.device)
    square_mean.index_add_(0, flat, weights * (rows * rows).sum(-1))
    return mean.reshape(b, hq, lq, -1), square_mean.reshape(b, hq, lq)


def error_target_values(
    probs: torch.Tensor, value: torch.Tensor, cap: int, sampler: str, *, error_target: float, pilot: int = DEFAULT_PILOT,
    generator: torch.Generator | None = None, uniforms: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ErrorTargetDraw]:
    """``ô [B, Hq, Lq, D]`` float32 from :func:`error_target_weights`, and what was drawn. A NaN row of probs (NaN or
    +inf among its scores) gives a NaN output row, as :func:`sampled_values`."""
    nan_rows = torch.isnan(probs).any(dim=-1, keepdim=True)
    weights, draw = error_target_weights(probs.masked_fill(nan_rows, 0.0), value, cap, sampler, error_target=error_target,
                                         pilot=pilot, generator=generator, uniforms=uniforms)
    return weighted_values(weights, value).masked_fill(nan_rows, math.nan), draw


def _check_groups(hq: int, hkv: int, name: str) -> None:
    if hkv == 0 or hq % hkv:
        raise ValueError(f"{name} has {hkv} heads, which must divide the {hq} query heads (GQA)")


def sampled_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    budget: int,
    *,
    sampler: str = "systematic",
    scale: float | None = None,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    enable_gqa: bool = False,
    generator: torch.Generator | None = None,
    score_samples: int | None = None,
    score_sampler: str = "stratified",
    uniforms: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    error_target: float | None = None,
    pilot: int = DEFAULT_PILOT,
) -> torch.Tensor:
    """SANTA attention with the signature of ``torch.nn.functional.scaled_dot_product_attention``.

    query: ``[B, Hq, Lq, D]``; key, value: ``[B, Hkv, Lk, D]`` (``Hkv < Hq`` needs ``enable_gqa``).
    budget: S ≥ 1 samples per query row and head (the k of ``"topk"``, capped at Lk; ignored by
        ``"dense"``). The draws are materialised: S > Lk is refused once ``B·Hq·Lq·S`` passes
        ``santa.sampling.MAX_DRAWS`` (see :func:`santa.sample_counts`).
    sampler: ``"iid"`` (SANTA), ``"stratified"``, ``"systematic"`` (S²ANTA), ``"topk"``, ``"dense"``.
    Returns ``[B, Hq, Lq, D]`` in query's dtype: ``ô = (1/S) Σ_j c_j v_j`` with counts c from
    :func:`santa.sample_counts` on ``p = softmax(q kᵀ·scale + mask)``.
    uniforms: the value sampler's uniforms instead of draws from ``generator``: ``[B, Hq, Lq, S]`` for
        iid and stratified, ``[B, Hq, Lq]`` for systematic (e.g. request-keyed ones,
        :func:`santa.kernels.reference.call_uniforms`); checked by :func:`santa.sample_counts`.
    error_target: a relative error ε > 0 instead of a fixed budget (:mod:`santa.error_target`): each
        query row and head draws ``S_r = min(budget, max(S₀, ⌈T̂ / (ε² N̂)⌉))`` samples, the variance trace T̂ and
        ‖o‖² (N̂) estimated from a pilot of ``pilot`` systematic draws (int ≥ 2, default 16) on their own
        uniforms; ``budget`` is then the cap S_max. Stochastic samplers only; ``uniforms`` is then the
        pair (pilot's, output's) that :func:`santa.attention.error_target_values` takes, which also
        reports each row's budget and the rows it read.
    score_samples: with B ≥ 1, the scores are Bernoulli qKᵀ too (:func:`santa.bernoulli_query`, B
    ternary draws of ``score_sampler``, one per KV-head group): ``p = softmax(q̃ kᵀ·scale + mask)``.

    A fully masked query row returns zeros, as SDPA does in torch 2.13 on CPU (zeros keep a
    padded batch finite). Non-finite input gives NaN, never a finite answer, in the rows it
    reaches, as in SDPA: NaN in q or k, or a +inf score, makes its query row NaN (for every
    sampler, and with Bernoulli scores for every head of the GQA group, which share one draw);
    NaN or inf in value reaches the rows of its batch element and KV group. A −inf score is a
    masked key. Other batch elements and rows keep their values and draws.
    Bad arguments raise TypeError (types) or ValueError (values, shapes, NaN or ±inf scale, tensors
    on the meta device) naming the argument.
    """
    budget = check_budget(budget)
    check_sampler(sampler, ATTENTION_SAMPLERS)
    check_qkv(query, key, value, enable_gqa=enable_gqa)
    check_sampler(score_sampler, SCORE_SAMPLERS, "score_sampler")
    check_flag("is_causal", is_causal)
    check_scale(scale, query.shape[-1])
    check_generator(generator, query.device)
    b, hq, lq, _ = query.shape
    if attn_mask is not None:
        check_mask(attn_mask, (b, hq, lq, key.shape[2]), query.device)
    if error_target is not None:
        _checked_target(error_target, pilot, sampler)  # before any work
    else:
        check_pilot(pilot, targeted=False)  # refused where it would size nothing
    if sampler in SAMPLERS:
        check_draws(b * hq * lq, budget, key.shape[2])
    scored = query  # the query the scores use: q, or Bernoulli qKᵀ's sampled q̃
    if score_samples is not None:
        score_samples = check_budget(score_samples, "score_samples")
        scored = bernoulli_query(query, score_samples, kv_heads=key.shape[1], sampler=score_sampler, generator=generator).query
    probs = attention_probs(scored, key, scale=scale, is_causal=is_causal, attn_mask=attn_mask)
    if error_target is not None:
        out, _ = error_target_values(probs, value, budget, sampler, error_target=error_target, pilot=pilot,
                                     generator=generator, uniforms=uniforms)
        return out.to(query.dtype)
    out, _ = sampled_values(probs, value, budget, sampler, generator=generator, uniforms=uniforms)  # [B, Hq, Lq, D]
    return out.to(query.dtype)
