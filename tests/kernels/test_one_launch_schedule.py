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


# The live-key schedule (issue 39): the CPU reference of what each CTA of the one launch is to derive from seq_lens

from santa.kernels.one_launch_schedule import GRANULE, live_schedule  # noqa: E402

LLAMA = {"kv_heads": 8, "slice_cap": 4096, "min_slices": 4, "max_slices": 64, "ctas": 264}  # d = 128, S = 128, 2 CTAs/SM
L = LLAMA["slice_cap"]
EDGES = [0, 1, 128, 129, 255, 256, 257, L - 1, L, L + 1, 8 * L, 32768, 40000, -5]


def drains(per_cta: list[list[tuple]], group_size: dict) -> bool:
    """Whether persistent CTAs working ``per_cta`` (each CTA's items in order, an item a tuple whose [0] is its group)
    all finish, where an item publishes once its CTA reaches it and completes only once every item of its group has
    published (the kernel's group barrier): False where the CTAs wait on each other in a cycle."""
    at = [0] * len(per_cta)
    published: dict = {}
    while True:
        for cta, todo in enumerate(per_cta):
            if at[cta] < len(todo) and todo[at[cta]] not in published:
                published[todo[at[cta]]] = True
        moved = False
        for cta, todo in enumerate(per_cta):
            if at[cta] < len(todo):
                group = todo[at[cta]][0]
                if sum(1 for item in published if item[0] == group) == group_size[group]:
                    at[cta], moved = at[cta] + 1, True
        if all(at[cta] == len(todo) for cta, todo in enumerate(per_cta)):
            return True
        if not moved:
            return False


def items_per_cta(schedule) -> tuple[list[list[tuple]], dict]:
    per_cta = [[] for _ in range(schedule.lanes)]
    sizes: dict = {}
    for i in range(schedule.items):
        work = schedule.item(i)
        per_cta[i % schedule.lanes].append(((work.seq, work.head), work.c))
        sizes[(work.seq, work.head)] = work.slices
    return per_cta, sizes


def test_the_simulator_finds_the_crossed_deadlock_and_drains_a_plain_fill():
    # round r: CTA 0 runs h.0 and CTA 1 g.0; round r+1: CTA 0 g.1 and CTA 1 h.1 — each waits on the other's next item
    assert not drains([[("h", 0), ("g", 1)], [("g", 0), ("h", 1)]], {"h": 2, "g": 2})
    assert drains([[("h", 0), ("g", 0)], [("h", 1), ("g", 1)]], {"h": 2, "g": 2})


@pytest.mark.parametrize("seq_lens", [[2048] * 64, [2048] * 16, [32768], [131072] * 2, EDGES, [0] * 7, [1] * 300,
                                      [300, 40000, 5000, 0, 9000, 256, 257, 70000, 4096, 4097] * 3])
def test_live_schedule_covers_every_live_key_once_in_whole_granules_and_never_straddles_a_round(seq_lens):
    n = 131072
    schedule = live_schedule(seq_lens, n=n, **LLAMA)
    keys = [min(max(x, 0), n) for x in seq_lens]
    assert schedule.keys == tuple(keys)
    covered: dict = {}
    for i in range(schedule.items):
        work = schedule.item(i)
        assert work.slices == schedule.slices[work.seq] and 0 <= work.c < work.slices and 0 <= work.head < LLAMA["kv_heads"]
        assert LLAMA["min_slices"] <= work.slices <= LLAMA["max_slices"] and work.slices & (work.slices - 1) == 0
        # whole granules within shared memory (an empty slice, past a short sequence's end, starts at that end)
        assert 0 <= work.stop - work.start <= L and (work.start % GRANULE == 0 or work.start == keys[work.seq])
        assert work.stop == keys[work.seq] or work.stop % GRANULE == 0
        covered.setdefault((work.seq, work.head), []).append((i, work.start, work.stop))
    assert len(covered) == len(seq_lens) * LLAMA["kv_heads"]
    for (seq, _), parts in covered.items():
        rounds = {i // schedule.lanes for i, _, _ in parts}
        assert len(rounds) == 1, f"sequence {seq}'s group straddles rounds {rounds}"
        assert sorted(k for _, start, stop in parts for k in range(start, stop)) == list(range(keys[seq]))
    assert schedule.lanes <= LLAMA["ctas"] and schedule.lanes % max(schedule.slices) == 0
    assert drains(*items_per_cta(schedule))
    # every CTA takes at most one item a round, and the rounds hold every item
    assert {schedule.work(cta, r) for r in range(schedule.rounds) for cta in range(LLAMA["ctas"])} - {None} == {
        schedule.item(i) for i in range(schedule.items)}


def test_with_starts_the_slices_cut_each_run_from_its_first_key_in_whole_granules():
    """``starts`` (left padding): sequence b's slices cover ``[starts[b], length)`` once, whole granules from the first
    key (as the kernel's prop_slice cuts them); a first key outside [0, length] is clamped; no starts: as before."""
    n = 131072
    seq_lens = [300, 40000, 5000, 0, 9000, 256, 2049, 70000]
    starts = [0, 333, 4990, 0, 9000, 300, -5, 1]  # 300 > 256 and -5 are clamped (the kernel's NaN cases)
    schedule = live_schedule(seq_lens, n=n, starts=starts, **LLAMA)
    plain = live_schedule(seq_lens, n=n, **LLAMA)
    assert schedule.slices == plain.slices and schedule.order == plain.order  # slice counts follow the lengths
    assert schedule.run_starts == (0, 333, 4990, 0, 9000, 256, 0, 1)
    covered: dict = {}
    for i in range(schedule.items):
        work = schedule.item(i)
        first = schedule.run_starts[work.seq]
        assert 0 <= work.stop - work.start <= L
        assert (work.start - first) % GRANULE == 0 or work.start == seq_lens[work.seq]
        covered.setdefault((work.seq, work.head), []).extend(range(work.start, work.stop))
    for (seq, _), keys in covered.items():
        assert sorted(keys) == list(range(schedule.run_starts[seq], seq_lens[seq])), seq
    assert [plain.item(i) for i in range(plain.items)] == [
        live_schedule(seq_lens, n=n, starts=[0] * len(seq_lens), **LLAMA).item(i) for i in range(plain.items)]
    with pytest.raises(ValueError, match="starts must hold one first key per sequence"):
        live_schedule(seq_lens, n=n, starts=[0], **LLAMA)
    with pytest.raises(TypeError, match="starts must be a sequence of ints"):
        live_schedule(seq_lens, n=n, starts=[0.5] * len(seq_lens), **LLAMA)


def test_the_live_schedule_follows_the_live_keys_not_the_plans_capacity():
    """The same step on a 2k, a 32k and a 128k plan: the same schedule (what makes a 128k plan cost a tight one's)."""
    step = [2048] * 64
    schedules = [live_schedule(step, n=n, **LLAMA) for n in (2048, 32768, 131072)]
    assert schedules[0] == schedules[1] == schedules[2]
    # the design note's arithmetic: Llama 64 × 2k takes 4 slices of 512 keys a group, 2,048 items, 8 rounds on 264 CTAs
    assert (set(schedules[0].slices), schedules[0].items, schedules[0].lanes, schedules[0].rounds) == ({4}, 2048, 264, 8)
    # one sequence of 32k keys spreads over the grid in one wave: 32 slices of 1,024 keys, 256 lanes
    one = live_schedule([32768], n=32768, **LLAMA)
    assert (one.slices, one.lanes, one.rounds, one.item(0).stop) == ((32,), 256, 1, 1024)


def test_longer_sequences_come_first_and_ties_keep_their_order():
    schedule = live_schedule([100, 20000, 100, 9000], n=32768, **LLAMA)
    assert schedule.slices == (4, 8, 4, 4) and schedule.order == (1, 0, 2, 3)
    assert [schedule.first[b] for b in schedule.order] == [0, 64, 96, 128]


@pytest.mark.parametrize(("change", "message"), [
    ({"n": 0}, "n must be a positive int"), ({"slice_cap": 1000}, "slice_cap must be a multiple of 256"),
    ({"min_slices": 3}, "min_slices must be a power of two"), ({"max_slices": 2}, "min_slices (4) must be ≤ max_slices (2)"),
    ({"n": 64 * 4096 + 1}, "n (262145) must be ≤ max_slices · slice_cap"), ({"ctas": 32}, "ctas (32) must hold"),
    ({"seq_lens": []}, "seq_lens must hold at least one sequence"), ({"kv_heads": True}, "kv_heads must be a positive int")])
def test_live_schedule_names_a_bad_argument(change, message):
    kwargs = {**LLAMA, "n": 32768, "seq_lens": [10]} | change
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("·", ".")):
        live_schedule(kwargs.pop("seq_lens"), **kwargs)
    with pytest.raises(TypeError, match="seq_lens must be a sequence of ints"):
        live_schedule([1.5], n=32768, **LLAMA)
