"""Draws from a categorical distribution by inverse CDF: iid, stratified, systematic.

This module is the spec the GPU kernels are checked against. Every sampler maps uniforms
``t ∈ [0, 1)`` to key indices with the inverse CDF ``F⁻¹(t) = min{ j : F(j) > t }``; given the same
uniforms, the result is deterministic.

- ``iid`` (SANTA): ``T_m ~ U[0, 1)`` independently, S of them.
- ``stratified`` (S²ANTA-strat): ``T_m = (m + U_m) / S`` with ``U_m ~ U[0, 1)`` independent.
- ``systematic`` (S²ANTA-sys): ``T_m = (m + U) / S`` with one ``U ~ U[0, 1)`` per row.

The draws are materialised: ``rows × S`` points. A budget up to the number of keys n never costs
more than the probabilities already in memory; a budget above n is refused once the draws would
pass :data:`MAX_DRAWS` (a budget of 10**9 would otherwise end in an allocator error or run for
hours). Raise ``santa.sampling.MAX_DRAWS`` on a machine with more memory.
"""

from __future__ import annotations

import numbers

import torch

from santa.checks import has_values

SAMPLERS = ("iid", "stratified", "systematic")
MAX_DRAWS = 2**26  # draws per call once S > n: 64 Mi points, ~1.5 GiB of float64 uniforms, points and int64 indices


def check_budget(budget: object, name: str = "budget") -> int:
    """Return ``budget`` as an int, or raise if it is not an integer ≥ 1."""
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral):
        raise TypeError(f"{name} must be an int ≥ 1, got {type(budget).__name__} {budget!r}")
    if budget < 1:
        raise ValueError(f"{name} must be ≥ 1, got {budget}")
    return int(budget)


def check_sampler(sampler: object, allowed: tuple[str, ...] = SAMPLERS, name: str = "sampler") -> str:
    """Return ``sampler``, or raise naming the argument ``name`` if it is not one of ``allowed``."""
    if not isinstance(sampler, str) or sampler not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {sampler!r}")
    return sampler


def check_draws(rows: int, budget: int, n_keys: int, name: str = "budget") -> None:
    """Refuse ``rows × budget`` draws past :data:`MAX_DRAWS` when ``budget > n_keys`` (S ≤ n is always drawn)."""
    draws = rows * budget
    if budget > n_keys and draws > MAX_DRAWS:
        raise ValueError(
            f"{name}={budget} is above the {n_keys} keys and needs rows × {name} = {rows:,} × {budget:,} = {draws:,} draws, "
            f"past santa.sampling.MAX_DRAWS = {MAX_DRAWS:,}: use {name} ≤ {n_keys} (or fewer rows per call, or raise MAX_DRAWS)"
        )


def check_generator(generator: object, device: torch.device) -> torch.Generator | None:
    """Return ``generator``, or raise unless it is None or a ``torch.Generator`` on ``device``'s type."""
    if generator is None:
        return None
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != torch.device(device).type:
        raise ValueError(f"generator is on {generator.device} but the tensors are on {device}")
    return generator


def uniforms_shape(batch_shape: torch.Size, budget: int, sampler: str) -> tuple[int, ...]:
    """Shape of the uniforms a sampler consumes: ``[..., S]`` for iid and stratified, ``[...]`` for systematic."""
    return tuple(batch_shape) if sampler == "systematic" else (*batch_shape, budget)


def draw_uniforms(
    batch_shape: torch.Size,
    budget: int,
    sampler: str,
    *,
    device: torch.device,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Fresh float64 uniforms in [0, 1) in the shape ``sampler`` consumes."""
    shape = uniforms_shape(batch_shape, budget, sampler)
    return torch.rand(shape, generator=check_generator(generator, device), device=device, dtype=torch.float64)


def sample_points(uniforms: torch.Tensor, budget: int, sampler: str, *, budgets: torch.Tensor | None = None) -> torch.Tensor:
    """Map uniforms to the S points ``T_m ∈ [0, 1)`` at which the inverse CDF is read.

    uniforms: ``[..., S]`` (iid, stratified) or ``[...]`` (systematic). Returns ``[..., S]`` float64.
    budgets: a budget per row (int ``[...]``, each ≤ S): row r's strata are then ``1/S_r`` wide (its points
    past ``m = S_r`` are not its own: :func:`sample_counts_per_row` drops them).
    """
    u = uniforms.to(torch.float64)
    if sampler == "iid":
        return u
    strata = torch.arange(budget, device=u.device, dtype=torch.float64)  # m = 0..S-1
    width = budget if budgets is None else budgets.to(torch.float64).unsqueeze(-1)  # S, or S_r per row
    if sampler == "stratified":
        return (strata + u) / width  # T_m = (m + U_m) / S
    return (strata + u.unsqueeze(-1)) / width  # T_m = (m + U) / S


def inverse_cdf(probs: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """Key indices ``F⁻¹(t) = min{ j : F(j) > t }`` for every point t.

    probs: ``[..., n]`` non-negative weights summing to 1 per row (float; computed in float64).
    points: ``[..., S]`` in [0, 1). Returns ``[..., S]`` int64. A point past ``F(n−1)`` (round-off)
    maps to the last key with nonzero probability, so a zero-probability key is never drawn.
    """
    p = probs.to(torch.float64)
    cdf = torch.cumsum(p, dim=-1)
    index = torch.searchsorted(cdf.contiguous(), points.contiguous(), right=True)
    positions = torch.arange(p.shape[-1], device=p.device)
    last_visible = torch.where(p > 0, positions, -1).amax(dim=-1, keepdim=True).clamp_min(0)
    return torch.minimum(index, last_visible)


def counts_from_indices(indices: torch.Tensor, n_keys: int) -> torch.Tensor:
    """Histogram of sampled indices: ``[..., S]`` int64 → ``[..., n_keys]`` int64 counts."""
    counts = torch.zeros((*indices.shape[:-1], n_keys), dtype=torch.int64, device=indices.device)
    return counts.scatter_add_(-1, indices, torch.ones_like(indices))


def check_probs(probs: object) -> torch.Tensor:
    """Return ``probs``, or raise unless it is a float ``[..., n]`` tensor (not on the meta device) of
    finite, non-negative rows each summing to 1 (within ``max(1e-3, 64·eps)`` of its dtype) or to 0
    (an empty row)."""
    if not isinstance(probs, torch.Tensor):
        raise TypeError(f"probs must be a torch.Tensor, got {type(probs).__name__}")
    if not probs.is_floating_point():
        raise TypeError(f"probs must be a floating-point tensor [..., n], got dtype {probs.dtype}")
    has_values("probs", probs)
    if probs.dim() < 1 or probs.shape[-1] < 1:
        raise ValueError(f"probs must have shape [..., n] with n ≥ 1, got {tuple(probs.shape)}")
    if torch.isnan(probs).any():
        raise ValueError("probs contains NaN: a NaN distribution has no samples")
    if (probs < 0).any():
        raise ValueError("probs must be non-negative")
    total = probs.sum(dim=-1, dtype=torch.float64)
    tolerance = max(1e-3, 64 * torch.finfo(probs.dtype).eps)
    bad = ~(((total - 1).abs() <= tolerance) | (total == 0))
    if bad.any():
        raise ValueError(
            f"probs rows must sum to 1 (or be all zero), got a row summing to {float(total[bad][0]):.6g}: "
            "normalise the weights (e.g. softmax) first"
        )
    return probs


def sample_indices(
    probs: torch.Tensor,
    budget: int,
    sampler: str,
    *,
    uniforms: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """S key indices per row: ``probs [..., n]`` → ``[..., S]`` int64 (see :func:`sample_counts`)."""
    probs = check_probs(probs)
    budget = check_budget(budget)
    sampler = check_sampler(sampler)
    uniforms = _draw_or_check(probs, budget, sampler, uniforms, generator, "budget")
    return inverse_cdf(probs, sample_points(uniforms, budget, sampler))


def _draw_or_check(probs: torch.Tensor, budget: int, sampler: str, uniforms, generator, name: str) -> torch.Tensor:
    """The uniforms of a ``budget``-sample draw per row of ``probs``: checked when given, else drawn from
    ``generator``; the draws' count refused past :data:`MAX_DRAWS` first (naming ``name``)."""
    batch_shape = probs.shape[:-1]
    check_draws(batch_shape.numel(), budget, probs.shape[-1], name)
    if uniforms is None:
        return draw_uniforms(batch_shape, budget, sampler, device=probs.device, generator=generator)
    check_uniforms(uniforms, uniforms_shape(batch_shape, budget, sampler), probs.device, sampler, "probs")
    return uniforms


def check_uniforms(uniforms: object, expected: tuple[int, ...], device: torch.device, sampler: str, against: str) -> None:
    """Raise unless ``uniforms`` is a tensor of shape ``expected`` on ``device`` with values in [0, 1)."""
    if not isinstance(uniforms, torch.Tensor) or tuple(uniforms.shape) != tuple(expected):
        got = tuple(uniforms.shape) if isinstance(uniforms, torch.Tensor) else type(uniforms).__name__
        raise ValueError(f"uniforms must have shape {list(expected)} for sampler={sampler!r}, got {got}")
    if uniforms.device != device:
        raise ValueError(f"uniforms is on {uniforms.device} but {against} is on {device}")
    if ((uniforms < 0) | (uniforms >= 1) | torch.isnan(uniforms)).any():
        raise ValueError("uniforms must lie in [0, 1)")


def sample_counts(
    probs: torch.Tensor,
    budget: int,
    sampler: str,
    *,
    uniforms: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Per-key sample counts ``c_j`` with ``Σ_j c_j = S`` on every row that has mass.

    probs: ``[..., n]`` float, non-negative, each row summing to 1 (or all zero: such a row,
        e.g. a fully masked query, gets zero counts).
    budget: S ≥ 1 samples per row. S ≤ n always; S > n only while ``rows × S`` ≤
        :data:`MAX_DRAWS` (the draws are materialised), else a ValueError naming ``budget``.
    sampler: ``"iid"``, ``"stratified"`` or ``"systematic"``.
    uniforms: optional, values in [0, 1): ``[..., S]`` for iid and stratified, ``[...]`` for
        systematic. Given them, the counts are deterministic; otherwise drawn from ``generator``.
    Returns int64 ``[..., n]``. Keys with zero probability never receive a sample.
    """
    indices = sample_indices(probs, budget, sampler, uniforms=uniforms, generator=generator)
    counts = counts_from_indices(indices, probs.shape[-1])
    empty_row = probs.sum(dim=-1, keepdim=True) <= 0
    return counts.masked_fill(empty_row, 0)


def check_row_budgets(budgets: object, batch_shape: torch.Size, cap: int, device: torch.device) -> torch.Tensor:
    """Return per-row budgets ``S_r``, or raise unless they are an integer tensor of ``batch_shape`` on
    ``device`` with every value in ``[1, cap]``."""
    if not isinstance(budgets, torch.Tensor) or budgets.dtype not in (torch.int32, torch.int64):
        got = budgets.dtype if isinstance(budgets, torch.Tensor) else type(budgets).__name__
        raise TypeError(f"budgets must be an int32 or int64 tensor of per-row sample counts, got {got}")
    if tuple(budgets.shape) != tuple(batch_shape):
        raise ValueError(f"budgets must have the rows' shape {list(batch_shape)}, got {list(budgets.shape)}")
    if budgets.device != device:
        raise ValueError(f"budgets is on {budgets.device} but probs is on {device}")
    if budgets.numel() and ((budgets < 1).any() or (budgets > cap).any()):
        raise ValueError(f"budgets must lie in [1, cap = {cap}], got values in [{int(budgets.min())}, {int(budgets.max())}]")
    return budgets.long()


def sample_counts_per_row(
    probs: torch.Tensor,
    budgets: torch.Tensor,
    sampler: str,
    *,
    cap: int,
    uniforms: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """:func:`sample_counts` with a budget per row: row r draws ``S_r ≤ cap`` samples.

    probs: ``[..., n]`` as for :func:`sample_counts`. budgets: int ``[...]``, each in ``[1, cap]``.
    The uniforms are those of a ``cap``-sample draw (``[..., cap]`` for iid and stratified, ``[...]``
    for systematic); row r reads the points ``T_m`` of its own budget for ``m < S_r`` only:
    iid ``u_m``, stratified ``(m + u_m) / S_r``, systematic ``(m + U) / S_r``. With every ``S_r = cap``
    the counts are those of ``sample_counts(probs, cap, sampler, uniforms=…)``, exactly.
    Returns int64 ``[..., n]`` with ``Σ_j c_j = S_r`` on every row that has mass (zero on an empty row).
    """
    probs = check_probs(probs)
    cap = check_budget(cap, "cap")
    sampler = check_sampler(sampler)
    batch_shape = probs.shape[:-1]
    budgets = check_row_budgets(budgets, batch_shape, cap, probs.device)
    uniforms = _draw_or_check(probs, cap, sampler, uniforms, generator, "cap")
    points = sample_points(uniforms, cap, sampler, budgets=budgets)  # T_m with row r's own strata
    live = torch.arange(cap, device=probs.device) < budgets.unsqueeze(-1)  # the first S_r points of row r
    indices = inverse_cdf(probs, points.masked_fill(~live, 0.0))
    counts = torch.zeros((*batch_shape, probs.shape[-1]), dtype=torch.int64, device=probs.device)
    counts.scatter_add_(-1, indices, live.long())
    empty_row = probs.sum(dim=-1, keepdim=True) <= 0
    return counts.masked_fill(empty_row, 0)
