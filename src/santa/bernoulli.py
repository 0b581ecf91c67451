"""Score stage: Bernoulli qKᵀ (the paper's Section 5 and Appendix C), the reference.

A query ``q ∈ R^D`` is divided by ``norm = max_i |q_i|``, so every ``|q_i| / norm`` is a
probability, and replaced by B ternary vectors ``q̂⁽ⁿ⁾_i = b⁽ⁿ⁾_i · sign(q_i)`` with
``b⁽ⁿ⁾_i ~ Bernoulli(|q_i| / norm)``. Then

    ŝ = (norm / B) Σ_n q̂⁽ⁿ⁾ Kᵀ,    E[ŝ] = q Kᵀ:

a ternary vector only adds or subtracts key features, and a feature whose B draws are all 0 is
never read. The B draws of one feature come from the points ``T_n`` of :func:`santa.sampling.sample_points`
(``b⁽ⁿ⁾_i = [T_n < p_i]``): ``iid`` gives ``Σ_n b⁽ⁿ⁾_i ~ Binomial(B, p_i)``; ``stratified`` (the
paper's default) gives ``⌊B p_i⌋`` or ``⌊B p_i⌋ + 1``, so the error falls as 1/B instead of 1/√B.
For one feature only the stratum holding ``B p_i`` is random, so ``systematic`` has the same law.

Mean group query (GQA): the G query heads of a KV head share one draw, so the group reads one
subset of key features. With ``m = mean_g |q_g|`` and ``norm = max_i m_i``,

    m̂ = (norm / B) Σ_n b⁽ⁿ⁾,  b⁽ⁿ⁾_i ~ Bernoulli(m_i / norm),    ŝ_g = (m̂ ⊙ q_g / m) Kᵀ,

unbiased for every head (``E[m̂] = m``). With G = 1 this is the single-head estimator above
(``q / |q| = sign(q)``). The sampled query ``q̃_g = m̂ ⊙ q_g / m`` replaces q in the softmax; the
softmax of an unbiased score is not unbiased, which is the price of the score-stage saving.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from santa.sampling import check_budget, check_sampler, draw_uniforms, sample_points, uniforms_shape


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


def feature_probabilities(query: torch.Tensor, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mean group query of each KV head and its Bernoulli probabilities.

    query: ``[B, Hq, Lq, D]``. Returns ``m [B, Hkv, Lq, D]`` (``mean_g |q_g|`` over the
    ``G = Hq / Hkv`` heads of a group), ``norm [B, Hkv, Lq, 1]`` (``max_i m_i``) and
    ``probs = m / norm`` in [0, 1] (0 where the whole row is 0). All float64.
    """
    b, hq, lq, d = query.shape
    grouped = query.to(torch.float64).reshape(b, kv_heads, hq // kv_heads, lq, d)
    m = grouped.abs().mean(dim=2)
    norm = m.amax(dim=-1, keepdim=True)
    return m, norm, m / norm.masked_fill(norm == 0, 1.0)


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
    group query). sampler: ``"iid"``, ``"stratified"`` (default) or ``"systematic"``. uniforms: the
    float64 uniforms the draws consume, ``[B, Hkv, Lq, D, samples]`` (iid, stratified) or
    ``[B, Hkv, Lq, D]`` (systematic); drawn from ``generator`` when None.
    """
    if not isinstance(query, torch.Tensor) or not query.is_floating_point():
        raise TypeError(f"query must be a floating-point torch.Tensor, got {getattr(query, 'dtype', type(query).__name__)}")
    if query.dim() != 4:
        raise ValueError(f"query must have shape [B, Hq, Lq, D] (4 dims), got {tuple(query.shape)}")
    samples = check_budget(samples, "samples")
    check_sampler(sampler)
    hq = query.shape[1]
    kv_heads = hq if kv_heads is None else kv_heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or hq % kv_heads:
        raise ValueError(f"kv_heads must be an int ≥ 1 dividing the {hq} query heads, got {kv_heads!r}")
    m, norm, probs = feature_probabilities(query, kv_heads)
    if uniforms is None:
        uniforms = draw_uniforms(probs.shape, samples, sampler, device=query.device, generator=generator)
    expected = uniforms_shape(probs.shape, samples, sampler)
    if tuple(uniforms.shape) != expected:
        raise ValueError(f"uniforms must have shape {list(expected)} for sampler {sampler!r}, got {list(uniforms.shape)}")
    points = sample_points(uniforms, samples, sampler)  # [B, Hkv, Lq, D, samples]
    counts = (points < probs.unsqueeze(-1)).sum(dim=-1)  # Σ_n b⁽ⁿ⁾_i
    m_hat = norm * counts / samples  # E[m̂] = m
    ratio = m_hat / m.masked_fill(m == 0, 1.0)  # m̂ / m; 0 where m = 0 (then q_g = 0 there too)
    b, _, lq, d = query.shape
    grouped = query.to(torch.float64).reshape(b, kv_heads, hq // kv_heads, lq, d)
    sampled = (grouped * ratio.unsqueeze(2)).reshape(b, hq, lq, d)
    return BernoulliQuery(query=sampled, features_read=counts > 0)
