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

from dataclasses import dataclass

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
