"""The one-launch prop's work schedule (santa.kernels.one_launch_schedule): every key of every group is
streamed exactly once, a group's slices share one round (the kernel's barrier cannot wait on a later round), no CTA
takes two items in a round, and the staggered halves run half a round apart."""

import pytest

from santa.kernels.one_launch_schedule import build_schedule, schedule_table


def covered_keys(rounds, n):
    """group → (round, sorted key list) from the schedule; fails if a group spans two rounds."""
    seen = {}
    for r, row in enumerate(rounds):
        for work in row:
            if work is None:
                continue
            keys = list(range(work.c * work.slice_len, min(n, (work.c + 1) * work.slice_len)))
            at, have = seen.setdefault(work.group, (r, []))
            assert at == r, f"group {work.group} in rounds {at} and {r}"
            have += keys
    return seen


@pytest.mark.parametrize("kind", ["rounds", "staggered"])
@pytest.mark.parametrize(("groups", "n", "slices", "grid"), [(256, 32768, 8, 264), (64, 32768, 8, 264), (32, 8192, 4, 264),
                                                              (16, 1000, 16, 256), (3, 100, 4, 40), (192, 8192, 4, 264),
                                                              (192, 8192, 16, 264)])
def test_every_key_once_and_a_group_in_one_round(kind, groups, n, slices, grid):
    rounds = build_schedule(groups=groups, n=n, slices=slices, grid=grid, kind=kind)
    seen = covered_keys(rounds, n)
    assert sorted(seen) == list(range(groups))
    for _, keys in seen.values():
        assert sorted(keys) == list(range(n))
    for row in rounds:
        assert len(row) == grid
        for work in row:  # a group's slices all agree on its slice count and length
            if work is not None:
                assert work.slice_len == -(-n // work.slices) and 0 <= work.c < work.slices


def test_rounds_fill_the_grid_in_order_and_spread_the_last_round():
    rounds = build_schedule(groups=256, n=32768, slices=8, grid=264, kind="rounds")
    assert len(rounds) == 8
    assert [w.group for w in rounds[0][:16:8]] == [0, 1] and rounds[0][263].group == 32
    last = {w.group: w.slices for w in rounds[-1] if w is not None}
    assert sorted(last) == list(range(231, 256)) and set(last.values()) == {10}  # 25 groups × 10 slices of 264 CTAs


def test_staggered_half_b_opens_with_half_length_slices():
    rounds = build_schedule(groups=256, n=32768, slices=8, grid=264, kind="staggered")
    first_a, first_b = rounds[0][0], rounds[0][132]
    assert (first_a.slices, first_a.slice_len) == (8, 4096)
    assert (first_b.slices, first_b.slice_len) == (16, 2048)
    assert all(w is None or w.slices >= 8 for row in rounds for w in row)
    # groups are taken in the order the rounds start: A0 (t=0), B0 (t=0, half), B1 (t=0.5), A1 (t=1), …
    assert rounds[0][0].group == 0 and rounds[0][132].group == 16 and rounds[1][132].group == 24 and rounds[1][0].group == 40
    assert len(rounds) == 9  # the last B round starts at 7.5 and is spread (8 groups × 16 half-length slices)
    assert {w.slices for w in rounds[8][132:] if w is not None} == {16}


def test_the_table_is_flat_int4_with_idle_slots():
    rounds = build_schedule(groups=1, n=10, slices=2, grid=3, kind="rounds")
    assert schedule_table(rounds) == [0, 0, 3, 4, 0, 1, 3, 4, 0, 2, 3, 4]
    rounds = build_schedule(groups=2, n=10, slices=4, grid=9, kind="rounds")
    assert schedule_table(rounds)[-4:] == [-1, 0, 1, 1]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="kind"):
        build_schedule(groups=1, n=10, slices=2, grid=4, kind="zigzag")
    with pytest.raises(ValueError, match="grid"):
        build_schedule(groups=1, n=10, slices=8, grid=4, kind="rounds")
    with pytest.raises(ValueError, match="staggered"):
        build_schedule(groups=4, n=10, slices=8, grid=20, kind="staggered")
    with pytest.raises(ValueError, match="slices"):
        build_schedule(groups=1, n=10, slices=0, grid=4, kind="rounds")
