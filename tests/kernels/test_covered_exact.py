"""One rule on every decode path (issue 44): a sequence whose own live keys the budget covers (S ≥ n_live) is
computed exactly, every live V row read once; the others are sampled. Decided per sequence on the device."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import DEVICE, kernel_reference, make_inputs, to_paged
from santa.kernels import decode, plan_decode

triton = pytest.importorskip("triton")  # the interpreter's setup: tests/kernels/conftest.py


def exact_attention(q, k, v, first, end):
    """float64 softmax(q·kᵀ/√d)·v over keys [first, end) of one sequence: q [H, d], k/v [L, H_kv, d] → [H, d]."""
    group = q.shape[0] // k.shape[1]
    kk = k[first:end].double().repeat_interleave(group, dim=1)
    vv = v[first:end].double().repeat_interleave(group, dim=1)
    p = torch.softmax(torch.einsum("hd,lhd->hl", q.double(), kk) / math.sqrt(q.shape[-1]), dim=-1)
    return torch.einsum("hl,lhd->hd", p, vv)


@pytest.mark.parametrize("kernel,paged", [("prop", False), ("prop", True), ("flash", False), ("flash", True)])
def test_covered_sequences_are_exact_and_the_others_sampled(kernel, paged):
    budget = 24
    q, k, v = make_inputs(4, 6, 2, 32, 70, seed=4)
    seq_lens = torch.tensor([70, 24, 9, 25], dtype=torch.int32, device=DEVICE)  # sampled, covered (S = n), covered, sampled
    kw = dict(seq_lens=seq_lens, seed=3, offset=0, return_counts=True, kernel=kernel)
    if paged:
        k_pages, table = to_paged(k, 16, seed=1)
        v_pages, _ = to_paged(v, 16, seed=1)
        out, counts = decode(q, k_pages, v_pages, budget, block_table=table, **kw)
    else:
        out, counts = decode(q, k, v, budget, **kw)
    for b in (1, 2):  # covered: exact, one read per live key
        n = int(seq_lens[b])
        torch.testing.assert_close(out[b].double().cpu(), exact_attention(q[b], k[b], v[b], 0, n).cpu(), rtol=1e-4, atol=1e-4)
        assert torch.equal(counts[b, :, :n].cpu(), torch.ones(6, n, dtype=counts.dtype))
        assert counts[b, :, n:].eq(0).all()
    for b in (0, 3):  # sampled: S draws per head
        assert counts[b].sum(-1).eq(budget).all()
    ref_out, ref_counts = kernel_reference(kernel, q, k, v, budget, seq_lens=seq_lens, seed=3, offset=0)
    assert torch.equal(counts[1:3, :, :70].cpu().long(), ref_counts[1:3].cpu())  # a paged call addresses 80 keys
    torch.testing.assert_close(out.double().cpu(), ref_out.double().cpu(), rtol=1e-4, atol=1e-4)


def test_a_left_padded_run_is_covered_on_its_own_live_keys():
    """starts: sequence 0 sees keys [30, 40) (10 live keys ≤ S = 12: exact) although its cache holds 40."""
    q, k, v = make_inputs(2, 4, 2, 16, 40, seed=6)
    seq_lens = torch.tensor([40, 40], dtype=torch.int32, device=DEVICE)
    starts = torch.tensor([30, 0], dtype=torch.int32, device=DEVICE)
    out, counts = decode(q, k, v, 12, kernel="prop", seq_lens=seq_lens, starts=starts, return_counts=True)
    torch.testing.assert_close(out[0].double().cpu(), exact_attention(q[0], k[0], v[0], 30, 40).cpu(), rtol=1e-4, atol=1e-4)
    assert counts[0, :, 30:].eq(1).all() and counts[0, :, :30].eq(0).all()
    assert counts[1].sum(-1).eq(12).all()


def test_a_plan_whose_capacity_the_budget_covers_runs_only_the_exact_launch():
    q, k, v = make_inputs(2, 4, 2, 16, 20, seed=8)
    plan = plan_decode(batch=2, heads=4, kv_heads=2, head_dim=16, n_keys=20, budget=32, dtype=q.dtype, device=DEVICE)
    assert [name for name, _ in plan.stages(q, k, v)] == ["exact"]
    out = plan.run(q, k, v)
    for b in range(2):
        torch.testing.assert_close(out[b].double().cpu(), exact_attention(q[b], k[b], v[b], 0, 20).cpu(), rtol=1e-4, atol=1e-4)
    long_plan = plan_decode(batch=2, heads=4, kv_heads=2, head_dim=16, n_keys=20, budget=8, dtype=q.dtype, device=DEVICE)
    assert "exact" not in [name for name, _ in long_plan.stages(q, k, v)]  # every sequence has its 20 keys > S
    seq_lens = torch.tensor([20, 5], dtype=torch.int32, device=DEVICE)
    assert [name for name, _ in long_plan.stages(q, k, v, seq_lens=seq_lens)] == ["pass1", "pass2", "exact"]
    flash = plan_decode(batch=2, heads=4, kv_heads=2, head_dim=16, n_keys=20, budget=8, dtype=q.dtype, device=DEVICE,
                        kernel="flash")
    assert [name for name, _ in flash.stages(q, k, v, seq_lens=seq_lens)] == ["partial", "merge", "exact"]


def test_a_covered_sequence_with_a_nan_key_is_nan_and_reads_nothing():
    q, k, v = make_inputs(2, 4, 2, 16, 30, seed=9)
    k[1, 3, 0] = float("nan")  # a visible key of sequence 1, KV head 0 (heads 0, 1)
    seq_lens = torch.tensor([30, 10], dtype=torch.int32, device=DEVICE)
    for kernel in ("prop", "flash"):
        out, counts = decode(q, k, v, 16, kernel=kernel, seq_lens=seq_lens, return_counts=True)
        assert torch.isnan(out[1, :2]).all() and torch.isfinite(out[1, 2:]).all() and torch.isfinite(out[0]).all()
        assert counts[1, :2].eq(0).all() and counts[1, 2:, :10].eq(1).all()
        ref_out, _ = kernel_reference(kernel, q, k, v, 16, seq_lens=seq_lens)
        assert torch.isnan(ref_out[1, :2]).all()


def test_the_torch_fallback_follows_the_same_rule(monkeypatch):
    """Without the interpreter a CPU call runs the torch reference: the same exact rows and counts."""
    q, k, v = make_inputs(2, 4, 2, 16, 30, seed=10, device="cpu")
    seq_lens = torch.tensor([30, 7], dtype=torch.int32)
    interpreted = decode(q, k, v, 8, seq_lens=seq_lens, return_counts=True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fallback = decode(q, k, v, 8, seq_lens=seq_lens, return_counts=True)
    assert torch.equal(interpreted[1][1], fallback[1][1].to(interpreted[1].dtype))
    torch.testing.assert_close(interpreted[0][1], fallback[0][1], rtol=1e-4, atol=1e-4)
