"""HuggingFace transformers backend: ``attn_implementation="santa"``.

Importing this module registers the ``"santa"`` attention function (and SDPA-style masks for it).
Configure a model with one call::

    import santa.hf
    santa.hf.configure(model, santa.hf.SantaConfig(budget=64, sampler="systematic", seed=0))
    model.generate(...)

Default: dense prefill (SDPA), sampled decode. ``prefill="sampled"`` also samples the prefill
(the paper's Section 4 setting). Randomness is drawn from a generator seeded by
``(seed, layer, n_keys, n_queries)``: every layer and decode step gets fresh uniforms, and the same
prompt with the same seed generates the same tokens, with no state to reset between calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from santa.attention import ATTENTION_SAMPLERS, attention_probs, value_weights, weighted_values
from santa.bernoulli import SCORE_SAMPLERS, bernoulli_query
from santa.sampling import check_budget, check_sampler
from santa.stats import unique_keys

IMPLEMENTATION = "santa"
KERNEL_CHOICES = ("auto", "prop", "flash", "reference")


@dataclass
class DecodeStats:
    """Running totals of value rows read by sampled attention calls (for the share of V read).

    Every sampled query row counts: decode steps, and prefill rows when ``prefill="sampled"``.
    """

    calls: int = 0  # sampled attention calls (one per layer and forward)
    rows_read_per_head: int = 0  # Σ over calls, batch, query rows, heads of distinct sampled keys
    keys_per_head: int = 0  # Σ of visible keys over the same
    rows_read_per_kv_head: int = 0  # Σ over calls, batch, query rows, KV heads of the union over the group
    keys_per_kv_head: int = 0
    features_read: int = 0  # Bernoulli qKᵀ: Σ over calls, batch, query rows, KV heads of key features read
    features_total: int = 0  # Σ of head-dim features over the same (0 without score sampling)

    @property
    def share_per_head(self) -> float:
        return self.rows_read_per_head / max(self.keys_per_head, 1)

    @property
    def share_per_kv_head(self) -> float:
        return self.rows_read_per_kv_head / max(self.keys_per_kv_head, 1)

    @property
    def feature_share(self) -> float | None:
        """Share of key features read by Bernoulli qKᵀ (None when the scores were exact)."""
        return self.features_read / self.features_total if self.features_total else None


@dataclass
class SantaConfig:
    """How the ``"santa"`` attention samples.

    budget: samples per query row and head (S).
    sampler: ``"systematic"`` (S²ANTA-sys), ``"stratified"``, ``"iid"`` (SANTA), ``"topk"``, ``"dense"``.
    layer_budgets: per-layer overrides of ``budget``, ``{layer_index: S}``.
    dense_layers: layers that always use exact attention.
    prefill: ``"dense"`` (SDPA for every query block with more than one row) or ``"sampled"``.
    seed: root of all randomness.
    exact_when_budget_covers: when S ≥ the number of keys, sampling cannot read fewer value rows
        than dense attention, so use exact attention instead (turn off to sample regardless).
    record_stats: accumulate :class:`DecodeStats` (value rows read) over sampled calls.
    score_samples: B ternary draws of Bernoulli qKᵀ for the sampled calls' scores
        (:func:`santa.bernoulli_query`, one draw per KV-head group), or None for exact scores.
        With ``sampler="dense"`` it samples the scores alone. Runs on the torch reference path.
    score_sampler: ``"stratified"`` (default, the paper's) or ``"iid"``.
    kernel: decode path for ``sampler="systematic"``: ``"auto"`` (on CUDA the Triton prop kernel
        when the step has no padding mask, else the torch reference), ``"prop"``, ``"flash"``
        (per-tile budgets, not global S²ANTA-sys; both run on any device through
        :func:`santa.kernels.decode`), or ``"reference"``. The
        kernels draw Philox uniforms keyed on (seed, layer, n_keys), so their samples differ from
        the reference's torch generator; both are repeatable given the seed.
    """

    budget: int = 64
    sampler: str = "systematic"
    layer_budgets: dict[int, int] = field(default_factory=dict)
    dense_layers: tuple[int, ...] = ()
    prefill: str = "dense"
    seed: int = 0
    exact_when_budget_covers: bool = True
    record_stats: bool = False
    kernel: str = "auto"
    score_samples: int | None = None
    score_sampler: str = "stratified"
    stats: DecodeStats = field(default_factory=DecodeStats)

    def __post_init__(self) -> None:
        check_budget(self.budget)
        check_sampler(self.sampler, ATTENTION_SAMPLERS)
        for layer, budget in self.layer_budgets.items():
            check_budget(budget, f"layer_budgets[{layer}]")
        if self.prefill not in ("dense", "sampled"):
            raise ValueError(f"prefill must be 'dense' or 'sampled', got {self.prefill!r}")
        if self.kernel not in KERNEL_CHOICES:
            raise ValueError(f"kernel must be one of {KERNEL_CHOICES}, got {self.kernel!r}")
        if self.score_samples is not None:
            check_budget(self.score_samples, "score_samples")
        check_sampler(self.score_sampler, SCORE_SAMPLERS, "score_sampler")

    def budget_for(self, layer: int) -> int:
        return self.layer_budgets.get(layer, self.budget)


def configure(model: torch.nn.Module, config: SantaConfig) -> torch.nn.Module:
    """Switch ``model`` to ``attn_implementation="santa"`` with ``config`` on every attention layer."""
    layers = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")]
    if not layers:
        raise ValueError("model has no attention layers with `layer_idx`: is it a transformers decoder?")
    for module in layers:
        module.santa_config = config
    model.set_attn_implementation(IMPLEMENTATION)
    return model


def stream_id(seed: int, layer: int, n_keys: int, n_queries: int) -> int:
    """A 63-bit number unique (up to hashing) to (seed, layer, decode position)."""
    mixed = seed
    for part in (layer, n_keys, n_queries):
        mixed = (mixed * 0x9E3779B97F4A7C15 + part + 1) % (1 << 63)
    return mixed


def layer_generator(seed: int, layer: int, n_keys: int, n_queries: int, device: torch.device) -> torch.Generator:
    """A generator unique to (seed, layer, decode position): fresh uniforms per layer and step."""
    return torch.Generator(device=device).manual_seed(stream_id(seed, layer, n_keys, n_queries))


def kernel_for(config: SantaConfig, query: torch.Tensor, attention_mask: torch.Tensor | None) -> str | None:
    """The Triton decode kernel to run for this step, or None for the torch reference."""
    if config.kernel == "reference" or query.shape[2] != 1 or config.sampler != "systematic" or config.score_samples:
        return None
    if config.kernel == "auto" and not query.is_cuda:
        return None
    if attention_mask is not None and not bool(attention_mask.all()):
        return None  # left padding: the kernels take per-sequence lengths, not masks
    return "prop" if config.kernel == "auto" else config.kernel


def kernel_decode(
    module: torch.nn.Module, config: SantaConfig, kernel: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """One decode step with :func:`santa.kernels.decode`. query ``[B, Hq, 1, D]``, key/value
    ``[B, Hkv, Lk, D]`` (read in place as the HND layout). Returns ``[B, 1, Hq, D]``."""
    from santa.kernels import decode

    layer, n_keys = module.layer_idx, key.shape[2]
    offset = stream_id(0, layer, n_keys, 1)
    result = decode(
        query[:, :, 0].contiguous(), key.contiguous(), value.contiguous(), config.budget_for(layer),
        kernel=kernel, kv_layout="HND", scale=scaling, seed=config.seed, offset=offset,
        return_counts=config.record_stats,
    )
    if config.record_stats:
        result, counts = result
        visible = torch.ones(counts.shape, dtype=torch.float32, device=counts.device)
        _record(config.stats, counts.unsqueeze(2), visible.unsqueeze(2), module.num_key_value_groups)
    return result.unsqueeze(1)


def _record(stats: DecodeStats, counts: torch.Tensor, probs: torch.Tensor, group_size: int) -> None:
    """counts, probs: ``[B, Hq, Lq, n]``; every query row (decode step or sampled prefill row) counts."""
    counts = counts.transpose(1, 2).flatten(0, 1)  # [B·Lq, Hq, n]
    visible = probs.transpose(1, 2).flatten(0, 1) > 0
    kv_visible = visible.reshape(visible.shape[0], -1, group_size, visible.shape[-1]).any(dim=2)
    stats.calls += 1
    stats.rows_read_per_head += int(unique_keys(counts).sum())
    stats.keys_per_head += int(visible.sum())
    stats.rows_read_per_kv_head += int(unique_keys(counts, group_size=group_size).sum())
    stats.keys_per_kv_head += int(kv_visible.sum())


def santa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function. query ``[B, Hq, Lq, D]``, key/value ``[B, Hkv, Lk, D]``
    (un-repeated KV heads), attention_mask bool ``[B, 1, Lq, Lk]`` (True = visible) or None.
    Returns ``([B, Lq, Hq, D], None)``."""
    config: SantaConfig = getattr(module, "santa_config", None) or SantaConfig()
    layer, n_queries, n_keys = module.layer_idx, query.shape[2], key.shape[2]
    budget = config.budget_for(layer)
    exact_values = config.sampler == "dense" or (config.exact_when_budget_covers and budget >= n_keys)
    exact = (
        layer in config.dense_layers
        or (n_queries > 1 and config.prefill == "dense")
        or (exact_values and config.score_samples is None)
    )
    if exact:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    kernel = kernel_for(config, query, attention_mask)
    if kernel is not None:
        return kernel_decode(module, config, kernel, query, key, value, scaling), None
    causal = attention_mask is None and n_queries > 1 and (is_causal if is_causal is not None else True)
    generator = layer_generator(config.seed, layer, n_keys, n_queries, query.device)
    scored = query  # the query the scores use: q, or Bernoulli qKᵀ's sampled q̃
    if config.score_samples is not None:
        drawn = bernoulli_query(query, config.score_samples, kv_heads=key.shape[1], sampler=config.score_sampler, generator=generator)
        scored = drawn.query
        if config.record_stats:
            config.stats.features_read += int(drawn.features_read.sum())
            config.stats.features_total += drawn.features_read.numel()
    probs = attention_probs(scored, key, scale=scaling, is_causal=causal, attn_mask=attention_mask)  # [B, Hq, Lq, Lk]
    weights, counts = value_weights(probs, budget, "dense" if exact_values else config.sampler, generator=generator)
    if config.record_stats and counts is not None:
        _record(config.stats, counts, probs, module.num_key_value_groups)
    out = weighted_values(weights, value).to(query.dtype)  # [B, Hq, Lq, D]
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(IMPLEMENTATION, santa_attention_forward)
AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
