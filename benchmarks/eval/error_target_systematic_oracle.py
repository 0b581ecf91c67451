"""How much can the best per-head budget allocation save for *systematic* sampling at equal reads? (issue 42)

``error_target_allocation.py`` bounded per-head allocations with the iid error ``T_h / S`` (``T_h = Σ p‖v‖² − ‖o‖²``);
santa's default output is systematic, whose error on real heads is well below that and falls with S at a rate of its
own per head. Here every captured head (``captured_heads``: the last position of an 8k niah_single prompt, dense prefill
on the CPU, as allocation.py) gets its true systematic error curve

    E_h(S) = E_U ‖ô_sys(S; U) − o_h‖²,   ô_sys = (1/S) Σ_m v[F⁻¹((m + U)/S)],  F⁻¹(t) = min{j : F(j) > t},

computed *exactly* in U (not by sampling): with ``f_j = frac(S·F(j))`` and ``w_j = v_j − v_{j+1}``, santa's counts are
``c_j = G_j − G_{j−1}``, ``G_j = ⌊S·F(j)⌋ + [U < f_j]`` (checked against ``santa.sampling.sample_counts`` with the same
uniforms, and the exact mean against a 2048-midpoint grid of U through santa's sampler), so
``ô − o = (1/S) Σ_j ([U < f_j] − f_j) w_j`` is piecewise constant in U between the sorted ``f_j``: O(n log n + n·d) a head.

Every layer's H heads share R = 128·H reads; each allocation's summed absolute error ``Σ_h E_h(S_h)`` over a fixed
S = 128's (per-layer mean of the ratio, and the ratio of the sums over all layers):

- ``oracle``: the exact minimum of ``Σ_h E_h(S_h)`` at ``Σ_h S_h ≤ R`` with S_h on :data:`GRID` (a multiple-choice
  knapsack, solved by dynamic programming over the reads); ``oracle_hull``: the convex relaxation (greedy marginal
  allocation on each head's lower convex hull of the grid points, the last step fractional), a lower bound of it;
  ``oracle_detuned``: the oracle's budgets and the fixed one each moved by −2, −1, +1, +2 reads (the error of one S is
  jagged in S by ±10–20 %, so an oracle on a grid partly picks lucky integers), the ratio of the summed errors;
- ``neyman_iid`` (``S_h ∝ √T_h``) and ``relative_iid`` (``S_h ∝ T_h / ‖o_h‖²``): rules that read the iid trace,
  evaluated on the systematic error;
- ``neyman_systematic``: ``S_h ∝ √(128·E_h(128))`` (a one-point fit ``a_h / S``);
- ``powerlaw_systematic``: the optimum for a two-point fit ``a_h S^(−b_h)`` through E_h(64) and E_h(256).

The rules' budgets are integers (largest-remainder rounding, ``Σ S_h = R`` exactly, each ≥ 1) and their error is the
exact E_h at those integers. ``reads_at_equal_error``: the fewest reads R' at which the oracle's summed error is no
more than the fixed S = 128's, over R (per layer and over all). Per model also the quantiles of
``T_h / (128·E_h(128))`` (how far systematic beats the iid formula per head) and of the local slope
``−d log E / d log S`` between 64 and 256.

``--positions P`` (P > 1; key ``model/length/P<P>``, e.g. ``smollm2-135m/8192/P16``): the last P query positions
of the same prompt, captured in the same single prefill (:func:`captured_positions`; position t sees its first t + 1
keys), as a stand-in for P decode steps. Per layer, the oracle and the rules above over the pool of H·P (head,
position) pairs sharing R = 128·H·P reads (``pooled``), against the one-position oracle at each position
(``per_position``: the P = 1 analysis' oracle, mean over layers × positions and ratio of the sums) and against each
head alone over its P positions (``steps_only_oracle``, 128·P reads a head). ``cross_layer``: every layer's heads ×
positions sharing R = 128·H·P·layers (the summed *absolute* error across layers; bracketed by the hull bound and a
Lagrangian allocation on the grid, a dynamic programme being too large), ``cross_layer_per_layer_scale`` the same with
each layer's errors divided by its fixed S = 128's summed error (the layers weighed equally),
``cross_layer_last_position`` the last position alone.

    python benchmarks/eval/error_target_systematic_oracle.py OUT.jsonl [--models smollm2-135m,qwen2.5-coder-0.5b] \
        [--length 8192] [--layers all|N] [--positions P]

One JSONL record per model (key ``model/length``), appended as it is measured after a provenance record per
invocation (``santa.provenance.run_record``, through ``append_cases``); a re-run skips the models already in the file.
Each model's curves (E_h on the grid, T_h, ‖o_h‖² per head) go beside it, ``OUT_STEM.MODEL.LENGTH.curves.json.gz``
(with their own provenance record).
``--layers N`` keeps N layers evenly spaced through the model (recorded in the record) where a full model does not fit.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from error_target_calibration import append_cases, captured_heads  # noqa: E402

PER_HEAD = 128
GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160, 192, 224, 256, 320, 384, 448,
        512, 640, 768, 1024, 1536, 2048)
QUANTILES = (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0)
DETUNE = (-2, -1, 1, 2)  # reads added to every head's budget: how much of the oracle is luck of the grid's integers
RULES = ("oracle", "oracle_hull", "oracle_detuned", "neyman_iid", "relative_iid", "neyman_systematic", "powerlaw_systematic")


# ---------------------------------------------------------------------------------------------- one head's error


def head_cdf(probs: torch.Tensor) -> torch.Tensor:
    """``F(j)`` of one head's weights ``[n]`` in float64 as santa's inverse CDF reads it (``cumsum`` of the float64
    weights), with every key from the last one of nonzero weight on set to 1 (santa maps a point past ``F(n−1)`` to
    that key)."""
    p = probs.to(torch.float64)
    cdf = torch.cumsum(p, -1)
    last = int(torch.nonzero(p > 0).max())
    cdf[last:] = 1.0
    return cdf


def systematic_counts(probs: torch.Tensor, budget: int, uniforms: torch.Tensor) -> torch.Tensor:
    """Systematic counts ``[U, n]`` for uniforms ``[U]`` by the closed form ``c_j = G_j − G_{j−1}``,
    ``G_j = ⌊S·F(j)⌋ + [U < frac(S·F(j))]`` (what this study integrates; equal to ``santa.sampling.sample_counts``)."""
    scaled = budget * head_cdf(probs)
    floor = torch.floor(scaled)
    below = floor + (uniforms.to(torch.float64)[:, None] < (scaled - floor)).to(torch.float64)
    return torch.diff(below, dim=-1, prepend=torch.zeros_like(below[:, :1])).round().long()


def prefix_sums(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """``torch.cumsum(x, 1)`` of ``x [B, n, d]``, computed a block of ``block`` rows at a time (a lower-triangular
    matmul inside each block, then the blocks' running totals added): the same sums in another order, 2–3× faster than
    ``cumsum`` along a strided dimension on the CPU. ``n`` a multiple of ``block`` saves a copy."""
    n = x.shape[1]
    pad = (-n) % block
    if pad:
        x = torch.cat([x, x.new_zeros(x.shape[0], pad, x.shape[2])], 1)
    y = torch.matmul(torch.tril(x.new_ones(block, block)), x.reshape(x.shape[0], -1, block, x.shape[2]))
    y[:, 1:] += torch.cumsum(y[:, :-1, -1], 1)[:, :, None]
    return y.reshape(x.shape)[:, :n]


def systematic_error(probs: torch.Tensor, values: torch.Tensor, budgets, chunk: int = 2, block: int = 32) -> torch.Tensor:
    """Exact ``E_U ‖ô_sys(S) − o‖²`` for each S in ``budgets``: one head, ``probs [n]``, ``values [n, d]`` → ``[len]``
    float64.

    ``ô − o = (1/S) Σ_j ([U < f_j] − f_j) w_j`` with ``f_j = frac(S·F(j))``, ``w_j = v_j − v_{j+1}`` (``v_{n+1} = 0``):
    for U between consecutive sorted ``f``, the keys with ``f_j > U`` are a prefix of the descending order, so the error
    is a prefix sum (:func:`prefix_sums`, the order padded to a multiple of ``block`` with a zero row), and the mean
    over U weighs each by its interval's length. ``chunk`` budgets at a time (``chunk · n · d`` float64 in flight).
    """
    cdf = head_cdf(probs)
    v = values.to(torch.float64)
    n, d = v.shape
    w = torch.cat([v[:-1] - v[1:], v[-1:], v.new_zeros(1, d)])  # w_j, then a zero row for the padding
    padded = -(-n // block) * block
    out = []
    for at in range(0, len(budgets), chunk):
        s = torch.tensor([float(b) for b in budgets[at: at + chunk]], dtype=torch.float64)[:, None]  # [B, 1]
        scaled = s * cdf
        frac = scaled - torch.floor(scaled)  # [B, n]
        frac_sorted, order = torch.sort(frac, -1, descending=True)
        order = torch.cat([order, order.new_full((len(s), padded - n), n)], 1)
        centre = frac @ w[:n]  # [B, d]: o·S − Σ ⌊S F⌋ w, the mean of the sum below
        prefix = prefix_sums(w[order], block)  # [B, padded, d]: Σ over the k largest f, k = 1 … n (then padding)
        prefix -= centre[:, None]  # U in (f_(k+1), f_(k))
        middle = (prefix * prefix).sum(-1)[:, :n]
        length = torch.cat([frac_sorted[:, :-1] - frac_sorted[:, 1:], frac_sorted[:, -1:]], 1)  # [B, n]
        first = (1 - frac_sorted[:, 0]) * (centre * centre).sum(-1)  # k = 0: U above every f
        out.append((first + (length * middle).sum(1)) / s[:, 0] ** 2)
    return torch.cat(out)


def systematic_error_sampled(probs: torch.Tensor, values: torch.Tensor, budget: int, points: int = 2048) -> float:
    """``E_U ‖ô − o‖²`` on ``points`` midpoints of U through santa's own sampler (``sample_counts``): the check of
    :func:`systematic_error`."""
    from santa.sampling import sample_counts

    p = probs.to(torch.float64)
    p = p / p.sum()
    uniforms = (torch.arange(points, dtype=torch.float64) + 0.5) / points
    counts = sample_counts(p.expand(points, -1), budget, "systematic", uniforms=uniforms)
    v = values.to(torch.float64)
    err = counts.to(torch.float64) @ v / budget - p @ v
    return float((err * err).sum(-1).mean())


def head_moments(probs: torch.Tensor, values: torch.Tensor) -> tuple[float, float]:
    """``(T, ‖o‖²)``: the iid variance trace ``Σ p‖v‖² − ‖o‖²`` and the output's squared norm."""
    p, v = probs.to(torch.float64), values.to(torch.float64)
    o = p @ v
    norm2 = float(o @ o)
    return float(p @ (v * v).sum(-1)) - norm2, norm2


# ---------------------------------------------------------------------------------------------- allocations


def oracle_table(curves: torch.Tensor, grid, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ``min Σ_h E_h(S_h)`` at ``Σ_h S_h ≤ b`` for every b ≤ ``total``, S_h on ``grid`` (dynamic programming over
    the reads, one head at a time): curves ``[H, G]`` → ``(best [total + 1], the budgets [H] at b = total)``
    (``best`` is ``inf`` where b < H·min(grid))."""
    heads = curves.shape[0]
    best = torch.zeros(total + 1, dtype=torch.float64)  # no head yet: nothing spent, no error, at every b
    choice = torch.full((heads, total + 1), -1, dtype=torch.long)
    for h in range(heads):
        candidates = torch.full((len(grid), total + 1), math.inf, dtype=torch.float64)
        for g, s in enumerate(grid):
            if s <= total:
                candidates[g, s:] = best[: total + 1 - s] + curves[h, g]
        best, choice[h] = candidates.min(0)
    budgets = torch.zeros(heads, dtype=torch.long)
    left = total
    for h in range(heads - 1, -1, -1):
        budgets[h] = grid[int(choice[h, left])]
        left -= int(budgets[h])
    return best, budgets


def lower_hull(xs: list[float], ys: list[float]) -> list[int]:
    """Indices of the lower convex hull of points sorted by x (Andrew's monotone chain)."""
    hull: list[int] = []
    for i in range(len(xs)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            cross = (xs[b] - xs[a]) * (ys[i] - ys[a]) - (ys[b] - ys[a]) * (xs[i] - xs[a])
            if cross <= 0:
                hull.pop()
            else:
                break
        hull.append(i)
    return hull


def hull_segments(curves: torch.Tensor, grid) -> tuple[float, float, list[tuple[float, float]]]:
    """Every head at ``grid[0]`` — ``(error, reads)`` — and the segments of the heads' lower convex hulls,
    ``(error decrease per read, reads)``, steepest first (each head's in order, as its hull's slopes rise)."""
    segments = []  # (decrease per read, reads)
    error, reads = 0.0, 0.0
    for row in curves.tolist():
        xs = [float(s) for s in grid]
        index = lower_hull(xs, row)
        error += row[index[0]]
        reads += xs[index[0]]
        for a, b in zip(index, index[1:], strict=False):
            drop = row[a] - row[b]
            if drop > 0:
                segments.append((drop / (xs[b] - xs[a]), xs[b] - xs[a]))
    return error, reads, sorted(segments, key=lambda seg: -seg[0])


def hull_bound(curves: torch.Tensor, grid, total: int) -> float:
    """The convex relaxation of the oracle: every head starts at ``grid[0]``, then the hull segments with the largest
    error decrease per read are taken in turn (each head's in order, as the hull's slopes rise), the last one fractional
    (a mix of two budgets). A lower bound on :func:`oracle_table`'s ``best[total]``."""
    error, reads, segments = hull_segments(curves, grid)
    left = float(total) - reads
    for rate, width in segments:
        if left <= 0:
            break
        take = min(width, left)
        error -= rate * take
        left -= take
    return error


def hull_reads(curves: torch.Tensor, grid, target: float) -> float:
    """The fewest reads at which :func:`hull_bound` is at most ``target`` (a lower bound on the oracle's; ``inf`` when
    no budget on the grid reaches it)."""
    error, reads, segments = hull_segments(curves, grid)
    for rate, width in segments:
        if error <= target:
            break
        take = min(width, (error - target) / rate)
        error -= rate * take
        reads += take
    return reads if error <= target * (1 + 1e-12) else math.inf


def lagrange_budgets(curves: torch.Tensor, grid, total: float) -> torch.Tensor:
    """Budgets ``[H]`` for where a dynamic programme over the reads is too large (thousands of heads): each head takes
    ``argmin_s E_h(s) + λ s`` on ``grid`` (a vertex of its lower hull), λ the smallest (by bisection) whose reads fit
    ``total``. The exact oracle for the reads it spends (≤ ``total``), so its error is at least the oracle's at
    ``total``, which is at least :func:`hull_bound`'s: the two bracket the oracle."""
    s = torch.tensor([float(x) for x in grid], dtype=torch.float64)
    c = curves.to(torch.float64)

    def pick(log_lam: float) -> torch.Tensor:
        return s[torch.argmin(c + math.exp(log_lam) * s, 1)]

    return pick(lambda_for(lambda log_lam: float(pick(log_lam).sum()), total)).long()  # λ low: smallest errors; high: grid[0]


def lambda_for(reads, total: float) -> float:
    """The smallest log λ in [−700, 700] (200 halvings) at which ``reads(log λ)``, falling in λ, is at most ``total``."""
    lo, hi = -700.0, 700.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if reads(mid) > total:
            lo = mid
        else:
            hi = mid
    return hi


def grid_error(curves: torch.Tensor, grid, budgets: torch.Tensor) -> float:
    """``Σ_h E_h(S_h)`` for budgets on ``grid``."""
    index = torch.tensor([grid.index(int(b)) for b in budgets])
    return float(curves[torch.arange(len(index)), index].sum())


def proportional_budgets(weights: torch.Tensor, total: int) -> torch.Tensor:
    """Integer budgets ``∝ weights`` summing to ``total`` exactly, each ≥ 1 (largest remainder)."""
    w = weights.to(torch.float64).clamp_min(0)
    share = total * w / w.sum() if float(w.sum()) > 0 else torch.full_like(w, total / len(w))
    budgets = torch.floor(share).long().clamp_min(1)
    remainder = share - torch.floor(share)
    while int(budgets.sum()) < total:
        i = int(torch.argmax(remainder))
        budgets[i] += 1
        remainder[i] = -math.inf
    while int(budgets.sum()) > total:
        budgets[int(torch.argmax(budgets))] -= 1
    return budgets


def powerlaw_budgets(scale: torch.Tensor, slope: torch.Tensor, total: int) -> torch.Tensor:
    """Real budgets minimising ``Σ a_h S_h^(−b_h)`` at ``Σ S_h = total``: ``a b S^(−b−1) = λ``, λ by bisection
    (``slope`` clamped to [0.05, 4])."""
    a, b = scale.to(torch.float64).clamp_min(1e-300), slope.to(torch.float64).clamp(0.05, 4.0)

    def budgets(log_lam: float) -> torch.Tensor:
        return torch.exp((torch.log(a * b) - log_lam) / (b + 1))

    return budgets(lambda_for(lambda log_lam: float(budgets(log_lam).sum()), total))


# ---------------------------------------------------------------------------------------------- one model


def allocate(curves: torch.Tensor, trace: torch.Tensor, norm2: torch.Tensor, exact=None) -> dict:
    """One pool of heads sharing ``R = 128·len(curves)`` reads, from their curves ``[H, G]`` on :data:`GRID`, iid
    traces and ‖o‖² ``[H]``: each allocation's summed error and the oracle's reads at equal error. ``exact(wanted)``
    gives the summed exact error of integer budgets ``wanted [H, K]``: ``[K]``; without it, only the oracle and its
    hull (what the curves give)."""
    heads = curves.shape[0]
    total = PER_HEAD * heads
    at = {s: i for i, s in enumerate(GRID)}
    fixed = float(curves[:, at[PER_HEAD]].sum())
    best, oracle_budgets = oracle_table(curves, GRID, total)
    reads = int(torch.nonzero(best <= fixed * (1 + 1e-12)).min())
    errors = {"oracle": float(best[total]), "oracle_hull": hull_bound(curves, GRID, total)}
    if exact is None:
        return {"heads": heads, "fixed": fixed, "errors": errors, "reads_at_equal_error": reads / total,
                "oracle_budgets": oracle_budgets.tolist()}
    e64, e256 = curves[:, at[64]], curves[:, at[256]]
    slope = torch.log(e64.clamp_min(1e-300) / e256.clamp_min(1e-300)) / math.log(4)
    rules = {
        "neyman_iid": proportional_budgets(trace.sqrt(), total),
        "relative_iid": proportional_budgets(trace / norm2, total),
        "neyman_systematic": proportional_budgets((PER_HEAD * curves[:, at[PER_HEAD]]).sqrt(), total),
        "powerlaw_systematic": proportional_budgets(powerlaw_budgets(e64 * 64**slope, slope, total), total),
    }
    # the rules' integer budgets, and the oracle's and the fixed budget's detuned by a few reads, in one call a head
    wanted = torch.stack([*rules.values(), *(oracle_budgets + d for d in DETUNE),
                          *(torch.full_like(oracle_budgets, PER_HEAD + d) for d in DETUNE)], 1).clamp_min(1)  # [H, K]
    summed = exact(wanted)
    errors.update({name: float(summed[i]) for i, name in enumerate(rules)})
    detuned = summed[len(rules):].reshape(2, len(DETUNE)).sum(1)  # [oracle, fixed] summed over the offsets
    errors["oracle_detuned"] = float(detuned[0] / detuned[1]) * fixed  # on the fixed budget's scale
    return {
        "heads": heads, "fixed": fixed, "errors": errors, "reads_at_equal_error": reads / total,
        "oracle_budgets": oracle_budgets.tolist(), "rule_budgets": {k: v.tolist() for k, v in rules.items()},
        "slope": slope, "iid_neyman_on_iid": float((trace / rules["neyman_iid"]).sum() / (trace / PER_HEAD).sum()),
    }


def layer_case(probs: torch.Tensor, values: torch.Tensor) -> dict:
    """One layer's heads ``probs [H, n]``, ``values [H, n, d]``: the curves on :data:`GRID`, each allocation's error
    and the oracle's reads at equal error."""
    heads = probs.shape[0]
    curves = torch.stack([systematic_error(probs[h], values[h], GRID) for h in range(heads)])  # [H, G]
    moments = torch.tensor([head_moments(probs[h], values[h]) for h in range(heads)], dtype=torch.float64)
    trace, norm2 = moments[:, 0], moments[:, 1]

    def exact(wanted: torch.Tensor) -> torch.Tensor:
        return torch.stack([systematic_error(probs[h], values[h], wanted[h].tolist()) for h in range(heads)]).sum(0)

    return {**allocate(curves, trace, norm2, exact), "curves": curves, "trace": trace, "norm2": norm2}


def quantiles(values: torch.Tensor) -> dict:
    q = torch.quantile(values.to(torch.float64), torch.tensor(QUANTILES, dtype=torch.float64))
    return {f"q{round(100 * k):02d}": float(v) for k, v in zip(QUANTILES, q, strict=True)}


def check_against_santa(probs: torch.Tensor, values: torch.Tensor, heads: list[int]) -> dict:
    """On ``heads``: the closed-form counts against ``sample_counts`` for random uniforms, and the exact mean error
    against santa's sampler on 2048 midpoints of U, at a few S."""
    from santa.sampling import sample_counts

    g = torch.Generator().manual_seed(0)
    mismatched, compared, worst = 0, 0, 0.0
    for h in heads:
        p = probs[h].to(torch.float64)
        p = p / p.sum()
        for s in (1, 7, 128, 1000):
            uniforms = torch.rand(64, generator=g, dtype=torch.float64)
            ours = systematic_counts(p, s, uniforms)
            theirs = sample_counts(p.expand(64, -1), s, "systematic", uniforms=uniforms)
            mismatched += int((ours != theirs).any(-1).sum())
            compared += 64
        for s in (16, 128, 512):
            exact = float(systematic_error(p, values[h], [s])[0])
            sampled = systematic_error_sampled(p, values[h], s)
            worst = max(worst, abs(sampled - exact) / exact if exact > 0 else abs(sampled))
    return {"heads": heads, "count_rows_compared": compared, "count_rows_mismatched": mismatched,
            "grid2048_vs_exact_max_rel_diff": worst}


def write_curves(path: Path, record: dict) -> None:
    """The heads' curves beside the JSONL (gzip JSON, with this invocation's provenance): too large for a record."""
    from santa.provenance import run_record

    with gzip.open(path, "wt", encoding="utf-8") as out:
        json.dump({"run": run_record(), **record}, out)


def model_case(model: str, length: int, layers: int | None, curves_path: Path | None = None) -> dict:
    """One model's record; the heads' curves E_h(S) on :data:`GRID`, T_h and ‖o_h‖² go to ``curves_path``."""
    from santa.assets import load_model

    start = time.time()
    heads = load_model(model)[0].config.num_attention_heads
    probs, values = captured_heads(model, length)
    probs = probs.to(torch.float64)
    probs = probs / probs.sum(-1, keepdim=True)  # the weights o is defined with, and what the sampler reads
    captured = time.time() - start
    n_layers = probs.shape[0] // heads
    kept = list(range(n_layers)) if layers is None else sorted(
        {round(i * (n_layers - 1) / max(layers - 1, 1)) for i in range(min(layers, n_layers))})
    check = check_against_santa(probs, values, [kept[0] * heads, kept[len(kept) // 2] * heads + 1, kept[-1] * heads + 2])
    cases = []
    for layer in kept:
        rows = slice(layer * heads, (layer + 1) * heads)
        cases.append(layer_case(probs[rows], values[rows]))
        print(f"{model} layer {layer}: " + " ".join(f"{k}={v / cases[-1]['fixed']:.3f}"
                                                    for k, v in cases[-1]["errors"].items()), file=sys.stderr, flush=True)
    fixed = torch.tensor([c["fixed"] for c in cases])
    ratio = {}
    for name in RULES:
        err = torch.tensor([c["errors"][name] for c in cases])
        ratio[name] = {"layer_mean": float((err / fixed).mean()), "overall": float(err.sum() / fixed.sum()),
                       "layer_min": float((err / fixed).min()), "layer_max": float((err / fixed).max())}
    if curves_path is not None:
        write_curves(curves_path, {"model": model, "length": length, "grid": list(GRID),
                                   "heads": [f"{layer}.{h}" for layer in kept for h in range(heads)],
                                   "E": torch.cat([c["curves"] for c in cases]).tolist(),
                                   "T": torch.cat([c["trace"] for c in cases]).tolist(),
                                   "norm2": torch.cat([c["norm2"] for c in cases]).tolist()})
    reads = torch.tensor([c["reads_at_equal_error"] for c in cases])
    curves = torch.cat([c["curves"] for c in cases])  # [heads, G]
    trace = torch.cat([c["trace"] for c in cases])
    norm2 = torch.cat([c["norm2"] for c in cases])
    e128 = curves[:, GRID.index(PER_HEAD)]
    return {
        "model": model, "length": length, "per_head": PER_HEAD, "heads": heads, "layers_total": n_layers,
        "layers": kept, "grid": list(GRID), "keys": int(probs.shape[-1]),
        "ratio_over_fixed": ratio,
        "reads_at_equal_error": {"layer_mean": float(reads.mean()), "overall": float(
            sum(c["reads_at_equal_error"] * c["heads"] for c in cases) / sum(c["heads"] for c in cases)),
            "layer_min": float(reads.min()), "layer_max": float(reads.max())},
        "check_iid_neyman_on_iid": float(torch.tensor([c["iid_neyman_on_iid"] for c in cases]).mean()),
        "iid_over_systematic_at_128": quantiles(trace / (PER_HEAD * e128)),
        "iid_over_systematic_at_128_error_weighted_mean": float(trace.sum() / (PER_HEAD * e128.sum())),
        "slope_64_256": quantiles(torch.cat([c["slope"] for c in cases])),
        "relative_error_at_128": quantiles(e128 / norm2),
        "per_layer": [{"layer": layer, "fixed": c["fixed"], "reads_at_equal_error": c["reads_at_equal_error"],
                       **{name: c["errors"][name] / c["fixed"] for name in RULES},
                       "oracle_budgets": c["oracle_budgets"], "rule_budgets": c["rule_budgets"]}
                      for layer, c in zip(kept, cases, strict=True)],
        "curves_file": None if curves_path is None else curves_path.name,
        "check_against_santa": check,
        "seconds": {"capture": captured, "total": time.time() - start},
    }


# ---------------------------------------------------------------------------------------------- the last P positions

POSITIONS_CAPTURE = "santa_capture_positions"


@functools.cache
def register_positions_capture() -> str:
    """Register (once) an attention implementation that runs SDPA and keeps, for the first sequence, the weights of the
    last ``module.santa_positions`` query rows over the keys each may see (causal) and the values (KV heads repeated to
    the query heads): :func:`santa.eval.variance.capture_last_query`'s, for P rows instead of one."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from santa.attention import attention_probs

    def forward(module, query, key, value, attention_mask, **kwargs):
        store = getattr(module, "santa_positions_store", None)
        if store is not None:
            scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
            rows = query[:1, :, -module.santa_positions:]  # the causal mask aligns the last row with the last key
            probs = attention_probs(rows, key[:1], scale=scale, is_causal=True)[0]  # [Hq, P, n]
            values = value[0].float().repeat_interleave(query.shape[1] // key.shape[1], dim=0)  # [Hq, n, D]
            store[module.layer_idx] = (probs, values)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(POSITIONS_CAPTURE, forward)
    AttentionMaskInterface.register(POSITIONS_CAPTURE, sdpa_mask)
    return POSITIONS_CAPTURE


@torch.inference_mode()
def captured_positions(model_name: str, length: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`captured_heads` at the last ``positions`` query positions of the same prompt, in one dense prefill:
    ``(probs [L·H, P, n]`` (row t: position n − P + t, zero on the keys after it), ``values [L·H, n, d])``."""
    from santa.assets import load_model
    from santa.eval.tasks import build_prompt

    model, tokenizer = load_model(model_name, dtype=torch.float32)
    prompt = build_prompt("niah_single", tokenizer, length, 0)
    store: dict = {}
    layers = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")]
    for m in layers:
        m.santa_positions_store, m.santa_positions = store, positions
    previous = model.config._attn_implementation
    model.set_attn_implementation(register_positions_capture())
    try:
        ids = tokenizer(prompt.text, return_tensors="pt", add_special_tokens=False).input_ids.to(model.device)
        model(input_ids=ids, use_cache=False)
    finally:
        for m in layers:
            m.santa_positions_store = None
        model.set_attn_implementation(previous)
    return (torch.cat([store[i][0].cpu() for i in sorted(store)]), torch.cat([store[i][1].cpu() for i in sorted(store)]))


def memo_exact(head_of, curves: torch.Tensor):
    """``exact(rows, wanted [len(rows), K]) → [K]``: the summed exact error of integer budgets over ``rows`` (row r's
    head is ``head_of(r) = (probs, values)``), each (row, S) computed once (the grid's from ``curves [N, G]``)."""
    memo = {(r, s): float(curves[r, g]) for r in range(curves.shape[0]) for g, s in enumerate(GRID)}

    def exact(rows, wanted: torch.Tensor) -> torch.Tensor:
        summed = torch.zeros(wanted.shape[1], dtype=torch.float64)
        for r, budgets in zip(rows, wanted.tolist(), strict=True):
            missing = sorted({b for b in budgets if (r, b) not in memo})
            if missing:
                memo.update({(r, b): float(e) for b, e in zip(missing, systematic_error(*head_of(r), missing), strict=True)})
            summed += torch.tensor([memo[(r, b)] for b in budgets], dtype=torch.float64)
        return summed

    return exact


def positions_layer(probs: torch.Tensor, values: torch.Tensor) -> dict:
    """One layer at P positions, ``probs [H, P, n]`` (row t sees the first n − P + 1 + t keys), ``values [H, n, d]``:
    the curves of its H·P (head, position) pairs (row ``t·H + h``), then :func:`allocate` over the pool of all of them
    (R = 128·H·P), over each position's H heads alone (the one-position oracle at each), and each head over its own P
    positions (R = 128·P a head: adapting over steps only)."""
    heads, positions, n = probs.shape

    def head_of(r: int) -> tuple[torch.Tensor, torch.Tensor]:
        t, h = divmod(r, heads)
        return probs[h, t, : n - positions + 1 + t], values[h, : n - positions + 1 + t]

    rows = range(heads * positions)
    curves = torch.stack([systematic_error(*head_of(r), GRID) for r in rows])  # [H·P, G]
    moments = torch.tensor([head_moments(*head_of(r)) for r in rows], dtype=torch.float64)
    trace, norm2 = moments[:, 0], moments[:, 1]
    exact = memo_exact(head_of, curves)
    per_position = [allocate(curves[t * heads: (t + 1) * heads], trace[t * heads: (t + 1) * heads],
                             norm2[t * heads: (t + 1) * heads]) for t in range(positions)]
    pooled = allocate(curves, trace, norm2, functools.partial(exact, rows))
    steps_only = sum(float(oracle_table(curves[h::heads], GRID, PER_HEAD * positions)[0][-1]) for h in range(heads))
    return {"heads": heads, "positions": positions, "fixed": pooled["fixed"], "pooled": pooled,
            "per_position": per_position, "steps_only_oracle": steps_only,
            "pooled_oracle_reads_by_position": (torch.tensor(pooled["oracle_budgets"], dtype=torch.float64)
                                                .reshape(positions, heads).sum(1) / (PER_HEAD * heads)).tolist(),
            "curves": curves, "trace": trace, "norm2": norm2}


def cross_layer(curves: torch.Tensor) -> dict:
    """Every row of ``curves [N, G]`` (all layers' heads, all positions) sharing R = 128·N reads, over the fixed
    S = 128's summed error: the oracle bracketed by its convex relaxation (:func:`hull_bound`, below) and the
    Lagrangian allocation (:func:`lagrange_budgets`, on the grid, above), and their reads at equal error."""
    total = PER_HEAD * curves.shape[0]
    fixed = float(curves[:, GRID.index(PER_HEAD)].sum())
    lagrange = lagrange_budgets(curves, GRID, total)
    low, high = curves.shape[0] * GRID[0], total  # reads of the Lagrangian allocation at equal error, by bisection
    while low < high:
        mid = (low + high) // 2
        if grid_error(curves, GRID, lagrange_budgets(curves, GRID, mid)) <= fixed * (1 + 1e-12):
            high = mid
        else:
            low = mid + 1
    return {"rows": curves.shape[0], "reads": total, "fixed": fixed,
            "oracle_hull": hull_bound(curves, GRID, total) / fixed,
            "oracle_lagrange": grid_error(curves, GRID, lagrange) / fixed,
            "oracle_lagrange_reads_spent": int(lagrange.sum()) / total,
            "reads_at_equal_error_hull": hull_reads(curves, GRID, fixed) / total,
            "reads_at_equal_error_lagrange": low / total}


def summary(errors: list[float], fixed: list[float]) -> dict:
    """Ratios over the fixed budget's error: the mean of the ratios, the ratio of the sums, the least and the most."""
    ratio = torch.tensor(errors, dtype=torch.float64) / torch.tensor(fixed, dtype=torch.float64)
    return {"layer_mean": float(ratio.mean()), "overall": float(sum(errors) / sum(fixed)),
            "layer_min": float(ratio.min()), "layer_max": float(ratio.max())}


def value_summary(values: list[float]) -> dict:
    v = torch.tensor(values, dtype=torch.float64)
    return {"layer_mean": float(v.mean()), "layer_min": float(v.min()), "layer_max": float(v.max())}


def positions_case(model: str, length: int, layers: int | None, positions: int,
                   curves_path: Path | None = None) -> dict:
    """One model's record at the last ``positions`` query positions: per layer, the pool of heads × positions
    (:func:`positions_layer`), then every layer's together (:func:`cross_layer`)."""
    from santa.assets import load_model

    start = time.time()
    heads = load_model(model)[0].config.num_attention_heads
    probs, values = captured_positions(model, length, positions)
    probs = probs.to(torch.float64)
    probs = probs / probs.sum(-1, keepdim=True)
    captured = time.time() - start
    n_layers, n = probs.shape[0] // heads, probs.shape[-1]
    kept = list(range(n_layers)) if layers is None else sorted(
        {round(i * (n_layers - 1) / max(layers - 1, 1)) for i in range(min(layers, n_layers))})
    first = n - positions + 1  # keys at the earliest position: the check runs there
    check = check_against_santa(probs[:, 0, :first], values[:, :first],
                                [kept[0] * heads, kept[len(kept) // 2] * heads + 1, kept[-1] * heads + 2])
    cases = []
    for layer in kept:
        rows = slice(layer * heads, (layer + 1) * heads)
        c = positions_layer(probs[rows], values[rows])
        cases.append(c)
        print(f"{model} layer {layer} ({time.time() - start:.0f} s): pooled " + " ".join(
            f"{k}={v / c['fixed']:.3f}" for k, v in c["pooled"]["errors"].items())
            + " per-position oracle={:.3f}".format(sum(p["errors"]["oracle"] for p in c["per_position"])
                                                   / sum(p["fixed"] for p in c["per_position"])),
            file=sys.stderr, flush=True)
    pooled = {name: summary([c["pooled"]["errors"][name] for c in cases], [c["fixed"] for c in cases])
              for name in RULES}
    flat = [p for c in cases for p in c["per_position"]]  # (layer, position) pairs
    per_position = {name: summary([p["errors"][name] for p in flat], [p["fixed"] for p in flat])
                    for name in ("oracle", "oracle_hull")}
    curves = torch.cat([c["curves"] for c in cases])  # [layers·P·H, G], layer-major, then position, then head
    last = torch.cat([c["curves"][(positions - 1) * heads:] for c in cases])
    scale = torch.tensor([c["fixed"] for c in cases], dtype=torch.float64).repeat_interleave(heads * positions)
    e128 = torch.stack([c["curves"][:, GRID.index(PER_HEAD)].reshape(positions, heads) for c in cases])  # [L, P, H]
    if curves_path is not None:
        write_curves(curves_path, {"model": model, "length": length, "grid": list(GRID),
                                   "heads": [f"{layer}.{h}@{n - positions + t}" for layer in kept
                                             for t in range(positions) for h in range(heads)],
                                   "E": curves.tolist(), "T": torch.cat([c["trace"] for c in cases]).tolist(),
                                   "norm2": torch.cat([c["norm2"] for c in cases]).tolist()})
    return {
        "model": model, "length": length, "positions": positions, "per_head": PER_HEAD, "heads": heads,
        "layers_total": n_layers, "layers": kept, "grid": list(GRID), "keys": n,
        "pooled": {"ratio_over_fixed": pooled,
                   "reads_at_equal_error": value_summary([c["pooled"]["reads_at_equal_error"] for c in cases])},
        "per_position": {"ratio_over_fixed": per_position,
                         "reads_at_equal_error": value_summary([p["reads_at_equal_error"] for p in flat]),
                         "oracle_by_position": [summary([c["per_position"][t]["errors"]["oracle"] for c in cases],
                                                        [c["per_position"][t]["fixed"] for c in cases])["overall"]
                                                for t in range(positions)]},
        "steps_only_oracle": summary([c["steps_only_oracle"] for c in cases], [c["fixed"] for c in cases]),
        "cross_layer": cross_layer(curves),
        "cross_layer_per_layer_scale": cross_layer(curves / scale[:, None]),
        "cross_layer_last_position": cross_layer(last),
        "e128_max_over_min_over_positions": quantiles((e128.amax(1) / e128.amin(1).clamp_min(1e-300)).flatten()),
        "fixed_layer_max_over_min_over_positions": quantiles((e128.sum(2).amax(1) / e128.sum(2).amin(1)).flatten()),
        "per_layer": [{"layer": layer, "fixed": c["fixed"],
                       "pooled": {name: c["pooled"]["errors"][name] / c["fixed"] for name in RULES},
                       "pooled_reads_at_equal_error": c["pooled"]["reads_at_equal_error"],
                       "per_position_oracle": [p["errors"]["oracle"] / p["fixed"] for p in c["per_position"]],
                       "per_position_reads_at_equal_error": [p["reads_at_equal_error"] for p in c["per_position"]],
                       "steps_only_oracle": c["steps_only_oracle"] / c["fixed"],
                       "pooled_oracle_reads_by_position": c["pooled_oracle_reads_by_position"]}
                      for layer, c in zip(kept, cases, strict=True)],
        "curves_file": None if curves_path is None else curves_path.name,
        "check_against_santa": check,
        "seconds": {"capture": captured, "total": time.time() - start},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="JSONL file (resumed when it exists)")
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--layers", default="all", help="'all', or N layers evenly spaced through each model")
    parser.add_argument("--positions", type=int, default=1,
                        help="the last P query positions, pooled over heads × positions (1: the last one alone)")
    args = parser.parse_args(argv)
    if args.layers != "all" and not (args.layers.isdigit() and int(args.layers) >= 1):
        parser.error(f"--layers must be 'all' or an integer ≥ 1, got {args.layers!r}")
    if not 1 <= args.positions < args.length:
        parser.error(f"--positions must be at least 1 and below --length, got {args.positions}")
    layers = None if args.layers == "all" else int(args.layers)
    suffix = ("" if args.positions == 1 else f"/P{args.positions}") + ("" if layers is None else f"/layers{layers}")
    measure = model_case if args.positions == 1 else functools.partial(positions_case, positions=args.positions)
    cases = {f"{model}/{args.length}{suffix}": functools.partial(
        measure, model, args.length, layers,
        curves_path=args.out.with_name(f"{args.out.stem}.{model}.{args.length}{suffix.replace('/', '.')}.curves.json.gz"))
        for model in args.models.split(",") if model}
    return append_cases(args.out, cases, holder="error_target_systematic_oracle.py")


if __name__ == "__main__":
    sys.exit(main())
