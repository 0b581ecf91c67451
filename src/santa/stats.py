"""Variance traces of the estimators, unique keys read, and the paper's op/byte/energy accounting."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from santa.sampling import check_budget, check_sampler, sample_counts

ADD_PJ = 0.9  # energy of one 32-bit float add (Horowitz, 2014), picojoules
MULT_PJ = 3.7  # energy of one 32-bit float multiply


def _check_probs_values(probs: torch.Tensor, values: torch.Tensor) -> None:
    if not isinstance(probs, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise TypeError("probs and values must be torch.Tensors")
    if values.dim() < 2 or probs.shape != values.shape[:-1]:
        raise ValueError(
            f"values must be [..., n, d] matching probs [..., n], got probs {tuple(probs.shape)} and values {tuple(values.shape)}"
        )


def iid_variance_trace(probs: torch.Tensor, values: torch.Tensor, budget: int) -> torch.Tensor:
    """``tr Cov = (Σ_j p_j ‖v_j‖² − ‖μ‖²) / S``. probs ``[..., n]``, values ``[..., n, d]`` → ``[...]``."""
    p, v = probs.double(), values.double()
    mu = torch.einsum("...n,...nd->...d", p, v)
    second_moment = torch.einsum("...n,...n->...", p, (v * v).sum(-1))
    return (second_moment - (mu * mu).sum(-1)) / budget


def stratum_weights(probs: torch.Tensor, budget: int) -> torch.Tensor:
    """Distribution of the sampled key given stratum m: ``w[..., m, j] = S·|[F(j−1), F(j)) ∩ [m/S, (m+1)/S)|``.

    probs ``[..., n]`` → ``[..., S, n]`` float64, each stratum row summing to 1.
    """
    p = probs.double()
    cumulative = torch.cumsum(p, dim=-1)
    total = cumulative[..., -1:]  # 1 up to round-off; dividing makes the last stratum close at 1
    cdf_hi, cdf_lo = cumulative / total, (cumulative - p) / total
    edges = torch.arange(budget + 1, device=p.device, dtype=torch.float64) / budget
    lo, hi = edges[:-1, None], edges[1:, None]  # [S, 1]
    overlap = torch.minimum(cdf_hi.unsqueeze(-2), hi) - torch.maximum(cdf_lo.unsqueeze(-2), lo)
    return overlap.clamp_min(0.0) * budget


def stratified_variance_trace(probs: torch.Tensor, values: torch.Tensor, budget: int) -> torch.Tensor:
    """``(1/S²) Σ_m tr Σ_m`` with Σ_m the value covariance within stratum m. ``[..., n]``, ``[..., n, d]`` → ``[...]``."""
    w = stratum_weights(probs, budget)  # [..., S, n]
    v = values.double()
    mu_m = torch.einsum("...mn,...nd->...md", w, v)
    second_m = torch.einsum("...mn,...n->...m", w, (v * v).sum(-1))
    return (second_m - (mu_m * mu_m).sum(-1)).sum(-1) / budget**2


def replicate_variance_trace(
    probs: torch.Tensor,
    values: torch.Tensor,
    budget: int,
    sampler: str,
    *,
    replicates: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``(1/(R−1)) Σ_r ‖ô_r − ō‖²`` from R independent draws. ``[..., n]``, ``[..., n, d]`` → ``[...]``."""
    if replicates < 2:
        raise ValueError(f"replicates must be ≥ 2, got {replicates}")
    p = probs.expand(replicates, *probs.shape)
    counts = sample_counts(p, budget, sampler, generator=generator).double()  # [R, ..., n]
    estimates = torch.einsum("r...n,...nd->r...d", counts, values.double()) / budget
    deviation = estimates - estimates.mean(dim=0, keepdim=True)
    return (deviation * deviation).sum(-1).sum(0) / (replicates - 1)


def variance_trace(
    probs: torch.Tensor,
    values: torch.Tensor,
    budget: int,
    sampler: str,
    *,
    replicates: int = 64,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Trace of the covariance of the sampled-attention estimate ô, per row.

    probs ``[..., n]``, values ``[..., n, d]`` → float64 ``[...]``. Closed forms for ``"iid"`` and
    ``"stratified"``; ``"systematic"`` has none and is estimated from ``replicates`` draws.
    """
    _check_probs_values(probs, values)
    budget = check_budget(budget)
    sampler = check_sampler(sampler)
    if sampler == "iid":
        return iid_variance_trace(probs, values, budget)
    if sampler == "stratified":
        return stratified_variance_trace(probs, values, budget)
    return replicate_variance_trace(probs, values, budget, sampler, replicates=replicates, generator=generator)


def unique_keys(counts: torch.Tensor, *, group_size: int = 1) -> torch.Tensor:
    """Distinct keys sampled per row: ``counts [..., H, n]`` → ``[..., H // group_size]`` int64.

    With ``group_size = G > 1`` the G query heads sharing a KV head are merged (their union is
    the set of value rows that KV head must read); heads ``g·G … g·G+G−1`` form group g.
    """
    if counts.dim() < 2 and group_size > 1:
        raise ValueError("counts must be [..., H, n] to merge head groups")
    sampled = counts > 0
    if group_size > 1:
        h, n = sampled.shape[-2:]
        if h % group_size:
            raise ValueError(f"head count {h} is not a multiple of group_size {group_size}")
        sampled = sampled.reshape(*sampled.shape[:-2], h // group_size, group_size, n).any(dim=-2)
    return sampled.sum(dim=-1)


@dataclass(frozen=True)
class ValueStageCost:
    """Per-query, per-head value-stage work (paper Appendix E, Table 8)."""

    adds: int
    mults: int
    value_reads: int
    writes: int

    @property
    def energy_pj(self) -> float:
        return self.adds * ADD_PJ + self.mults * MULT_PJ


def value_stage_cost(
    n_keys: int, head_dim: int, *, method: str = "santa", budget: int | None = None, unique_rows: int | None = None
) -> ValueStageCost:
    """Scalar adds, multiplies, value-element reads and writes for one query and head.

    method ``"dense"``: n·d each. ``"topk"``: k·d adds, k·d mults, k·d reads. ``"santa"``: S·d adds,
    d mults (the 1/S), S·d reads — or ``unique_rows·d`` reads when repeats are read once.
    """
    d = head_dim
    if method == "dense":
        return ValueStageCost(adds=n_keys * d, mults=n_keys * d, value_reads=n_keys * d, writes=d)
    budget = check_budget(budget)
    if method == "topk":
        k = min(budget, n_keys)
        return ValueStageCost(adds=k * d, mults=k * d, value_reads=k * d, writes=d)
    if method == "santa":
        rows = budget if unique_rows is None else unique_rows
        return ValueStageCost(adds=budget * d, mults=d, value_reads=rows * d, writes=d)
    raise ValueError(f"method must be 'dense', 'topk' or 'santa', got {method!r}")


def prefill_cost(n_queries: int, n_keys: int, head_dim: int, *, method: str = "santa", budget: int | None = None) -> dict:
    """Per-head prefill work (Appendix G, Table 10): score stage plus value stage, as a dict of counts."""
    d = head_dim
    score = {"adds": n_queries * n_keys * d, "mults": n_queries * n_keys * d, "reads": (n_queries + n_keys) * d}
    per_query = value_stage_cost(n_keys, d, method=method, budget=budget)
    value = {
        "adds": n_queries * per_query.adds,
        "mults": n_queries * per_query.mults,
        "reads": n_queries * per_query.value_reads,
    }
    return {"score": score, "value": value, "energy_pj": (score["adds"] + value["adds"]) * ADD_PJ + (score["mults"] + value["mults"]) * MULT_PJ}
