"""Variance traces of the estimators, unique keys read, and the paper's op/byte/energy accounting."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from santa.checks import has_values, integer
from santa.sampling import check_budget, check_probs, check_sampler, sample_counts

ADD_PJ = 0.9  # energy of one 32-bit float add (Horowitz, 2014), picojoules
MULT_PJ = 3.7  # energy of one 32-bit float multiply


def _check_probs_values(probs: torch.Tensor, values: torch.Tensor) -> None:
    if not isinstance(probs, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise TypeError("probs and values must be torch.Tensors")
    check_probs(probs)
    if values.dim() < 2 or probs.shape != values.shape[:-1]:
        raise ValueError(
            f"values must be [..., n, d] matching probs [..., n], got probs {tuple(probs.shape)} and values {tuple(values.shape)}"
        )
    if probs.device != values.device:
        raise ValueError(f"values is on {values.device} but probs is on {probs.device}")


def _check_count(name: str, value: object, minimum: int) -> int:
    return integer(name, value, low=minimum)


def iid_variance_trace(probs: torch.Tensor, values: torch.Tensor, budget: int) -> torch.Tensor:
    """``tr Cov = (Σ_j p_j ‖v_j‖² − ‖μ‖²) / S``. probs ``[..., n]``, values ``[..., n, d]`` → ``[...]``."""
    p, v = probs.double(), values.double()
    mu = torch.einsum("...n,...nd->...d", p, v)
    second_moment = torch.einsum("...n,...n->...", p, (v * v).sum(-1))
    return (second_moment - (mu * mu).sum(-1)) / budget


def _cdf(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(F(j−1), F(j))`` per key in float64, normalised so that ``F(n−1) = 1`` (the last stratum
    closes at 1); an all-zero row stays all zero (no stratum overlaps it: zero variance)."""
    p = probs.double()
    cumulative = torch.cumsum(p, dim=-1)
    total = cumulative[..., -1:].masked_fill(cumulative[..., -1:] == 0, 1.0)  # 1 up to round-off
    return (cumulative - p) / total, cumulative / total


def stratum_weights(probs: torch.Tensor, budget: int, strata: torch.Tensor | None = None) -> torch.Tensor:
    """Distribution of the sampled key given stratum m: ``w[..., m, j] = S·|[F(j−1), F(j)) ∩ [m/S, (m+1)/S)|``.

    probs ``[..., n]`` → ``[..., S, n]`` float64, each stratum row summing to 1. strata: optional
    int64 ``[..., K]`` stratum indices m (default every m = 0…S−1) → ``[..., K, n]``.
    """
    cdf_lo, cdf_hi = _cdf(probs)
    if strata is None:
        edges = torch.arange(budget + 1, device=probs.device, dtype=torch.float64) / budget
        lo, hi = edges[:-1, None], edges[1:, None]  # [S, 1]
    else:
        lo, hi = (strata.double() / budget).unsqueeze(-1), ((strata + 1).double() / budget).unsqueeze(-1)  # [..., K, 1]
    overlap = torch.minimum(cdf_hi.unsqueeze(-2), hi) - torch.maximum(cdf_lo.unsqueeze(-2), lo)
    return overlap.clamp_min(0.0) * budget


def step_strata(probs: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The strata ``m_j = ⌊S·F(j)⌋`` holding a CDF step, j = 0…n−2, and which of them is the first
    of its value (a stratum holding several steps counts once): ``[..., n−1]`` int64 and bool.

    Only these strata have within-stratum variance; every other stratum lies inside one key.
    """
    _, cdf_hi = _cdf(probs)
    m = torch.floor(cdf_hi[..., :-1] * budget).long()  # nondecreasing in j
    first = torch.ones_like(m, dtype=torch.bool)
    first[..., 1:] = m[..., 1:] != m[..., :-1]
    return m, first


def stratified_variance_trace(probs: torch.Tensor, values: torch.Tensor, budget: int) -> torch.Tensor:
    """``(1/S²) Σ_m tr Σ_m`` with Σ_m the value covariance within stratum m. ``[..., n]``, ``[..., n, d]`` → ``[...]``.

    With S ≥ n only the ≤ n − 1 strata holding a CDF step (:func:`step_strata`) are summed (the
    others have Σ_m = 0), so the cost is ``O(min(S, n) · n)`` per row for any budget.
    """
    n = probs.shape[-1]
    if budget < n:
        w, keep = stratum_weights(probs, budget), None  # [..., S, n]
    else:
        strata, keep = step_strata(probs, budget)
        w = stratum_weights(probs, budget, strata)  # [..., n−1, n]
    v = values.double()
    mu_m = torch.einsum("...mn,...nd->...md", w, v)
    second_m = torch.einsum("...mn,...n->...m", w, (v * v).sum(-1))
    within = second_m - (mu_m * mu_m).sum(-1)  # tr Σ_m
    if keep is not None:
        within = within * keep
    return within.sum(-1) / budget**2


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
    replicates = _check_count("replicates", replicates, 2)
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

    probs ``[..., n]`` (rows summing to 1, as :func:`santa.sample_counts` takes), values
    ``[..., n, d]`` → float64 ``[...]``. Closed forms for ``"iid"`` (O(n) for any budget) and
    ``"stratified"`` (O(min(S, n)·n)); ``"systematic"`` has none and is estimated from
    ``replicates ≥ 2`` draws of :func:`santa.sample_counts`, so a budget above n is refused there
    once ``replicates × rows × S`` passes ``santa.sampling.MAX_DRAWS``.
    """
    _check_probs_values(probs, values)
    budget = check_budget(budget)
    sampler = check_sampler(sampler)
    replicates = _check_count("replicates", replicates, 2)
    if sampler == "iid":
        return iid_variance_trace(probs, values, budget)
    if sampler == "stratified":
        return stratified_variance_trace(probs, values, budget)
    return replicate_variance_trace(probs, values, budget, sampler, replicates=replicates, generator=generator)


def unique_keys(counts: torch.Tensor, *, group_size: int = 1) -> torch.Tensor:
    """Distinct keys sampled per row: ``counts [..., H, n]`` → ``[..., H // group_size]`` int64.

    With ``group_size = G > 1`` the G query heads sharing a KV head are merged (their union is
    the set of value rows that KV head must read); heads ``g·G … g·G+G−1`` form group g.
    Negative (or NaN) counts and tensors on the meta device are refused (ValueError naming ``counts``).
    """
    if not isinstance(counts, torch.Tensor):
        raise TypeError(f"counts must be a torch.Tensor, got {type(counts).__name__}")
    if counts.dim() < 1:
        raise ValueError(f"counts must have shape [..., n], got {tuple(counts.shape)}")
    if counts.is_complex():
        raise TypeError(f"counts must be a real (integer, bool or float) tensor, got {counts.dtype}")
    group_size = _check_count("group_size", group_size, 1)
    if counts.dim() < 2 and group_size > 1:
        raise ValueError("counts must be [..., H, n] to merge head groups")
    has_values("counts", counts)
    negative = ~(counts >= 0)  # NaN too
    if bool(negative.any()):
        where = tuple(int(i) for i in negative.nonzero()[0])
        raise ValueError(f"counts must be ≥ 0 (samples per key), got counts[{', '.join(map(str, where))}] = {counts[where].item()}")
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
    if method not in ("dense", "topk", "santa"):
        raise ValueError(f"method must be 'dense', 'topk' or 'santa', got {method!r}")
    n_keys, d = _check_count("n_keys", n_keys, 1), _check_count("head_dim", head_dim, 1)
    if method == "dense":
        return ValueStageCost(adds=n_keys * d, mults=n_keys * d, value_reads=n_keys * d, writes=d)
    budget = check_budget(budget)
    if method == "topk":
        k = min(budget, n_keys)
        return ValueStageCost(adds=k * d, mults=k * d, value_reads=k * d, writes=d)
    rows = budget
    if unique_rows is not None:
        rows = _check_count("unique_rows", unique_rows, 0)
        if rows > min(budget, n_keys):
            raise ValueError(f"unique_rows must be ≤ min(budget, n_keys) = {min(budget, n_keys)}, got {rows}")
    return ValueStageCost(adds=budget * d, mults=d, value_reads=rows * d, writes=d)


def prefill_cost(n_queries: int, n_keys: int, head_dim: int, *, method: str = "santa", budget: int | None = None) -> dict:
    """Per-head prefill work (Appendix G, Table 10): score stage plus value stage, as a dict of counts."""
    n_queries, d = _check_count("n_queries", n_queries, 0), _check_count("head_dim", head_dim, 1)
    n_keys = _check_count("n_keys", n_keys, 1)
    score = {"adds": n_queries * n_keys * d, "mults": n_queries * n_keys * d, "reads": (n_queries + n_keys) * d}
    per_query = value_stage_cost(n_keys, d, method=method, budget=budget)
    value = {
        "adds": n_queries * per_query.adds,
        "mults": n_queries * per_query.mults,
        "reads": n_queries * per_query.value_reads,
    }
    return {"score": score, "value": value, "energy_pj": (score["adds"] + value["adds"]) * ADD_PJ + (score["mults"] + value["mults"]) * MULT_PJ}
