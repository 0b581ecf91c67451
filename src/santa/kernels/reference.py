"""Torch emulation of exactly what the decode kernels compute (the CPU fallback and the test oracle).

- :func:`philox_uniforms` reproduces the kernels' counter-based uniforms bit for bit: Triton's
  Philox4x32-10 keyed on ``seed`` with counter ``(offset_lo, offset_hi, b·H + h, stream)`` and
  its ``uint_to_uniform_float`` (:func:`call_uniforms`: a call's counters, request-keyed ``(position,
  head_offset + h, stream)`` included). Stream 0 is prop's one offset per (sequence, head); stream
  ``t + 1`` is flash's offset for tile t.
- :func:`prop_reference`: exact global systematic sampling (S²ANTA-sys over the whole sequence),
  ``counts = sample_counts(p, S, "systematic", uniforms=U)`` with U from :func:`philox_uniforms`.
- :func:`flash_reference`: per-tile systematic sampling with the uniform budget
  ``S_tile = ⌈S / T⌉`` and the FlashDecoding merge ``ô = Σ_t (W_t/Z)(1/S_tile) Σ_{j∈t} c_j v_j``.
- Both compute a sequence whose live keys the budget covers (``S ≥ n_live``: :func:`covered`) exactly,
  ``Σ_j p_j v_j`` with every live V row read once (count 1), the one rule of every decode path.

Non-finite input behaves as in the kernels: a NaN or +inf score makes the (sequence, head)'s output
NaN (its counts zero; flash: the counts of its poisoned tiles); a non-finite value makes its output
element non-finite where its row is read (prop: by a head that samples it; flash: by every head of
the KV group, where one head samples it in the tile).

Computed in float64 on the inputs' device; the kernels compute in float32, so counts can differ
where a comb point lies within rounding of a CDF step (tests account for exactly that).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from santa import sampling
from santa.attention import pilot_moments
from santa.checks import integer
from santa.sampling import check_budget, sample_counts

MAX_BUDGET = 1 << 20  # samples per head the kernels accept (pass 2 launches ⌈S/32⌉ programs per head)


def check_budget_for_kernels(budget: object) -> int:
    """The budget as an int in ``[1, MAX_BUDGET]`` (S ≥ n is legal: such a sequence is computed exactly)."""
    budget = check_budget(budget)
    if budget > MAX_BUDGET:
        raise ValueError(f"budget must lie in [1, {MAX_BUDGET}] samples per head for the decode kernels, got {budget}")
    return budget

_DRAWS_PER_CALL = 2**22  # points one sample_counts call materialises here (~100 MB): the budget is up to 2**20 per head

_PHILOX_ROUND_A = np.uint64(0xD2511F53)
_PHILOX_ROUND_B = np.uint64(0xCD9E8D57)
_PHILOX_KEY_A = np.uint64(0x9E3779B9)
_PHILOX_KEY_B = np.uint64(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)
_UNIFORM_SCALE = np.float32(4.6566127342e-10)  # Triton's uint_to_uniform_float for 32-bit ints


def _philox4x32(c0, c1, c2, c3, k0, k1, rounds: int = 10):
    """Philox4x32 on uint64 arrays holding 32-bit values (products of two 32-bit values fit in 64 bits)."""
    for _ in range(rounds):
        prod_b = _PHILOX_ROUND_B * c2
        prod_a = _PHILOX_ROUND_A * c0
        c0, c1, c2, c3 = (
            ((prod_b >> np.uint64(32)) ^ c1 ^ k0) & _MASK32,
            prod_b & _MASK32,
            ((prod_a >> np.uint64(32)) ^ c3 ^ k1) & _MASK32,
            prod_a & _MASK32,
        )
        k0 = (k0 + _PHILOX_KEY_A) & _MASK32
        k1 = (k1 + _PHILOX_KEY_B) & _MASK32
    return c0


def _as_uint64(x) -> np.ndarray:
    return np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x).astype(np.int64).astype(np.uint64)


def philox_uniforms(seed, offset, rows: torch.Tensor | np.ndarray, stream: torch.Tensor | np.ndarray | int = 0) -> torch.Tensor:
    """The kernels' float32 uniforms in [0, 1) under key ``seed`` and counter ``(offset, rows, stream)``
    (``offset`` fills the counter's two low words, ``rows`` the third, ``stream`` the fourth), all
    broadcast together. seed, offset: ints (numpy ints too) in ``[0, 2**64)``, or int tensors/arrays
    of values in ``[0, 2**63)`` (one per element after broadcasting: per-sequence keys and positions)."""
    if isinstance(seed, (torch.Tensor, np.ndarray)):
        seed_np = _as_uint64(seed)
    else:
        seed_np = np.uint64(integer("seed", seed, low=0, high=2**64))
    if isinstance(offset, (torch.Tensor, np.ndarray)):
        offset_np = _as_uint64(offset)
    else:
        offset_np = np.uint64(integer("offset", offset, low=0, high=2**64))
    rows_np, stream_np = _as_uint64(rows), _as_uint64(stream)
    seed_np, offset_np, rows_np, stream_np = np.broadcast_arrays(seed_np, offset_np, rows_np, stream_np)
    with np.errstate(over="ignore"):
        c0 = offset_np & _MASK32
        c1 = (offset_np >> np.uint64(32)) & _MASK32
        k0 = seed_np & _MASK32
        k1 = (seed_np >> np.uint64(32)) & _MASK32
        x = _philox4x32(c0, c1, rows_np & _MASK32, stream_np & _MASK32, k0, k1)
        signed = x.astype(np.uint32).view(np.int32)
        signed = np.where(signed < 0, -signed - 1, signed).astype(np.int32)
        u = signed.astype(np.float32) * _UNIFORM_SCALE
    return torch.from_numpy(np.ascontiguousarray(u, dtype=np.float32))


def call_uniforms(seed, offset, positions: torch.Tensor | None, batch: int, heads: int, stream=0, *,
                  head_offset: int = 0) -> torch.Tensor:
    """A decode call's uniforms ``[B, H, *rows, *stream's shape]`` (CPU float32), as the kernels draw them.

    - ``positions`` None: key ``seed`` (an int, or an int tensor ``[B]``: one key per sequence),
      counter ``(offset, b·H + head_offset + h, stream)``;
    - ``positions`` ``[B, *rows]`` (``[B]`` for one query per sequence, ``[B, Lq]`` for query rows):
      key as above, counter ``(position, head_offset + h, stream)``: a draw depends on the sequence's key, its
      query's position, the head and the stream, never on the batch row (santa.rng, "request-keyed draws").

    ``head_offset`` (int ≥ 0, default 0): the global index of the call's first head, when the call holds a
    slice of the model's heads (a tensor-parallel rank's: ``rank × H``), so that the counter's head is the
    model's and every split of the heads draws what one call with all of them draws. Only the positional
    form is split-invariant (the batch-row form's ``b·H`` counts the call's heads): the decode entry points
    take ``head_offset`` with positions alone.
    """
    head_offset = integer("head_offset", head_offset, low=0)
    stream_np = np.asarray(stream.cpu() if isinstance(stream, torch.Tensor) else stream)
    tail = (1,) * stream_np.ndim
    rows = () if positions is None else tuple(positions.shape[1:])
    ones = (1,) * len(rows)
    keys = seed.reshape(batch, 1, *ones, *tail) if isinstance(seed, torch.Tensor) else seed
    heads_ix = (head_offset + torch.arange(heads)).reshape(1, heads, *ones, *tail)
    if positions is None:
        return philox_uniforms(keys, offset, torch.arange(batch).reshape(batch, 1, *tail) * heads + heads_ix, stream_np)
    return philox_uniforms(keys, positions.reshape(batch, 1, *rows, *tail), heads_ix, stream_np)


def sampler_uniforms(seed, positions: torch.Tensor, heads: int, sampler: str, budget: int) -> torch.Tensor:
    """The request-keyed uniforms a sampler of :func:`santa.sample_counts` consumes, for query
    ``positions [B, *rows]``: ``[B, H, *rows]`` for systematic (its one offset on stream 0, as prop's),
    ``[B, H, *rows, S]`` for iid and stratified (sample m on stream m). CPU float32."""
    streams = 0 if sampler == "systematic" else torch.arange(budget)
    return call_uniforms(seed, 0, positions, positions.shape[0], heads, streams)


PILOT_STREAM = 1 << 31  # an iid or stratified output's pilot: past every stream its own draws use (m < MAX_BUDGET)


def pilot_uniforms(seed, positions: torch.Tensor, heads: int, sampler: str) -> torch.Tensor:
    """The request-keyed uniform of an error target's pilot (:func:`santa.attention.error_target_weights`: systematic
    for every sampler), one offset per row ``[B, H, *rows]``, CPU float32, on a stream the output's draws never use:
    stream 1 under a systematic output (stream 0), as prop's kernel draws it; ``PILOT_STREAM`` under iid and stratified
    outputs, whose draw m takes stream m (a pilot on stream 1 would share draw 1's uniform: S_r would then depend on
    the output's own draws)."""
    return call_uniforms(seed, 0, positions, positions.shape[0], heads, 1 if sampler == "systematic" else PILOT_STREAM)


def gather_cache(
    cache: torch.Tensor,
    *,
    batch: int,
    seq_lens: torch.Tensor | None,
    block_table: torch.Tensor | None,
    kv_layout: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense ``[B, L, H_kv, d]`` view of a contiguous or paged cache, and the visible-key mask ``[B, L]``."""
    if kv_layout == "HND":
        cache = cache.transpose(1, 2)  # [B or pages, L or page_size, H_kv, d]
    if block_table is None:
        dense = cache
    else:
        page_size = cache.shape[1]
        pages = block_table.long()  # [B, max_pages]
        if seq_lens is not None:  # entries past a sequence's pages are never read: any value is legal there
            used = torch.arange(pages.shape[1], device=pages.device) < (-(-seq_lens.to(pages.device).long() // page_size)).unsqueeze(1)
            pages = torch.where(used, pages, 0)
        dense = cache[pages].reshape(batch, pages.shape[1] * page_size, cache.shape[2], cache.shape[3])
    n_max = dense.shape[1]
    positions = torch.arange(n_max, device=cache.device)
    if seq_lens is None:
        visible = torch.ones(batch, n_max, dtype=torch.bool, device=cache.device)
    else:
        visible = positions < seq_lens.to(cache.device).long().unsqueeze(-1)
    return dense, visible


def _scores(q: torch.Tensor, k: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """float64 scores ``[B, H, L]`` (−inf where not visible) for q ``[B, H, d]``, k ``[B, L, H_kv, d]``.
    One sequence at a time and per KV group (no K repeated per query head): the float64 copy held at
    once is one sequence's K, so a long GQA call needs no more memory than its own cache in float64."""
    batch, heads, dim = q.shape
    kv_heads = k.shape[2]
    s = torch.empty(batch, heads, k.shape[1], dtype=torch.float64, device=q.device)
    for b in range(batch):
        grouped = q[b].double().reshape(kv_heads, heads // kv_heads, dim)  # [H_kv, G, d]
        s[b] = torch.einsum("kgd,lkd->kgl", grouped, k[b].double()).reshape(heads, -1) * scale
    return s.masked_fill(~visible.unsqueeze(1), -math.inf)


def _softmax_rows(s: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim; an all −inf row gets all-zero weights, a row holding NaN or +inf NaN."""
    row_max = s.amax(dim=-1, keepdim=True)
    row_max = row_max.masked_fill(row_max == -math.inf, 0.0)
    w = torch.exp(s - row_max)
    total = w.sum(dim=-1, keepdim=True)
    return w / total.masked_fill(total == 0, 1.0)


def _read_rows(weights: torch.Tensor, read: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``Σ_j w_j v_j`` ``[B, H, d]`` float64 over the rows each head reads (``read``) only, as the kernels
    read them: a non-finite value reaches (its element of) the result only where its row is read, and
    then as the kernels' sum makes it (``0·inf`` is NaN, inf stays inf). weights ``[B, H, L]`` (float),
    read bool ``[B, H, L]``, v ``[B, L, H_kv, d]``. Gathers the read rows alone (at most S per head when
    sampling): no V repeated per query head."""
    batch, heads, _ = weights.shape
    group = heads // v.shape[2]
    b, h, j = read.nonzero(as_tuple=True)
    rows = v[b, j, torch.div(h, group, rounding_mode="floor")].double()  # [reads, d]
    out = torch.zeros(batch * heads, v.shape[-1], dtype=torch.float64, device=v.device)
    out.index_add_(0, b * heads + h, weights[b, h, j].double().unsqueeze(-1) * rows)
    return out.reshape(batch, heads, -1)


def _sampled_values(counts: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """``Σ_j c_j v_j`` ``[B, H, d]`` float64 over the sampled rows only: a V row is read only where
    sampled, as in the kernels, so a non-finite value reaches (its element of) the result only where
    ``c_j > 0``, and then as the kernels' sum makes it (inf stays inf, NaN or inf − inf is NaN).
    counts ``[B, H, L]``, v ``[B, L, H_kv, d]``.
    """
    return _read_rows(counts, counts > 0, v)


def covered(visible: torch.Tensor, budget: int) -> torch.Tensor:
    """bool ``[B]``: the sequences whose live keys a budget covers (``S ≥ n_live``), from their visible-key
    mask ``[B, L]``. The one rule of every decode path: sampling S rows cannot read fewer value rows than
    such a sequence has and only adds variance, so it is computed exactly (:func:`exact_values`). The
    decision is each sequence's own, on its live keys, never the cache's capacity or a batch's padding."""
    return visible.sum(-1) <= budget


def exact_values(probs: torch.Tensor, visible: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention over each sequence's live keys, as the kernels compute a covered sequence:
    ``(Σ_j p_j v_j [B, H, d] float64, counts [B, H, L] int64)``, every live V row read once (count 1;
    a value row with ``p_j = 0`` still enters as ``0·v_j``). probs ``[B, H, L]``, visible ``[B, L]``."""
    read = visible.unsqueeze(1).expand(probs.shape)
    return _read_rows(probs, read, v), read.long()


def systematic_counts(probs: torch.Tensor, budget: int, uniforms: torch.Tensor, *, max_draws: int | None = None,
                      budgets: torch.Tensor | None = None) -> torch.Tensor:
    """``sample_counts(probs, budget, "systematic", uniforms=uniforms)``, drawn a block of rows at a
    time so that no call materialises more than ``max_draws`` points (default: 2**22, or
    ``santa.sampling.MAX_DRAWS`` if lower). The kernels take any budget up to ``MAX_BUDGET`` per head,
    which ``rows × S`` points at once would pass MAX_DRAWS; each row's counts depend only on its own
    probabilities and uniform, so the result is the one of a single call. budgets: int64 ``[...]``,
    a budget per row up to ``budget`` (:func:`santa.sampling.sample_counts_per_row`, an error target's).

    probs ``[..., n]``, uniforms ``[...]`` → int64 ``[..., n]``.
    """
    if max_draws is None:
        max_draws = min(_DRAWS_PER_CALL, sampling.MAX_DRAWS)
    max_draws, budget = integer("max_draws", max_draws, low=1), check_budget(budget)
    rows_per_call = max(1, max_draws // budget)
    flat_probs, flat_uniforms = probs.reshape(-1, probs.shape[-1]), uniforms.reshape(-1)
    flat_budgets = None if budgets is None else budgets.reshape(-1)

    def draw(rows: slice) -> torch.Tensor:
        if flat_budgets is None:
            return sample_counts(flat_probs[rows], budget, "systematic", uniforms=flat_uniforms[rows])
        return sampling.sample_counts_per_row(flat_probs[rows], flat_budgets[rows], "systematic", cap=budget,
                                              uniforms=flat_uniforms[rows])

    blocks = [draw(slice(start, start + rows_per_call)) for start in range(0, flat_probs.shape[0], rows_per_call)]
    return torch.cat(blocks).reshape(probs.shape)


def pilot_budget(pilot_counts: torch.Tensor, v: torch.Tensor, *, pilot: int, error_target: float, cap: int) -> torch.Tensor:
    """Each row's budget from its pilot, as prop's pass 2 forms it (``_pilot_budget``, in float32): the
    pilot's mean row ȳ and mean squared norm from its counts ``[B, H, L]`` and ``v [B, L, H_kv, d]``, then
    ``T̂ = max((sq − ‖ȳ‖²)·S₀/(S₀−1), 0)``, ``N̂ = ‖ȳ‖² − T̂/S₀``, ``S_r = min(cap, max(S₀, ⌈T̂·(1/ε²)/N̂⌉))``, the
    cap where N̂ ≤ 0 or an estimate is not finite (:func:`santa.error_target.adaptive_budgets`'s rule). The
    sums are float64 here and float32 there: a budget can differ by one where ``T̂/(ε²N̂)`` lies within float32
    rounding of an integer. Returns int64 ``[B, H]``."""
    mean, square_mean = pilot_moments(pilot_counts.unsqueeze(2), v.transpose(1, 2), pilot)  # the pilot's rows alone
    mean, square_mean = mean[:, :, 0].float(), square_mean[:, :, 0].float()  # ȳ, (1/S₀) Σ_m ‖y_m‖²
    mean_norm2 = (mean * mean).sum(-1)
    trace = ((square_mean - mean_norm2) * (pilot / (pilot - 1))).clamp_min(0.0)
    norm2 = mean_norm2 - trace / pilot
    usable = (norm2 > 0) & (norm2 < math.inf) & (trace < math.inf)
    inv_target2 = torch.tensor(1.0 / error_target**2, dtype=torch.float32)
    wanted = torch.ceil(trace * inv_target2 / torch.where(usable, norm2, 1.0)).clamp_min(float(pilot)).clamp_max(float(cap))
    return torch.where(usable, wanted.long(), cap)


def prop_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    budget: int,
    *,
    seq_lens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    kv_layout: str = "NHD",
    scale: float | None = None,
    seed: int | torch.Tensor = 0,
    offset: int = 0,
    positions: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
    head_offset: int = 0,
    error_target: float | None = None,
    pilot: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact global systematic sampling: returns ``(out [B, H, d] in q.dtype, counts [B, H, n_max] int64)``.
    seed, offset, positions, head_offset: the draws' key and counter (:func:`call_uniforms`); starts ``[B]``:
    sequence b's keys are ``[starts[b], seq_lens[b])`` (a left-padded or windowed run).
    error_target: each row's budget from a pilot (:mod:`santa.error_target`, ``budget`` the cap): a systematic
    draw of ``pilot`` samples on stream 1's uniform, :func:`pilot_budget`, then the row's own draw on
    stream 0's (counts sum to each row's budget; the pilot's rows are read too but not counted)."""
    budget = check_budget_for_kernels(budget)
    batch, heads, dim = q.shape
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    k, visible = gather_cache(k_cache, batch=batch, seq_lens=seq_lens, block_table=block_table, kv_layout=kv_layout)
    v, _ = gather_cache(v_cache, batch=batch, seq_lens=seq_lens, block_table=block_table, kv_layout=kv_layout)
    if starts is not None:
        visible = visible & (torch.arange(k.shape[1], device=visible.device) >= starts.to(visible.device).long().unsqueeze(-1))
    probs = _softmax_rows(_scores(q, k, visible, scale))  # [B, H, L]
    nan_rows = torch.isnan(probs).any(dim=-1)  # NaN/+inf scores: NaN out, no samples
    uniforms = call_uniforms(seed, offset, positions, batch, heads, head_offset=head_offset).to(q.device, torch.float64)
    clean = probs.masked_fill(nan_rows.unsqueeze(-1), 0.0)
    budgets = None
    if error_target is not None:  # the pilot: stream 1
        pilot_uniforms = call_uniforms(seed, offset, positions, batch, heads, 1, head_offset=head_offset).to(q.device, torch.float64)
        budgets = pilot_budget(systematic_counts(clean, pilot, pilot_uniforms), v, pilot=pilot, error_target=error_target,
                               cap=budget)
    counts = systematic_counts(clean, budget, uniforms, budgets=budgets)  # [B, H, L]
    divisor = budget if budgets is None else budgets.unsqueeze(-1).double()
    out = _sampled_values(counts, v, heads) / divisor  # ô = (1/S) Σ_j c_j v_j
    out, counts = _exact_where_covered(out, counts, lambda: probs, visible, v, budget)
    return out.masked_fill(nan_rows.unsqueeze(-1), math.nan).to(q.dtype), counts


def _exact_where_covered(out, counts, probs_of, visible, v, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, counts)`` with the sequences the budget covers (:func:`covered`) replaced by exact attention
    (``probs_of()``: the softmax weights ``[B, H, L]``, NaN rows where a score is NaN or +inf; such a row's
    output is NaN and its counts zero, as where it samples)."""
    rows = covered(visible, budget)
    if not bool(rows.any()):
        return out, counts
    probs = probs_of()[rows]
    nan_rows = torch.isnan(probs).any(dim=-1, keepdim=True)
    exact, read = exact_values(probs.masked_fill(nan_rows, 0.0), visible[rows], v[rows])
    out, counts = out.clone(), counts.clone()
    out[rows], counts[rows] = exact, read.masked_fill(nan_rows, 0)
    return out, counts


def flash_tile_budget(budget: int, n_tiles: torch.Tensor) -> torch.Tensor:
    """Uniform per-tile budget ``S_tile = ⌈S / T⌉`` (T ≥ 1 tiles in the sequence)."""
    return (budget + n_tiles.clamp_min(1) - 1) // n_tiles.clamp_min(1)


def flash_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    budget: int,
    *,
    tile: int,
    seq_lens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    kv_layout: str = "NHD",
    scale: float | None = None,
    seed: int | torch.Tensor = 0,
    offset: int = 0,
    positions: torch.Tensor | None = None,
    head_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tile systematic sampling with merge: returns ``(out [B, H, d], counts [B, H, n_max] int64)``.
    seed, offset, positions, head_offset: the draws' key and counter (:func:`call_uniforms`, stream ``t + 1``).

    Tile t of sequence b draws ``S_tile`` samples from its own distribution with the uniform of
    stream ``t + 1``; ``ô = Σ_t (W_t / Z) (1/S_tile) Σ_{j∈t} c_j v_j`` with ``W_t`` the tile's mass.
    """
    budget, tile = check_budget_for_kernels(budget), integer("tile", tile, low=1)
    batch, heads, dim = q.shape
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    k, visible = gather_cache(k_cache, batch=batch, seq_lens=seq_lens, block_table=block_table, kv_layout=kv_layout)
    v, _ = gather_cache(v_cache, batch=batch, seq_lens=seq_lens, block_table=block_table, kv_layout=kv_layout)
    n_max = k.shape[1]
    n_tiles_max = -(-n_max // tile)
    pad = n_tiles_max * tile - n_max
    scores = _scores(q, k, visible, scale)  # [B, H, L]
    s = torch.nn.functional.pad(scores, (0, pad), value=-math.inf).reshape(batch, heads, n_tiles_max, tile)
    poisoned = torch.isnan(s) | (s == math.inf)  # [B, H, T, tile]
    nan_rows = poisoned.flatten(2).any(dim=-1)  # [B, H]: NaN out
    s = s.masked_fill(poisoned, -math.inf)
    tile_max = s.amax(dim=-1)  # [B, H, T]
    local = _softmax_rows(s)  # per-tile distribution [B, H, T, tile]
    tile_mass = torch.exp(s - tile_max.masked_fill(tile_max == -math.inf, 0.0).unsqueeze(-1)).sum(-1)
    row_max = tile_max.amax(dim=-1, keepdim=True)
    row_max = row_max.masked_fill(row_max == -math.inf, 0.0)
    weight = torch.exp(tile_max - row_max) * tile_mass  # W_t = exp(m_t − m*) ℓ_t
    weight = weight.nan_to_num(0.0)
    z = weight.sum(-1, keepdim=True)
    lens = visible.sum(-1)  # [B]
    n_tiles = (lens + tile - 1) // tile
    s_tile = flash_tile_budget(budget, n_tiles)  # [B]
    uniforms = call_uniforms(seed, offset, positions, batch, heads, torch.arange(1, n_tiles_max + 1),
                             head_offset=head_offset).to(q.device, torch.float64)
    counts = torch.zeros(batch, heads, n_tiles_max, tile, dtype=torch.int64, device=q.device)
    for b in range(batch):
        counts[b] = systematic_counts(local[b], int(s_tile[b]), uniforms[b])
    counts = counts.masked_fill(poisoned.any(-1).unsqueeze(-1), 0)  # a poisoned tile samples nothing (its row is NaN)
    # a tile reads a V row once for its whole KV group (where any head of the group sampled it): its
    # values enter every head's Σ c_j v_j of the group, c_j = 0 included (0·inf = NaN), as in the kernel's dot
    group = heads // k.shape[2]
    read = (counts > 0).reshape(batch, heads // group, group, n_tiles_max, tile).any(2).repeat_interleave(group, dim=1)
    coef = weight / z.masked_fill(z == 0, 1.0) / s_tile.double().view(batch, 1, 1)  # [B, H, T]
    counts = counts.reshape(batch, heads, n_tiles_max * tile)[..., :n_max]
    read = read.reshape(batch, heads, n_tiles_max * tile)[..., :n_max]
    row_coef = coef.repeat_interleave(tile, dim=-1)[..., :n_max] * counts  # (W_t/Z)(1/S_tile) c_j  [B, H, L]
    out = _read_rows(row_coef, read, v)
    out, counts = _exact_where_covered(out, counts, lambda: _softmax_rows(scores), visible, v, budget)
    out = out.masked_fill(nan_rows.unsqueeze(-1), math.nan)
    return out.to(q.dtype), counts
