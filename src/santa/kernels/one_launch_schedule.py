"""The work schedule of the one-launch prop (``prop1_*`` in ``one_launch.cu``): which (group, slice) each CTA of the
persistent grid takes in each round. A group is one (sequence, KV head); its n keys are cut into C_g slices of
⌈n / C_g⌉ keys, and all of a group's slices sit in the same round (the kernel's group barrier then waits only on
CTAs that reach that round: no cycle, since every CTA is resident).

Two schedules, both with the same slice count C for full rounds:

- ``"rounds"``: groups in order, ⌊grid / C⌋ per round, every CTA in step. Each round streams K, then samples
  (stats exchange, placement, V gather) while its SM streams nothing: at Llama B = 32 × 32k the sampling phases
  cost ~13 µs per round, 8 rounds (KERNEL_NOTES run 15).
- ``"staggered"``: the grid in two halves of P = ⌊grid / 2⌋ CTAs (CTAs [0, P) and [P, 2P), which the block
  scheduler puts on different SMs first, so an SM holds one CTA of each). Half B opens with a round of
  half-length slices (2C per group, ⌊P / 2C⌋ groups), so from then on its rounds run half a round behind half A's:
  while one half samples, the other streams. Groups go to the rounds in the order the rounds start.

In both, a round that gets fewer groups than it holds (the last ones) spreads them over the half's or the grid's
CTAs with more, shorter slices (C_g = ⌊CTAs / groups⌋, at least C): it ends sooner instead of leaving CTAs idle.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from santa.kernels.layout import cdiv

SCHEDULES = ("rounds", "staggered")


@dataclass(frozen=True)
class Work:
    """One CTA's work in one round: slice ``c`` of ``slices`` of group ``group``, keys [c·slice_len, (c+1)·slice_len) ∩ [0, n)."""

    group: int
    c: int
    slices: int
    slice_len: int


def _place(groups: list[int], *, first_cta: int, ctas: int, slices: int, n: int) -> dict[int, Work]:
    """CTA → work for ``groups`` over CTAs [first_cta, first_cta + ctas), ``slices`` each (more where fewer groups
    than the CTAs hold: ⌊ctas / len(groups)⌋)."""
    per_group = max(slices, ctas // len(groups))
    slice_len = -(-n // per_group)
    return {first_cta + i * per_group + c: Work(group, c, per_group, slice_len)
            for i, group in enumerate(groups) for c in range(per_group)}


def build_schedule(*, groups: int, n: int, slices: int, grid: int, kind: str) -> list[list[Work | None]]:
    """Rounds × grid: ``rounds[r][cta]`` is that CTA's work in round r, or None (idle that round)."""
    if kind not in SCHEDULES:
        raise ValueError(f"kind must be one of {SCHEDULES}, got {kind!r}")
    for name, value in (("groups", groups), ("n", n), ("slices", slices), ("grid", grid)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if grid < slices:
        raise ValueError(f"grid ({grid}) must hold one group's {slices} slices")
    todo = list(range(groups))
    halves: list[tuple[int, int, list[dict[int, Work]]]] = []  # (first CTA, CTAs, the half's rounds)
    if kind == "rounds":
        halves.append((0, grid, []))
        starts = [(float(r), 0, slices) for r in range(groups)]  # (start time, half, slices): round r at time r
    else:
        half = grid // 2
        if half < 2 * slices:
            raise ValueError(f"a staggered schedule needs 2 × {2 * slices} CTAs for its half-length round, got grid {grid}")
        halves += [(0, half, []), (half, half, [])]
        starts = sorted([(float(r), 0, slices) for r in range(groups)] + [(0.0, 1, 2 * slices)]
                        + [(r + 0.5, 1, slices) for r in range(groups)])
    for _, which, per_group in starts:
        if not todo:
            break
        first_cta, ctas, rounds = halves[which]
        take, todo = todo[: ctas // per_group], todo[ctas // per_group :]
        rounds.append(_place(take, first_cta=first_cta, ctas=ctas, slices=per_group, n=n))
    depth = max(len(rounds) for _, _, rounds in halves)
    return [[next((rounds[r][cta] for _, _, rounds in halves if r < len(rounds) and cta in rounds[r]), None)
             for cta in range(grid)] for r in range(depth)]


def schedule_table(rounds: list[list[Work | None]]) -> list[int]:
    """The kernel's int4 table, flat: (group, c, C_g, slice_len) per (round, CTA), group −1 where idle."""
    flat = []
    for row in rounds:
        for work in row:
            flat += [-1, 0, 1, 1] if work is None else [work.group, work.c, work.slices, work.slice_len]
    return flat


# The live-key schedule (issue 39; benchmarks/KERNEL_NOTES.md, "a live-key schedule derived in the one launch"): the
# CPU reference of a schedule that every CTA of the one launch would derive from the step's seq_lens, so that its cost
# follows the live keys instead of the plan's capacity. Not yet in one_launch.cu: this is the spec the CUDA code is to
# match, integer for integer (its property tests: tests/kernels/test_one_launch_schedule.py).

GRANULE = 256  # keys: every slice of the live schedule is a run of whole granules (a fixed CDF order, issue 39)


@dataclass(frozen=True)
class LiveWork:
    """One item of the live schedule: slice ``c`` of ``slices`` of sequence ``seq``'s KV head ``head``, keys
    [start, stop) (empty where the sequence is shorter: start = stop)."""

    seq: int
    head: int
    c: int
    slices: int
    start: int
    stop: int


@dataclass(frozen=True)
class LiveSchedule:
    """The live schedule of one step. Sequences are laid out in ``order`` (slice counts descending, stable in the
    sequence index), sequence b taking ``kv_heads · slices[b]`` consecutive items from ``first[b]`` (head, then slice);
    CTA x < ``lanes`` takes items x, x + lanes, x + 2·lanes, … in that order, item i in round ⌊i / lanes⌋. ``keys[b]``
    is b's length clamped to [0, n], ``run_starts[b]`` its first visible key clamped to [0, keys[b]] (``starts``: the
    slices cut the run ``[run_starts[b], keys[b])``; their count still follows ``keys[b]``, as the kernel's)."""

    kv_heads: int
    lanes: int
    order: tuple[int, ...]
    slices: tuple[int, ...]
    first: tuple[int, ...]
    keys: tuple[int, ...]
    items: int
    run_starts: tuple[int, ...] = ()

    @property
    def rounds(self) -> int:
        return cdiv(self.items, self.lanes)

    def item(self, i: int) -> LiveWork:
        """Item i's work: its sequence (the last in ``order`` whose first item is ≤ i), head and slice."""
        if not 0 <= i < self.items:
            raise ValueError(f"item must be in [0, {self.items}), got {i}")
        b = self.order[bisect.bisect_right(self.order, i, key=self.first.__getitem__) - 1]
        head, c = divmod(i - self.first[b], self.slices[b])
        # whole granules of the run a slice: ⌈granules / C⌉ of them from its first key, the last cut at the sequence's end
        first_key = self.run_starts[b] if self.run_starts else 0
        granules = cdiv(self.keys[b] - first_key, GRANULE)
        step = cdiv(granules, self.slices[b]) * GRANULE
        start = first_key + min(c * step, self.keys[b] - first_key)
        return LiveWork(seq=b, head=head, c=c, slices=self.slices[b], start=start, stop=min(start + step, self.keys[b]))

    def work(self, cta: int, round_: int) -> LiveWork | None:
        """CTA ``cta``'s item in round ``round_``, or None (a CTA past ``lanes``, or past the last item)."""
        i = round_ * self.lanes + cta
        return self.item(i) if cta < self.lanes and i < self.items else None


def _power_of_two(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two ≥ 1, got {value!r}")
    return value


def live_schedule(seq_lens, *, n: int, kv_heads: int, slice_cap: int, min_slices: int, max_slices: int,
                  ctas: int, starts=None) -> LiveSchedule:
    """The live schedule of a step whose sequences hold ``seq_lens`` keys (ints, B of them; clamped to [0, n] as the
    kernel clamps them), for a plan of capacity ``n`` keys, ``kv_heads`` KV heads, slices of at most ``slice_cap`` keys
    (a multiple of :data:`GRANULE`: what the kernel's shared memory keeps), between ``min_slices`` (the fewest whose
    gather fits shared memory) and ``max_slices`` (the exchange's slots) slices a group, both powers of two, on a
    persistent grid of ``ctas`` resident CTAs. ``starts`` (ints, B of them, or None for 0): each sequence's first
    visible key, clamped to [0, its length] as the kernel clamps it; its slices cut ``[start, length)``.

    1. C_b = the least power of two ≥ max(min_slices, ⌈n_b / slice_cap⌉) (per sequence; an empty one keeps min_slices,
       so every group's epoch advances each launch).
    2. One wave where it fits: every C_b times k, the largest power of two with k · items ≤ ctas and
       k · max C_b ≤ max_slices (items = kv_heads · Σ C_b), so a short step spreads over the whole grid.
    3. Sequences in descending C_b (stable), lanes = ctas rounded down to a multiple of max C_b. Every group then
       starts at a multiple of its C_b, which divides lanes: a group's slices all fall in one round (the kernel's
       group barrier waits only on its own round; a group straddling two rounds can deadlock)."""
    for name, value in (("n", n), ("kv_heads", kv_heads), ("ctas", ctas), ("slice_cap", slice_cap)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if slice_cap % GRANULE:
        raise ValueError(f"slice_cap must be a multiple of {GRANULE} keys, got {slice_cap}")
    min_slices, max_slices = _power_of_two("min_slices", min_slices), _power_of_two("max_slices", max_slices)
    if min_slices > max_slices:
        raise ValueError(f"min_slices ({min_slices}) must be ≤ max_slices ({max_slices})")
    if n > max_slices * slice_cap:
        raise ValueError(f"n ({n}) must be ≤ max_slices · slice_cap = {max_slices * slice_cap} (longer plans run the Triton prop)")
    if ctas < max_slices:
        raise ValueError(f"ctas ({ctas}) must hold one group's max_slices ({max_slices}) slices")
    if isinstance(seq_lens, (str, bytes)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in seq_lens):
        raise TypeError(f"seq_lens must be a sequence of ints, got {seq_lens!r}")
    if len(seq_lens) == 0:
        raise ValueError("seq_lens must hold at least one sequence")
    keys = tuple(min(max(x, 0), n) for x in seq_lens)
    if starts is not None:
        if isinstance(starts, (str, bytes)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in starts):
            raise TypeError(f"starts must be a sequence of ints, got {starts!r}")
        if len(starts) != len(keys):
            raise ValueError(f"starts must hold one first key per sequence ({len(keys)}), got {len(starts)}")
    run_starts = tuple(min(max(x, 0), k) for x, k in zip(starts, keys, strict=True)) if starts is not None else ()
    slices = [max(min_slices, 1 << max(0, cdiv(k, slice_cap) - 1).bit_length()) for k in keys]
    items = kv_heads * sum(slices)
    k = 1
    while 2 * k * items <= ctas and 2 * k * max(slices) <= max_slices:
        k *= 2
    slices = [k * s for s in slices]
    order = tuple(sorted(range(len(keys)), key=lambda b: -slices[b]))  # stable: ties keep the sequence order
    first, at = [0] * len(keys), 0
    for b in order:
        first[b], at = at, at + kv_heads * slices[b]
    return LiveSchedule(kv_heads=kv_heads, lanes=ctas - ctas % max(slices), order=order, slices=tuple(slices),
                        first=tuple(first), keys=keys, items=at, run_starts=run_starts)
