"""A gated call (``DecodePlan.run(enabled=...)``): an int32 on the device that the kernels read. 1: the call is the
ungated call, bit for bit (outputs, counts, reads); 0: it does nothing — out, counts, reads and the workspace are left
as they were — so an engine can hold santa beside a dense kernel in one CUDA graph and pick one per replay
(santa.vllm's short steps). Triton's interpreter here; the one-launch CUDA prop's gate is checked on the GPU."""

from __future__ import annotations

import pytest
import torch

from helpers import CUDA, DEVICE, make_inputs, to_paged
from santa.kernels import Tuning, plan_decode
from santa.kernels.layout import prop_pass1_tiles, prop_sample_chunks
from santa.kernels.plan import Workspace

pytest.importorskip("triton")  # the interpreter's setup: tests/kernels/conftest.py

BUDGET = 12
SEQ_LENS = (40, 9, 27)  # sampled, covered (exact), sampled


def gate(value: int) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int32, device=DEVICE)


def call_inputs(paged: bool):
    q, k, v = make_inputs(3, 4, 2, 16, 40, seed=7)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device=DEVICE)
    if not paged:
        return q, k, v, dict(seq_lens=seq_lens)
    k_pages, table = to_paged(k, 8, seed=2)
    v_pages, _ = to_paged(v, 8, seed=2)
    return q, k_pages, v_pages, dict(seq_lens=seq_lens, block_table=table)


def make_plan(paged: bool, **kw):
    return plan_decode(batch=3, heads=4, kv_heads=2, head_dim=16, n_keys=40, budget=BUDGET, dtype=torch.float32,
                       device=DEVICE, page_size=8 if paged else None, **kw)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("error_target", [None, 0.3])
def test_an_open_gate_is_the_ungated_call_and_a_closed_one_writes_nothing(paged, error_target):
    q, k, v, tables = call_inputs(paged)
    plan = make_plan(paged, error_target=error_target)
    positions = torch.tensor([39, 8, 26], dtype=torch.int32, device=DEVICE)
    common = dict(**tables, seed=5, positions=positions)

    def call(enabled=None):
        out = torch.full_like(q, 7.0)
        counts = torch.full((3, 4, 40), 5, dtype=torch.int32, device=DEVICE)  # the kernels add their counts to it
        reads = torch.full((3, 4), 100, dtype=torch.int64, device=DEVICE)
        plan.run(q, k, v, out=out, counts=counts, reads=reads, enabled=enabled, **common)
        return out, counts, reads

    want_out, want_counts, want_reads = call()
    assert not want_out.eq(7.0).any() and want_counts.gt(5).any()  # the ungated call wrote every row, and counted
    for got, want in zip(call(gate(1)), (want_out, want_counts, want_reads), strict=True):
        assert torch.equal(got, want)
    out, counts, reads = call(gate(0))
    assert out.eq(7.0).all() and counts.eq(5).all() and reads.eq(100).all()
    # the closed call left the workspace as a call leaves it: the next open call draws the same again
    for got, want in zip(call(gate(1)), (want_out, want_counts, want_reads), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("tuning", [Tuning(samples_per_program=8),
                                    Tuning(samples_per_program=8, block_n=16, pass1_programs=8)],
                         ids=["chunks", "chunks, looped pass 1"])
def test_a_closed_gate_leaves_every_workspace_region_as_it_was(tuning):
    """Several pass-2 chunks per head (so the semaphores are used) and, second, a pass-1 grid that loops over its
    tiles: a closed call leaves every region of the workspace byte for byte (the scratch filled with a pattern first,
    the semaphores zero, as a call needs them); the open call after it is the ungated call."""
    q, k, v, tables = call_inputs(False)
    plan = plan_decode(batch=3, heads=4, kv_heads=2, head_dim=16, n_keys=40, budget=24, dtype=torch.float32,
                       device=DEVICE, tuning=tuning)
    assert prop_sample_chunks(24, plan.tiles, 12, tuning)[1] == 3  # three chunks per head: the semaphores count them
    if tuning.pass1_programs:
        assert prop_pass1_tiles(plan.tiles, 6, tuning) < plan.tiles  # pass 1 loops
    workspace = Workspace.zeros(plan.workspace_key)
    for name, view in workspace.views.items():
        if name != "sem":
            view.view(torch.uint8).fill_(0xA5) if view.is_contiguous() else view.fill_(7)
    before = workspace.buffer.clone()
    out = torch.zeros_like(q)
    plan.run(q, k, v, out=out, workspace=workspace, enabled=gate(0), seed=3, **tables)
    assert out.eq(0).all() and torch.equal(workspace.buffer, before)
    want = plan.run(q, k, v, out=torch.zeros_like(q), seed=3, **tables).clone()
    plan.run(q, k, v, out=out, workspace=workspace, enabled=gate(1), seed=3, **tables)
    assert torch.equal(out, want) and workspace.views["sem"].eq(0).all()


def test_a_plan_whose_budget_covers_every_key_runs_only_the_exact_launch_and_gates_it():
    q, k, v, _ = call_inputs(False)
    plan = plan_decode(batch=3, heads=4, kv_heads=2, head_dim=16, n_keys=40, budget=64, dtype=torch.float32,
                       device=DEVICE)
    assert [name for name, _ in plan._launchers_for(None, 0, None, 1.0, 1.0, 0, None, None, gate(1))] == ["exact"]
    want = plan.run(q, k, v, out=torch.zeros_like(q)).clone()
    out = torch.full_like(q, 4.0)
    plan.run(q, k, v, out=out, enabled=gate(0))
    assert out.eq(4.0).all()
    plan.run(q, k, v, out=out, enabled=gate(1))
    assert torch.equal(out, want)


def test_the_gate_is_read_on_the_device_per_call():
    """One plan, one gate tensor, its value flipped between calls (as a CUDA graph's replays would see it)."""
    q, k, v, tables = call_inputs(False)
    plan = make_plan(False)
    enabled = gate(1)
    out = torch.zeros_like(q)
    plan.run(q, k, v, out=out, enabled=enabled, seed=1, **tables)
    first = out.clone()
    enabled.fill_(0)
    out.fill_(3.0)
    plan.run(q, k, v, out=out, enabled=enabled, seed=2, **tables)
    assert out.eq(3.0).all()
    enabled.fill_(-4)  # any non-zero int opens it
    plan.run(q, k, v, out=out, enabled=enabled, seed=1, **tables)
    assert torch.equal(out, first)


def test_bad_gates_are_refused_naming_enabled():
    q, k, v, tables = call_inputs(False)
    plan = make_plan(False)
    out = torch.empty_like(q)
    with pytest.raises(TypeError, match="enabled must be a torch.Tensor"):
        plan.run(q, k, v, out=out, enabled=1, **tables)
    with pytest.raises(TypeError, match="enabled must be int32"):
        plan.run(q, k, v, out=out, enabled=torch.ones(1, dtype=torch.bool, device=DEVICE), **tables)
    with pytest.raises(ValueError, match="enabled must hold one int32 element"):
        plan.run(q, k, v, out=out, enabled=torch.ones(2, dtype=torch.int32, device=DEVICE), **tables)
    with pytest.raises(ValueError, match="enabled needs out"):
        plan.run(q, k, v, enabled=gate(1), **tables)
    flash = plan_decode(batch=3, heads=4, kv_heads=2, head_dim=16, n_keys=40, budget=BUDGET, dtype=torch.float32,
                        device=DEVICE, kernel="flash")
    with pytest.raises(ValueError, match="enabled gates prop's launches"):
        flash.run(q, k, v, out=out, enabled=gate(1), **tables)


@pytest.mark.skipif(CUDA, reason="the CPU fallback: a CPU plan without the interpreter")
def test_the_cpu_fallback_honours_the_gate(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")  # kernels_on_cpu() is False: the torch reference runs
    q, k, v, tables = call_inputs(False)
    plan = make_plan(False)
    want = plan.run(q, k, v, out=torch.zeros_like(q), seed=4, **tables).clone()
    out = torch.full_like(q, 2.0)
    plan.run(q, k, v, out=out, enabled=gate(0), seed=4, **tables)
    assert out.eq(2.0).all()
    plan.run(q, k, v, out=out, enabled=gate(1), seed=4, **tables)
    assert torch.equal(out, want)
