"""HuggingFace transformers backend: ``attn_implementation="santa"``.

Importing this module registers the ``"santa"`` attention function (and SDPA-style masks for it).
Configure a model with one call::

    import santa.hf
    santa.hf.configure(model, santa.hf.SantaConfig(budget=64, sampler="systematic", seed=0))
    model.generate(...)

Default: dense prefill (SDPA), sampled decode. ``prefill="sampled"`` also samples the prefill
(the paper's Section 4 setting). Randomness is keyed on the request (:mod:`santa.rng`): each draw
is a function of (seed, layer, head, the query's position in its own sequence, sample index), the
position counted from the attention mask, so the same prompt and seed generate the same tokens
alone or batched (left-padded), under a dynamic or a static cache, with no state to reset. transformers' caches
are ``[B, H_kv, L, D]`` (HND), which on Hopper the one-launch prop reads in place (eager calls, and under
``torch.compile`` the custom op's, :mod:`santa.kernels.ops`); its float32 CDF is
summed in slices that follow the batch, so a sample within float32 rounding of a CDF step may move with it.
``SantaConfig(batch_invariant=True)`` runs the Triton prop instead, whose CDF follows neither the batch size, the left
padding nor the cache's length (:class:`SantaConfig`).

What santa implements matches eager attention (tests/hf/test_hf_reliability.py): GQA, sliding
windows (through the attention mask transformers builds), a score scale other than 1/√D, value
heads narrower than key heads (MLA), left padding. What it does not is refused by name, never
dropped: :func:`configure` refuses soft-capped attention logits (Gemma 2) and attention sinks
(gpt-oss), and the attention function refuses any keyword it does not know (:data:`UNSUPPORTED_KEYWORDS`,
anything outside :data:`IGNORED_KEYWORDS`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from santa import methods, rng, schedule_file
from santa.attention import (
    ATTENTION_SAMPLERS,
    attention_probs,
    check_flag,
    error_target_weights,
    value_weights,
    weighted_values,
)
from santa.bernoulli import SCORE_SAMPLERS, bernoulli_query
from santa.checks import integer
from santa.error_target import DEFAULT_PILOT, check_error_target, check_pilot
from santa.kernels.reference import pilot_uniforms, sampler_uniforms
from santa.rng import MAX_SEED, check_seed  # noqa: F401 (MAX_SEED: re-exported, the one seed range)
from santa.sampling import SAMPLERS as STOCHASTIC_SAMPLERS
from santa.sampling import check_budget, check_sampler
from santa.stats import unique_keys

IMPLEMENTATION = "santa"
KERNEL_CHOICES = ("auto", *methods.kernels(), "reference")  # auto: methods.DEFAULT_KERNEL on CUDA

# Keywords transformers hands every attention function that do not change the attention santa
# computes: bookkeeping, or packing that the mask already carries.
IGNORED_KEYWORDS = frozenset(
    {
        "position_ids", "use_cache", "cache_position", "output_attentions", "output_hidden_states",
        "output_router_logits", "num_items_in_batch", "cu_seq_lens_q", "cu_seq_lens_k",
        "max_length_q", "max_length_k", "seq_idx", "deterministic",
    }
)
# Attention keywords of model features santa does not implement: refused whenever they are set.
UNSUPPORTED_KEYWORDS = {
    "softcap": "attention-logit soft-capping (e.g. Gemma 2's attn_logit_softcapping)",
    "s_aux": "attention sinks (e.g. gpt-oss)",
    "sinks": "attention sinks (e.g. gpt-oss)",
    "position_bias": "an additive relative position bias (T5-style)",
    "indices": "sparse attention over selected key indices",
    "block_indices": "sparse attention over selected key blocks",
}
# Model config fields of features santa does not implement, refused by configure when set.
UNSUPPORTED_CONFIG_FIELDS = {
    "attn_logit_softcapping": "attention-logit soft-capping",
}


def check_layer(name: str, layer: object) -> int:
    """Return ``layer`` as an int, or raise unless it is an int layer index ≥ 0."""
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise TypeError(f"{name} must be an int layer index, got {type(layer).__name__} {layer!r}")
    if layer < 0:
        raise ValueError(f"{name} must be a layer index ≥ 0, got {layer}")
    return int(layer)


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

    budget: samples per query row and head (S), an int ≥ 1.
    sampler: ``"systematic"`` (S²ANTA-sys), ``"stratified"``, ``"iid"`` (SANTA), ``"topk"``, ``"dense"``.
    layer_budgets: per-layer overrides of ``budget``, a mapping ``{layer_index: S}`` (int keys ≥ 0,
        budgets ≥ 1; :func:`configure` refuses indices the model does not have).
    dense_layers: layers that always use exact attention, a collection of layer indices such as
        ``(0,)`` or ``range(2)`` (stored as a tuple; checked against the model by :func:`configure`).
    prefill: ``"dense"`` (SDPA for every query block with more than one row) or ``"sampled"``.
    seed: root of all randomness, an int in [0, 2**63).
    exact_when_budget_covers: a query row whose own live keys S covers (S ≥ the keys it sees, counted
        from the attention mask: never the padded length or a static cache's capacity) cannot be read
        more cheaply by sampling, so it gets exact attention; the rule every decode path follows (the
        kernels decide it per sequence on the device). Turn off to sample regardless, on the reference
        path only (``kernel="reference"``, or ``"auto"``, which then takes the reference).
    dense_below: keys (an int ≥ 0; 0, the default, samples every step): a decode step (one query row) whose layer sees
        fewer keys runs SDPA, exact. The keys are the layer's key length: with transformers' dynamic cache the live
        keys (the longest row's, padding included), with a static cache its capacity (so every decode step is dense
        where the capacity is below N, none otherwise). santa's kernels lose to cuDNN below 4k keys in most
        cells of a kernel grid (H100, 2026-12-07, contiguous unmasked caches: Llama-3.1-8B's shape 1.12–1.57× at 512
        keys; Qwen2.5-0.5B's 1.08–2.20× up to 2k; README), but transformers' SDPA on a static cache under a mask is
        not cuDNN: in compiled ``generate()`` at Qwen2.5-0.5B's shape (H200, 2026-12-07) sampling every step took
        0.78–0.93× SDPA's ms/token at 512–2k keys, batch 1 and 16, so a gated step, SDPA's, was the slower one there.
        santa's vLLM backend gates short steps by default, by head shape, from whole steps measured inside vLLM.
        Off by default here (slower on the shape measured; the accuracy harness samples short contexts too). With it
        on, whether a step is dense follows the batch's padded length, so a prompt's tokens may differ alone and
        batched (request keying holds for the sampled steps only; refused with ``batch_invariant=True``).
    record_stats: accumulate :class:`DecodeStats` (value rows read) over sampled calls.
    score_samples: B ternary draws of Bernoulli qKᵀ for the sampled calls' scores
        (:func:`santa.bernoulli_query`, one draw per KV-head group), or None for exact scores.
        With ``sampler="dense"`` it samples the scores alone. Runs on the torch reference path.
    score_sampler: ``"stratified"`` (default, the paper's) or ``"iid"``.
    kernel: decode path for ``sampler="systematic"``: ``"auto"`` (on CUDA the Triton prop kernel,
        else the torch reference), ``"prop"``, ``"flash"`` (per-tile budgets, not global S²ANTA-sys;
        both run on any device through :func:`santa.kernels.decode`), or ``"reference"``. prop reads
        a masked step (left padding, a static cache's unwritten tail, a window) as each sequence's run
        of keys, found on the device; flash takes unmasked steps only. The kernels and the reference
        draw the same request-keyed uniforms (Bernoulli scores still use a generator per call).
    batch_invariant: a bool (default False). True: every kernel call plans the Triton prop (:func:`santa.kernels.decode`'s
        ``batch_invariant``), whose samples follow neither the batch size nor the cache's length: with the kernels a
        prompt's samples are the same bit for bit alone or batched (left-padded by any length) on every GPU: the Triton
        prop cuts its tiles from each sequence's first key. Off (the default), on Hopper the calls
        take the one-launch kernel, whose samples follow the plan's slicing, which follows the batch. The reference
        path (``kernel="reference"``, or ``"auto"`` off CUDA) has no one launch: there it changes nothing. Refused with
        ``dense_below`` (which steps are dense follows the batch's padded length).
    error_target: a relative error ε > 0 instead of one budget for every head (:mod:`santa.error_target`): each
        query row and head draws ``min(S, max(S₀, ⌈T̂ / (ε² N̂)⌉))`` samples, estimated from a pilot of ``pilot`` draws (int ≥ 2),
        S (``budget`` or the layer's) the cap; the stochastic samplers only, and the prop kernel (not flash).
        ``record_stats`` counts the pilot's rows among the rows read on the reference path (the kernels return the
        output's draws only).
    """

    budget: int = 64
    sampler: str = "systematic"
    layer_budgets: dict[int, int] = field(default_factory=dict)
    dense_layers: tuple[int, ...] = ()
    prefill: str = "dense"
    seed: int = 0
    exact_when_budget_covers: bool = True
    dense_below: int = 0
    record_stats: bool = False
    kernel: str = "auto"
    score_samples: int | None = None
    score_sampler: str = "stratified"
    error_target: float | None = None
    pilot: int = DEFAULT_PILOT
    batch_invariant: bool = False
    stats: DecodeStats = field(default_factory=DecodeStats)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise TypeError/ValueError naming the first bad field (run at construction and by :func:`configure`)."""
        self.budget = check_budget(self.budget)  # stored as Python ints: a numpy seed would overflow in santa.rng.mix
        check_sampler(self.sampler, ATTENTION_SAMPLERS)
        if not isinstance(self.layer_budgets, Mapping):
            raise TypeError(f"layer_budgets must be a mapping {{layer_index: budget}}, got {type(self.layer_budgets).__name__}")
        self.layer_budgets = {
            check_layer("layer_budgets key", layer): check_budget(budget, f"layer_budgets[{layer!r}]")
            for layer, budget in self.layer_budgets.items()
        }
        if self.layer_budgets and self.sampler == "dense":
            raise ValueError("layer_budgets sets samples per layer for a sampler; sampler='dense' reads every key")
        if isinstance(self.dense_layers, (str, bytes, Mapping)) or not isinstance(self.dense_layers, Iterable):
            raise TypeError(
                f"dense_layers must be a collection of layer indices such as (0,) or range(2), got {type(self.dense_layers).__name__} {self.dense_layers!r}"
            )
        self.dense_layers = tuple(check_layer("dense_layers entry", layer) for layer in self.dense_layers)
        if self.prefill not in ("dense", "sampled"):
            raise ValueError(f"prefill must be 'dense' or 'sampled', got {self.prefill!r}")
        self.seed = check_seed(self.seed)
        check_flag("exact_when_budget_covers", self.exact_when_budget_covers)
        self.dense_below = integer("dense_below", self.dense_below, low=0)
        if check_flag("batch_invariant", self.batch_invariant) and self.dense_below:
            raise ValueError(f"dense_below must be 0 with batch_invariant=True (a decode step runs SDPA when its layer sees "
                             f"fewer keys, the batch's padded length, so a prompt's tokens would depend on its batch), "
                             f"got {self.dense_below}")
        check_flag("record_stats", self.record_stats)
        if self.kernel not in KERNEL_CHOICES:
            raise ValueError(f"kernel must be one of {KERNEL_CHOICES}, got {self.kernel!r}")
        if not self.exact_when_budget_covers and self.kernel not in ("auto", "reference"):
            raise ValueError(
                f"exact_when_budget_covers=False samples rows that S covers, which kernel={self.kernel!r} never does "
                "(the kernels compute such a sequence exactly): use kernel='reference' to sample regardless"
            )
        if self.kernel in methods.kernels() and self.sampler != "systematic":
            raise ValueError(f"kernel={self.kernel!r} draws systematic samples (S²ANTA-sys); sampler={self.sampler!r} runs on the "
                             "torch reference: use kernel='auto' or 'reference' with it, or sampler='systematic'")
        if self.score_samples is not None:
            self.score_samples = check_budget(self.score_samples, "score_samples")
            if self.kernel in methods.kernels():
                raise ValueError(f"score_samples (Bernoulli qKᵀ) runs on the torch reference, not kernel={self.kernel!r}: "
                                 "use kernel='auto' or 'reference' with it")
        check_sampler(self.score_sampler, SCORE_SAMPLERS, "score_sampler")
        self.pilot = check_pilot(self.pilot, targeted=self.error_target is not None)  # a pilot without a target is refused, not ignored
        if self.error_target is not None:
            self.error_target = check_error_target(self.error_target)
            if self.sampler not in STOCHASTIC_SAMPLERS:
                raise ValueError(f"error_target needs a stochastic sampler {STOCHASTIC_SAMPLERS}, got sampler={self.sampler!r}")
            if self.kernel == "flash":
                raise ValueError("error_target is implemented by kernel='prop' (its pilot reads the global CDF), got kernel='flash'")
        if not isinstance(self.stats, DecodeStats):
            raise TypeError(f"stats must be a DecodeStats, got {type(self.stats).__name__}")

    def budget_for(self, layer: int) -> int:
        """S in ``layer``: its entry of ``layer_budgets``, else ``budget``."""
        return schedule_file.budget_for(layer, layer_budgets=self.layer_budgets, budget=self.budget)


def configure(model: torch.nn.Module, config: SantaConfig) -> torch.nn.Module:
    """Switch ``model`` to ``attn_implementation="santa"`` with ``config`` on every attention layer.

    Raises TypeError unless config is a :class:`SantaConfig` (re-validated here, so fields changed
    after construction are checked too), and ValueError when ``layer_budgets`` or ``dense_layers``
    name a layer the model does not have, or the model has a feature santa's attention does not
    implement (:func:`check_model_features`).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), got {type(model).__name__}")
    if not isinstance(config, SantaConfig):
        raise TypeError(f"config must be a santa.hf.SantaConfig, got {type(config).__name__} {config!r}")
    config.validate()
    layers = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")]
    if not layers:
        raise ValueError("model has no attention layers with `layer_idx`: is it a transformers decoder?")
    check_model_features(model, layers)
    known = sorted({m.layer_idx for m in layers})
    for name, named in (("layer_budgets", config.layer_budgets), ("dense_layers", config.dense_layers)):
        unknown = sorted(set(named) - set(known))
        if unknown:
            raise ValueError(f"{name} names layers {unknown} the model does not have (its {len(known)} attention layers are {known[0]}–{known[-1]})")
    for module in layers:
        module.santa_config = config
    model.set_attn_implementation(IMPLEMENTATION)
    return model


def check_model_features(model: torch.nn.Module, layers: list[torch.nn.Module]) -> None:
    """Raise ValueError naming the first model feature santa's attention does not implement.

    Soft-capped attention logits (Gemma 2) and attention sinks (gpt-oss) change every attention
    row; santa's sampled attention (and SDPA) would silently compute attention without them.
    Sliding windows, GQA, a score scale other than 1/√D and value heads narrower than key heads
    (MLA) are implemented (the window through the attention mask)."""
    configs = [getattr(model, "config", None)]
    if configs[0] is not None and hasattr(configs[0], "get_text_config"):
        configs.append(configs[0].get_text_config())
    for config in configs:
        for name, feature in UNSUPPORTED_CONFIG_FIELDS.items():
            value = getattr(config, name, None)
            if value is not None and value is not False and value != 0:
                raise ValueError(f"santa does not implement {feature}: the model config sets {name}={value!r}")
    for module in layers:
        for name in ("sinks", "s_aux"):
            if isinstance(getattr(module, name, None), torch.Tensor):
                raise ValueError(
                    f"santa does not implement attention sinks: layer {module.layer_idx} ({type(module).__name__}) has `{name}`"
                )


def check_attention_keywords(module: torch.nn.Module, kwargs: dict, attention_mask: torch.Tensor | None, n_keys: int) -> None:
    """Raise ValueError unless every keyword reaching the attention function is one santa
    implements or one that does not change the attention (:data:`IGNORED_KEYWORDS`)."""
    where = f"layer {getattr(module, 'layer_idx', '?')} ({type(module).__name__})"
    for name, value in kwargs.items():
        if name in IGNORED_KEYWORDS or name == "sliding_window" or value is None:
            continue
        if name in UNSUPPORTED_KEYWORDS:
            raise ValueError(f"santa does not implement {UNSUPPORTED_KEYWORDS[name]}: {where} passed {name}")
        raise ValueError(
            f"santa's attention got the keyword {name}={_short(value)} from {where}, which it does not implement; "
            "it refuses rather than ignore it (use attn_implementation='eager' or 'sdpa' for this model)"
        )
    window = kwargs.get("sliding_window")
    if window is not None and attention_mask is None and n_keys > window:
        raise ValueError(
            f"{where} has a sliding window of {window} keys but no attention mask for {n_keys} keys: "
            "santa applies sliding windows through the mask transformers builds"
        )


def _short(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor of shape {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def kernel_for(config: SantaConfig, query: torch.Tensor, attention_mask: torch.Tensor | None) -> str | None:
    """The Triton decode kernel to run for this step, or None for the torch reference. Reads no tensor
    values (no host sync): a mask goes to prop as a run of keys (:func:`kernel_decode`); flash, whose
    tile budgets count from key 0, takes unmasked steps only."""
    if (config.kernel == "reference" or query.shape[2] != 1 or config.sampler != "systematic" or config.score_samples
            or not config.exact_when_budget_covers):
        return None
    if config.kernel == "auto" and not query.is_cuda:
        return None
    kernel = methods.DEFAULT_KERNEL if config.kernel == "auto" else config.kernel
    if attention_mask is not None and kernel != "prop":
        return None
    return kernel


def query_positions(attention_mask: torch.Tensor | None, n_queries: int, n_keys: int, batch: int,
                    device: torch.device) -> torch.Tensor:
    """int64 ``[B, Lq]``: each query row's position in its own sequence, the number of keys it sees
    minus one (a left pad, or a static-cache slot not yet written, is not a key), from the bool mask
    ``[B, 1, Lq, Lk]``; without a mask the rows end the key block (``n_keys − Lq + i``)."""
    if attention_mask is not None:
        return position_of(attention_mask[:, 0].sum(-1))
    rows = torch.arange(n_queries, device=device) + (n_keys - n_queries)
    return rows.clamp_min(0).expand(batch, n_queries)


def position_of(keys_seen: torch.Tensor) -> torch.Tensor:
    """A query's position in its own sequence from the number of keys it sees: ``keys_seen − 1``, int64
    (0 for a row that sees none)."""
    return (keys_seen - 1).clamp_min(0).long()


def visible_keys(attention_mask: torch.Tensor | None, *, causal: bool, n_queries: int, n_keys: int,
                 device: torch.device) -> torch.Tensor:
    """bool ``[B or 1, 1, Lq, Lk]``: the keys each query row sees, from the mask (a float mask: its entries
    above −inf), else the causal block (row i sees the first ``Lk − Lq + i + 1`` keys), else every key. A row's
    count is its live keys: the exactness rule (``S ≥ live keys``) is decided on it, per sequence and row."""
    if attention_mask is not None:
        return attention_mask if attention_mask.dtype == torch.bool else attention_mask > -math.inf
    if causal:
        rows = torch.arange(n_queries, device=device).unsqueeze(-1) + (n_keys - n_queries)
        return (torch.arange(n_keys, device=device) <= rows)[None, None]
    return torch.ones(1, 1, n_queries, n_keys, dtype=torch.bool, device=device)


def visible_run(attention_mask: torch.Tensor, n_keys: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decode step's bool mask ``[B, 1, 1, Lk]`` as runs of keys, on the device: ``(starts, ends,
    contiguous)`` int32 ``[B]`` ×2 and bool ``[B]``. Sequence b sees ``[starts[b], ends[b])`` when
    ``contiguous[b]`` (left padding, a static cache's unwritten tail and a window all give one run)."""
    visible = attention_mask[:, 0, 0, :]  # [B, Lk]
    count = visible.sum(-1)
    starts = visible.int().argmax(-1)  # the first visible key (0 for none)
    ends = starts + count
    keys = torch.arange(n_keys, device=visible.device)
    contiguous = (visible == ((keys >= starts.unsqueeze(-1)) & (keys < ends.unsqueeze(-1)))).all(-1)
    return starts.int(), ends.int(), contiguous


def kernel_decode(
    module: torch.nn.Module, config: SantaConfig, kernel: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    scaling: float | None, attention_mask: torch.Tensor | None,
) -> torch.Tensor | None:
    """One decode step with :func:`santa.kernels.decode`. query ``[B, Hq, 1, D]``, key/value
    ``[B, Hkv, Lk, D]`` (read in place as the HND layout). Returns ``[B, 1, Hq, D]``, or None where an
    eager step's mask is not one run of keys per sequence (the caller then runs the reference, which
    draws the same samples). Draws keyed on (seed, layer, head, the query's position). With a mask,
    sequence b reads keys ``[start, end)`` (:func:`visible_run`), all computed on the device: under
    ``torch.compile`` nothing is read on the host, and a mask that is not one run gives that
    sequence NaN instead of a wrong answer."""
    from santa.kernels import decode

    layer, n_keys, batch = module.layer_idx, key.shape[2], query.shape[0]
    runs = {}
    if attention_mask is not None:
        starts, ends, contiguous = visible_run(attention_mask, n_keys)
        if not torch.compiler.is_compiling() and not bool(contiguous.all()):
            return None
        positions = position_of(ends - starts)  # the run's length is the keys the query sees (no second pass over the mask)
        ends = torch.where(contiguous, ends, n_keys + 1)  # an invalid length: NaN for that sequence
        runs = dict(seq_lens=ends, starts=starts)
    else:
        positions = query_positions(None, 1, n_keys, batch, query.device)[:, 0].contiguous()
    result = decode(
        query[:, :, 0].contiguous(), key.contiguous(), value.contiguous(), config.budget_for(layer),
        kernel=kernel, kv_layout="HND", scale=scaling, seed=rng.layer_key(config.seed, layer), positions=positions,
        return_counts=config.record_stats, error_target=config.error_target, pilot=config.pilot,
        batch_invariant=config.batch_invariant, **runs,
    )
    if config.record_stats:
        result, counts = result
        visible = torch.ones(counts.shape, dtype=torch.float32, device=counts.device)
        if attention_mask is not None:
            visible = visible * attention_mask[:, :, 0, :].float()  # [B, 1, Lk] over the heads
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


def topk_rows_read(probs: torch.Tensor, budget: int) -> torch.Tensor:
    """The value rows top-k reads, as counts ``[B, Hq, Lq, n]`` (1 read, 0 not): the k largest
    weights of each row that are visible (a row with fewer than k visible keys reads those)."""
    top = torch.topk(probs, min(budget, probs.shape[-1]), dim=-1).indices
    chosen = torch.zeros_like(probs, dtype=torch.int32).scatter_(-1, top, 1)
    return chosen * (probs > 0)


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
    check_attention_keywords(module, kwargs, attention_mask, n_keys)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)  # as SDPA's attention function does
    budget = config.budget_for(layer)
    exact_values = config.sampler == "dense" or (config.exact_when_budget_covers and budget >= n_keys)
    exact = (
        layer in config.dense_layers
        or (n_queries > 1 and config.prefill == "dense")
        or (exact_values and config.score_samples is None)
        or (n_queries == 1 and n_keys < config.dense_below)  # a short decode step: dense (SDPA)
    )
    if exact:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    if dropout:
        raise ValueError(
            f"santa's sampled attention has no dropout, got dropout={dropout} (attention_dropout in training mode): "
            "call model.eval(), or list the layer in dense_layers"
        )
    kernel = kernel_for(config, query, attention_mask)
    if kernel is not None and key.shape[-1] != value.shape[-1]:
        if config.kernel != "auto":
            raise ValueError(
                f"kernel={config.kernel!r} needs keys and values of one head dim, but layer {layer} has {key.shape[-1]} and "
                f"{value.shape[-1]} (e.g. multi-head latent attention): use kernel='auto' or 'reference'"
            )
        kernel = None
    if kernel is not None:
        out = kernel_decode(module, config, kernel, query, key, value, scaling, attention_mask)
        if out is not None:
            return out, None
    causal = attention_mask is None and n_queries > 1 and bool(is_causal)
    if causal and n_keys > n_queries:  # SDPA's reading: an unmasked causal block aligns top-left (an empty static cache)
        key, value, n_keys = key[:, :, :n_queries], value[:, :, :n_queries], n_queries
    generator = rng.hf_reference_generator(config.seed, layer, n_keys, n_queries, query.device)
    scored = query  # the query the scores use: q, or Bernoulli qKᵀ's sampled q̃
    if config.score_samples is not None:
        drawn = bernoulli_query(query, config.score_samples, kv_heads=key.shape[1], sampler=config.score_sampler, generator=generator)
        scored = drawn.query
        if config.record_stats:
            config.stats.features_read += int(drawn.features_read.sum())
            config.stats.features_total += drawn.features_read.numel()
    probs = attention_probs(scored, key, scale=scaling, is_causal=causal, attn_mask=attention_mask)  # [B, Hq, Lq, Lk]
    sampler = "dense" if exact_values else config.sampler
    uniforms = None
    if sampler in STOCHASTIC_SAMPLERS:  # keyed on the request, as the kernels draw
        positions = query_positions(attention_mask, n_queries, n_keys, query.shape[0], query.device)  # [B, Lq]
        uniforms = sampler_uniforms(rng.layer_key(config.seed, layer), positions, query.shape[1], sampler, budget)
        uniforms = uniforms.to(query.device, torch.float64)
        if config.error_target is not None:  # the pilot's own (systematic for every sampler, on a stream of its own)
            pilot = pilot_uniforms(rng.layer_key(config.seed, layer), positions, query.shape[1], sampler)
            uniforms = (pilot.to(query.device, torch.float64), uniforms)
    nan_rows = torch.isnan(probs).any(dim=-1, keepdim=True)  # NaN or +inf scores: a NaN row, as in SDPA
    probs = probs.masked_fill(nan_rows, 0.0)
    if sampler in STOCHASTIC_SAMPLERS and config.error_target is not None:
        weights, draw = error_target_weights(probs, value, budget, sampler, error_target=config.error_target,
                                             pilot=config.pilot, uniforms=uniforms)
        counts = draw.counts + draw.pilot_counts  # the rows read: the pilot's too
    else:
        weights, counts = value_weights(probs, budget, sampler, generator=generator, uniforms=uniforms)
    if config.record_stats and counts is None and sampler == "topk":
        counts = topk_rows_read(probs, budget)
    if sampler != "dense" and config.exact_when_budget_covers:  # the rows whose own live keys S covers: exact
        visible = visible_keys(attention_mask, causal=causal, n_queries=n_queries, n_keys=n_keys, device=query.device)
        covered = (visible.sum(-1, keepdim=True) <= budget)  # [B or 1, 1, Lq, 1]
        weights = torch.where(covered, probs, weights)
        if counts is not None:
            counts = torch.where(covered, visible.to(counts.dtype), counts)
    if config.record_stats and counts is not None:
        _record(config.stats, counts, probs, module.num_key_value_groups)
    out = weighted_values(weights, value).masked_fill(nan_rows, math.nan)
    out = out.to(query.dtype)  # [B, Hq, Lq, D]; NaN rows where q or k held NaN, as in SDPA
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(IMPLEMENTATION, santa_attention_forward)
AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
