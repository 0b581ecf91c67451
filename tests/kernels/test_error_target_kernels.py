"""Error-target budgets in the Triton prop (issue 42): every (sequence, head) draws the budget its pilot asks
for, ``S_r = clamp(⌈T̂/(ε²N̂)⌉, 1, cap)``, and the kernel's counts and outputs are those of
:func:`santa.kernels.prop_reference` (the spec) — contiguous and paged caches, fp8 with per-KV-head scales,
per-sequence lengths, request-keyed draws, the tile search by bisection, several sample chunks per head, a
covered sequence computed exactly — in Triton's interpreter (or on a GPU) and in the torch fallback."""

import pytest
import torch

from helpers import CUDA, DEVICE
from santa.kernels import Tuning, decode, plan_decode, prop_reference

FP8 = torch.float8_e4m3fn
B, H, H_KV, D, L = 2, 4, 2, 16, 300


def inputs(seed: int = 0, fp8: bool = False) -> dict:
    """q ``[B, H, D]`` bf16, K/V ``[B, L, H_kv, D]``: values around a shared mean (finite ‖o‖), one KV head
    whose every value is the same row (its heads need one draw)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, D, generator=g)
    k = 0.7 * torch.randn(B, L, H_KV, D, generator=g)
    v = torch.randn(B, L, H_KV, D, generator=g) + 0.5
    v[1, :, 1] = v[1, 0, 1]  # sequence 1, KV head 1: identical values
    call = dict(q=q.bfloat16().to(DEVICE), seq_lens=torch.tensor([L, 211], dtype=torch.int32, device=DEVICE))
    if fp8:
        k_scale, v_scale = torch.tensor([0.5, 0.25]), torch.tensor([0.25, 0.5])
        call.update(k=(k / k_scale.view(1, 1, -1, 1)).to(FP8).to(DEVICE), v=(v / v_scale.view(1, 1, -1, 1)).to(FP8).to(DEVICE),
                    k_scale=k_scale.to(DEVICE), v_scale=v_scale.to(DEVICE))
    else:
        call.update(k=k.bfloat16().to(DEVICE), v=v.bfloat16().to(DEVICE))
    return call


def paged(call: dict, page: int = 16) -> dict:
    """The same keys in a shuffled pool of ``page``-key pages, with a block table."""
    pages_per = L // page + 1
    order = torch.randperm(B * pages_per, generator=torch.Generator().manual_seed(9))
    table = order.reshape(B, pages_per).to(torch.int32)
    out = dict(call)
    for name in ("k", "v"):
        x = torch.nn.functional.pad(call[name].cpu().float(), (0, 0, 0, 0, 0, pages_per * page - L)).to(call[name].dtype)
        pool = torch.empty(B * pages_per, page, H_KV, D, dtype=x.dtype)
        pool[table.flatten().long()] = x.reshape(B * pages_per, page, H_KV, D)
        out[name] = pool.to(DEVICE)
    out["block_table"] = table.to(DEVICE)
    return out


def spec(call: dict, cap: int, **extra) -> tuple[torch.Tensor, torch.Tensor]:
    """prop_reference on the dequantised caches (what the kernels read), as the torch fallback calls it."""
    from santa.kernels.plan import dequantised

    k = dequantised(call["k"], call.get("k_scale", 1.0), "NHD").cpu()
    v = dequantised(call["v"], call.get("v_scale", 1.0), "NHD").cpu()
    table = call.get("block_table")
    return prop_reference(call["q"].cpu(), k, v, cap, seq_lens=call["seq_lens"].cpu(),
                          block_table=None if table is None else table.cpu(), **{k: (x.cpu() if isinstance(x, torch.Tensor) else x)
                                                                                    for k, x in extra.items()})


def run(call: dict, cap: int, **extra) -> tuple[torch.Tensor, torch.Tensor]:
    call = dict(call)
    return decode(call.pop("q"), call.pop("k"), call.pop("v"), cap, return_counts=True, **call, **extra)


def assert_matches_spec(got, want) -> None:
    out, counts = got
    ref_out, ref_counts = want
    assert torch.equal(counts.cpu().long(), ref_counts)
    torch.testing.assert_close(out.cpu().float(), ref_out.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_the_kernel_draws_the_specs_budgets_and_counts(layout, fp8):
    call = inputs(fp8=fp8)
    if layout == "paged":
        call = paged(call)
    draws = dict(seed=3, error_target=0.3)
    got = run(call, 96, **draws)
    want = spec(call, 96, **draws)
    assert_matches_spec(got, want)
    budgets = got[1].sum(-1).cpu()
    assert budgets[1, 2:].tolist() == [16, 16]  # identical values: the floor, the pilot's 16 draws
    assert ((budgets > 1) & (budgets < 96)).any()  # and the rule decides elsewhere


@pytest.mark.parametrize("tuning", [Tuning(), Tuning(tile_search="bisect"), Tuning(samples_per_program=8)],
                         ids=["scan", "bisect", "many-chunks"])
def test_every_tile_search_and_chunking_draws_the_same(tuning):
    call = inputs(seed=1)
    plan = plan_decode(batch=B, heads=H, kv_heads=H_KV, head_dim=D, n_keys=L, budget=64, dtype=torch.bfloat16,
                       device=DEVICE, tuning=tuning, error_target=0.25)
    counts = torch.zeros(B, H, L, dtype=torch.int32, device=DEVICE)
    out = plan.run(call["q"], call["k"], call["v"], seq_lens=call["seq_lens"], seed=7, counts=counts)
    assert_matches_spec((out, counts), spec(call, 64, seed=7, error_target=0.25))


def test_request_keyed_draws_and_a_covered_sequence():
    call = inputs(seed=2)
    call["seq_lens"] = torch.tensor([L, 40], dtype=torch.int32, device=DEVICE)  # sequence 1: 40 ≤ cap, exact
    draws = dict(seed=torch.tensor([5, 11], device=DEVICE), positions=torch.tensor([L - 1, 39], device=DEVICE), error_target=0.2)
    got = run(call, 64, **draws)
    assert_matches_spec(got, spec(call, 64, **draws))
    assert (got[1][1, :, :40] == 1).all() and (got[1][1, :, 40:] == 0).all()  # every live row read once


def test_a_target_no_pilot_can_meet_draws_the_fixed_budget():
    """ε → 0 sends every row with any variance to the cap: its counts are those of the fixed-budget call (stream 0,
    the same uniform); the heads on identical values (T̂ = 0) draw the floor, the pilot's 16."""
    call = inputs(seed=3)
    fixed = run(call, 48, seed=4)
    capped = run(call, 48, seed=4, error_target=1e-6)
    varied = torch.ones(B, H, dtype=torch.bool)
    varied[1, 2:] = False
    assert torch.equal(fixed[1][varied], capped[1][varied])
    assert torch.equal(fixed[0][varied], capped[0][varied])
    assert capped[1][~varied].sum(-1).tolist() == [16, 16]


@pytest.mark.parametrize("target", [None, 0.3], ids=["fixed", "target"])
@pytest.mark.parametrize("fallback", [False, True], ids=["kernel", "fallback"])
def test_reads_count_each_rows_draws_and_accumulate(target, fallback, monkeypatch):
    """plan.run(reads=) adds each row's value rows drawn: S (or the pilot's 16 + S_r with a target) on a sampled
    sequence, its live keys on a covered one; a second call adds as much again (santa.model sums over steps)."""
    if fallback:
        if CUDA:
            pytest.skip("the torch fallback runs for CPU tensors without the interpreter")
        monkeypatch.delenv("TRITON_INTERPRET")
    call = inputs(seed=2)
    call["seq_lens"] = torch.tensor([L, 60], dtype=torch.int32, device=DEVICE)  # sequence 1: 60 ≤ S, exact
    plan = plan_decode(batch=B, heads=H, kv_heads=H_KV, head_dim=D, n_keys=L, budget=96, dtype=torch.bfloat16,
                       device=DEVICE, error_target=target)
    reads = torch.zeros(B, H, dtype=torch.int64, device=DEVICE)
    counts = torch.zeros(B, H, L, dtype=torch.int32, device=DEVICE)
    plan.run(call["q"], call["k"], call["v"], seq_lens=call["seq_lens"], seed=3, counts=counts, reads=reads)
    drawn = counts.sum(-1).long()  # the draw's own samples (the pilot's are not counted there)
    if target is None:
        assert drawn[0].tolist() == [96] * H
    assert reads[1].tolist() == [60] * H
    assert torch.equal(reads[0], drawn[0] + (0 if target is None else 16))
    plan.run(call["q"], call["k"], call["v"], seq_lens=call["seq_lens"], seed=3, reads=reads)
    assert torch.equal(reads[0], 2 * (drawn[0] + (0 if target is None else 16))) and reads[1].tolist() == [120] * H


def test_each_calls_budgets_live_in_its_own_workspace():
    """A plan keeps no call's S_r: pass 2 writes them into the call's workspace, which the call's reads count from. So
    two workspaces (two streams, or the custom op's scratch under CUDA-graph trees) never share them: a call on one
    workspace between another workspace's call and its reads leaves the first call's budgets as they were."""
    from santa.kernels import Workspace

    plan = plan_decode(batch=B, heads=H, kv_heads=H_KV, head_dim=D, n_keys=L, budget=96, dtype=torch.bfloat16,
                       device=DEVICE, error_target=0.3)
    assert not any(isinstance(x, torch.Tensor) for x in vars(plan).values())  # no device state of its own
    first, second = inputs(seed=2), inputs(seed=5)
    spaces = [Workspace.scratch(plan.workspace_key) for _ in range(2)]
    counts = [torch.zeros(B, H, L, dtype=torch.int32, device=DEVICE) for _ in range(2)]
    for call, space, count in zip((first, second), spaces, counts, strict=True):
        plan.run(call["q"], call["k"], call["v"], seq_lens=call["seq_lens"], seed=3, counts=count, workspace=space)
    drawn = [count.sum(-1).flatten().int() for count in counts]
    assert not torch.equal(drawn[0], drawn[1])  # the two calls asked for other budgets
    for space, sampled in zip(spaces, drawn, strict=True):
        assert torch.equal(space.views["budgets"], sampled)  # S_r per row b·H + h: each call's own draws


@pytest.mark.parametrize(("reads", "error", "match"), [
    (torch.zeros(B, H), TypeError, "reads must be int32 or int64"),
    (torch.zeros(B, H + 1, dtype=torch.int64), ValueError, "reads must be int32 or int64 \\[B=2, H=4\\]"),
])
def test_bad_reads_are_refused_by_name(reads, error, match):
    call = inputs(seed=2)
    plan = plan_decode(batch=B, heads=H, kv_heads=H_KV, head_dim=D, n_keys=L, budget=64, dtype=torch.bfloat16, device=DEVICE,
                       error_target=0.3)
    with pytest.raises(error, match=match):
        plan.run(call["q"], call["k"], call["v"], seq_lens=call["seq_lens"], reads=reads.to(DEVICE))


def test_the_torch_fallback_is_the_spec(monkeypatch):
    if CUDA:
        pytest.skip("the torch fallback runs for CPU tensors without the interpreter")
    monkeypatch.delenv("TRITON_INTERPRET")
    call = inputs(seed=4)
    draws = dict(seed=8, error_target=0.3)
    got = run(call, 64, **draws)
    want = spec(call, 64, **draws)
    assert torch.equal(got[1].long(), want[1]) and torch.equal(got[0], want[0])


def test_the_custom_op_takes_the_error_target():
    call = inputs(seed=5)
    want = run(call, 64, seed=2, error_target=0.3)
    got = torch.ops.santa.decode_counts(call["q"], call["k"], call["v"], call["seq_lens"], None, None, None, None, None, 64,
                                        "prop", "NHD", None, 2, 0, error_target=0.3, pilot=16)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(error_target=0.0), ValueError, "error_target"),
    (dict(error_target=float("nan")), ValueError, "error_target"),
    (dict(error_target="0.1"), TypeError, "error_target"),
    (dict(error_target=0.1, pilot=1), ValueError, "pilot"),
    (dict(error_target=0.1, pilot=4.0), TypeError, "pilot"),
    (dict(error_target=0.1, kernel="flash"), ValueError, "kernel='prop'"),
])
def test_bad_error_targets_are_refused_by_name(kwargs, error, match):
    call = inputs(seed=6)
    with pytest.raises(error, match=match):
        run(call, 64, **kwargs)
    with pytest.raises(error, match=match):
        plan_decode(batch=B, heads=H, kv_heads=H_KV, head_dim=D, n_keys=L, budget=64, dtype=torch.bfloat16, device=DEVICE,
                    **kwargs)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_a_captured_graph_follows_the_budgets_its_rows_ask_for():
    """The plan is sized by the cap: one captured graph replays steps whose rows ask for other budgets (new lengths,
    positions and values written in place) and gives the eager call's outputs and budgets."""
    call = inputs(seed=7)
    plan = plan_decode(batch=B, heads=H, kv_heads=H_KV, head_dim=D, n_keys=L, budget=128, dtype=torch.bfloat16,
                       device=DEVICE, error_target=0.2)
    positions = (call["seq_lens"] - 1).long()
    seeds = torch.tensor([3, 4], device=DEVICE)
    out = torch.empty_like(call["q"])
    counts = torch.zeros(B, H, L, dtype=torch.int32, device=DEVICE)

    def step():
        counts.zero_()
        plan.run(call["q"], call["k"], call["v"], seq_lens=call["seq_lens"], seed=seeds, positions=positions, out=out,
                 counts=counts)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    budgets = []
    for lengths, scale in (((L, 211), 1.0), ((250, 180), 3.0)):
        call["seq_lens"].copy_(torch.tensor(lengths, dtype=torch.int32))
        positions.copy_(call["seq_lens"].long() - 1)
        call["v"].mul_(scale)  # ‖o‖ and T scale alike: the same budgets; new lengths: new draws
        graph.replay()
        torch.cuda.synchronize()
        eager = plan.run(call["q"], call["k"], call["v"], seq_lens=call["seq_lens"], seed=seeds, positions=positions,
                         counts=(eager_counts := torch.zeros_like(counts)))
        assert torch.equal(counts, eager_counts) and torch.equal(out, eager)
        budgets.append(counts.sum(-1).cpu())
    assert not torch.equal(budgets[0], budgets[1])
