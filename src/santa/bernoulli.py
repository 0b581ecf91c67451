"""Score stage: Bernoulli qKᵀ (the paper's Section 5 and Appendix C), the reference.

A query ``q ∈ R^D`` is divided by ``norm = max_i |q_i|``, so every ``|q_i| / norm`` is a
probability, and replaced by B ternary vectors ``q̂⁽ⁿ⁾_i = b⁽ⁿ⁾_i · sign(q_i)`` with
``b⁽ⁿ⁾_i ~ Bernoulli(|q_i| / norm)``. Then

    ŝ = (norm / B) Σ_n q̂⁽ⁿ⁾ Kᵀ,    E[ŝ] = q Kᵀ:

a ternary vector only adds or subtracts key features, and a feature whose B draws are all 0 is
never read. Only the count ``c_i = Σ_n b⁽ⁿ⁾_i`` matters:

- ``iid``: ``b⁽ⁿ⁾_i = [U_{n,i} < p_i]``, so ``c_i ~ Binomial(B, p_i)`` (B uniforms per feature);
- ``stratified`` (the paper's default): ``b⁽ⁿ⁾_i = [(n + U_{n,i}) / B < p_i]``. Every stratum below
  ``B p_i`` is certain and every one above is empty, so only the stratum holding ``B p_i`` is random:
  ``c_i = ⌊B p_i⌋ + [U_i < B p_i − ⌊B p_i⌋]`` with one uniform per feature. The error falls as 1/B
  instead of 1/√B. (Systematic sampling, one offset for all strata, has the same law per feature.)

Mean group query (GQA): the G query heads of a KV head share one draw, so the group reads one
subset of key features. With ``m = mean_g |q_g|`` and ``norm = max_i m_i``,

    m̂ = norm · c / B,  c drawn with p = m / norm,    ŝ_g = (m̂ ⊙ q_g / m) Kᵀ,

unbiased for every head (``E[m̂] = m``). With G = 1 this is the single-head estimator above
(``q / |q| = sign(q)``). The sampled query ``q̃_g = m̂ ⊙ q_g / m`` replaces q in the softmax; the
softmax of an unbiased score is not unbiased, which is the price of the score-stage saving.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from santa import sampling
from santa.checks import integer
from santa.sampling import check_budget, check_generator, check_sampler, check_uniforms

SCORE_SAMPLERS = ("iid", "stratified")


@dataclass
class BernoulliQuery:
    """query: ``[B, Hq, Lq, D]`` float64, the sampled query q̃ (``E[q̃] = q``); features_read:
    ``[B, Hkv, Lq, D]`` bool, the key features a KV head's group reads (some draw nonzero)."""

    query: torch.Tensor
    features_read: torch.Tensor

    @property
    def read_fraction(self) -> float:
        """Share of key features read, over every KV head, query row and feature."""
        return float(self.features_read.float().mean())


def group_heads(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, Hq, Lq, D]`` → float64 ``[B, Hkv, G, Lq, D]``: query head h is head h % G of group h // G."""
    b, hq, lq, d = query.shape
    return query.to(torch.float64).reshape(b, kv_heads, hq // kv_heads, lq, d)


def feature_probabilities(grouped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mean group query of each KV head and its Bernoulli probabilities.

    grouped: ``[B, Hkv, G, Lq, D]`` (:func:`group_heads`). Returns ``m [B, Hkv, Lq, D]``
    (``mean_g |q_g|``), ``norm [B, Hkv, Lq, 1]`` (``max_i m_i``) and ``probs = m / norm`` in [0, 1]
    (0 where the whole row is 0). All float64.
    """
    m = grouped.abs().mean(dim=2)
    norm = m.amax(dim=-1, keepdim=True)
    return m, norm, m / norm.masked_fill(norm == 0, 1.0)


def uniforms_shape(probs_shape: torch.Size, samples: int, sampler: str) -> tuple[int, ...]:
    """``[..., D, B]`` for iid (B uniforms per feature), ``[..., D]`` for stratified (one)."""
    return (*probs_shape, samples) if sampler == "iid" else tuple(probs_shape)


def draw_counts(probs: torch.Tensor, samples: int, sampler: str, uniforms: torch.Tensor) -> torch.Tensor:
    """Nonzero draws per feature, ``c = Σ_n b⁽ⁿ⁾``: probs ``[..., D]`` → ``[..., D]`` float64."""
    if sampler == "iid":
        return (uniforms < probs.unsqueeze(-1)).sum(dim=-1).to(torch.float64)
    scaled = samples * probs  # B·p: ⌊B·p⌋ certain strata, one random stratum holding the rest
    certain = torch.floor(scaled)
    return certain + (uniforms < scaled - certain).to(torch.float64)


def bernoulli_query(
    query: torch.Tensor,
    samples: int,
    *,
    kv_heads: int | None = None,
    sampler: str = "stratified",
    uniforms: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> BernoulliQuery:
    """Sample the query of Bernoulli qKᵀ: ``q̃ Kᵀ`` is an unbiased estimate of ``q Kᵀ``.

    query: ``[B, Hq, Lq, D]`` floating point. samples: B ≥ 1 ternary draws. kv_heads: Hkv dividing
    Hq (default Hq: one group per head); the ``Hq / Hkv`` heads of a group share one draw (mean
    group query). sampler: ``"stratified"`` (default) or ``"iid"``. uniforms: values in [0, 1) of
    shape ``[B, Hkv, Lq, D]`` (stratified) or ``[B, Hkv, Lq, D, samples]`` (iid), on query's device;
    drawn from ``generator`` when None. Stratified draws one uniform per feature for any B; iid
    draws B, refused past ``santa.sampling.MAX_DRAWS`` uniforms.

    NaN or inf in a query head gives NaN in every head of its KV group (same batch element and
    query row): the group shares one draw, scaled by ``max_i mean_g |q_gi|``.
    samples and kv_heads take Python or numpy ints: a wrong type (a float, a bool) is a TypeError,
    a bad value a ValueError.
    """
    if not isinstance(query, torch.Tensor) or not query.is_floating_point():
        raise TypeError(f"query must be a floating-point torch.Tensor, got {getattr(query, 'dtype', type(query).__name__)}")
    if query.dim() != 4 or query.shape[1] < 1 or query.shape[3] < 1:
        raise ValueError(f"query must have shape [B, Hq, Lq, D] with Hq ≥ 1 and D ≥ 1, got {tuple(query.shape)}")
    samples = check_budget(samples, "samples")
    check_sampler(sampler, SCORE_SAMPLERS)
    hq = query.shape[1]
    kv_heads = hq if kv_heads is None else kv_heads
    kv_heads = integer("kv_heads", kv_heads, low=1)
    if hq % kv_heads:
        raise ValueError(f"kv_heads must be an int ≥ 1 dividing the {hq} query heads, got {kv_heads}")
    expected = uniforms_shape((query.shape[0], kv_heads, *query.shape[2:]), samples, sampler)
    if sampler == "iid" and math.prod(expected) > sampling.MAX_DRAWS:
        raise ValueError(
            f"samples={samples} with sampler='iid' needs {math.prod(expected):,} uniforms (shape {list(expected)}), past "
            f"santa.sampling.MAX_DRAWS = {sampling.MAX_DRAWS:,}: use sampler='stratified' (one uniform per feature) or fewer samples"
        )
    check_generator(generator, query.device)
    grouped = group_heads(query, kv_heads)
    m, norm, probs = feature_probabilities(grouped)
    if uniforms is None:
        uniforms = torch.rand(expected, generator=generator, device=query.device, dtype=torch.float64)
    else:
        check_uniforms(uniforms, expected, query.device, sampler, "query")
    counts = draw_counts(probs, samples, sampler, uniforms.to(torch.float64))
    m_hat = norm * counts / samples  # E[m̂] = m
    ratio = m_hat / m.masked_fill(m == 0, 1.0)  # m̂ / m; 0 where m = 0 (then q_g = 0 there too)
    sampled = (grouped * ratio.unsqueeze(2)).reshape(query.shape)
    return BernoulliQuery(query=sampled, features_read=counts > 0)
