"""DecodePlan.run and .stages check every tensor against the plan (issue 44): a tensor of another shape, dtype or
device is refused by name before any launch, instead of reading and writing past it."""

from __future__ import annotations

import pytest
import torch

from helpers import DEVICE, make_inputs, to_paged
from santa.kernels import plan_decode

triton = pytest.importorskip("triton")  # the interpreter's setup: tests/kernels/conftest.py


def plan_for(batch=4, paged=False, n_keys=40):
    return plan_decode(batch=batch, heads=8, kv_heads=2, head_dim=16, n_keys=n_keys, budget=8, dtype=torch.float32,
                       device=DEVICE, page_size=8 if paged else None)


@pytest.fixture(scope="module")
def inputs():
    return make_inputs(4, 8, 2, 16, 40, seed=1)


def test_a_run_with_tensors_of_another_batch_is_refused_before_it_launches(inputs):
    q, k, v = inputs
    plan = plan_for()
    with pytest.raises(ValueError, match=r"q must have the plan's shape \[B=4, H=8, d=16\].*\(2, 8, 16\)"):
        plan.run(q[:2], k, v)
    with pytest.raises(ValueError, match="k_cache must have shape"):
        plan.run(q, k[:2], v)
    with pytest.raises(ValueError, match="out must have the plan's shape"):
        plan.run(q, k, v, out=torch.empty(2, 8, 16, device=DEVICE))
    with pytest.raises(ValueError, match="seq_lens must be a contiguous tensor of B ≥ 4"):
        plan.run(q, k, v, seq_lens=torch.full((2,), 40, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"counts must be int32 \[B=4, H=8, n_keys=40\]"):
        plan.run(q, k, v, counts=torch.zeros(4, 8, 39, dtype=torch.int32, device=DEVICE))
    assert torch.isfinite(plan.run(q, k, v)).all()  # the plan's own shape runs


@pytest.mark.parametrize("change,error,match", [
    (dict(q=lambda q: q.double()), TypeError, "q must be float32"),
    (dict(k=lambda k: k.half()), TypeError, "k_cache must be float32"),
    (dict(k=lambda k: k.transpose(1, 2).contiguous()), ValueError, "k_cache must have shape"),
    (dict(seq_lens=torch.full((4,), 40, dtype=torch.int64)), TypeError, "seq_lens must be int32"),
    (dict(starts=[0, 0, 0, 0]), TypeError, "starts must be a torch.Tensor"),
    (dict(block_table=torch.zeros(4, 5, dtype=torch.int32)), ValueError, "block_table was given but the plan is for a contiguous"),
    (dict(positions=torch.zeros(4, dtype=torch.float32)), TypeError, "positions must be int32 or int64"),
    pytest.param(dict(offset=torch.tensor([-3])), ValueError, r"offset must lie in \[0, 2\*\*63\), got -3",
                 marks=pytest.mark.skipif(DEVICE != "cpu", reason="a device tensor's value is read in the kernel, not on the host")),
    (dict(offset=torch.tensor([1, 2])), ValueError, "offset as a tensor must hold one int64 element"),
])
def test_every_argument_is_checked_by_name(inputs, change, error, match):
    q, k, v = inputs
    kwargs = {name: (value.to(DEVICE) if isinstance(value, torch.Tensor) else value)
              for name, value in change.items() if name not in ("q", "k")}
    q = change["q"](q) if "q" in change else q
    k = change["k"](k) if "k" in change else k
    with pytest.raises(error, match=match):
        plan_for().run(q, k, v, **kwargs)


def test_a_paged_plan_checks_its_pages_and_block_table(inputs):
    q, k, v = inputs
    k_pages, table = to_paged(k, 8)
    v_pages, _ = to_paged(v, 8)
    seq_lens = torch.full((4,), 40, dtype=torch.int32, device=DEVICE)
    plan = plan_for(paged=True)
    with pytest.raises(ValueError, match="block_table is required"):
        plan.run(q, k_pages, v_pages, seq_lens=seq_lens)
    with pytest.raises(ValueError, match=r"block_table must be int32 \[B ≥ 4, max_pages ≥ 5\]"):
        plan.run(q, k_pages, v_pages, seq_lens=seq_lens, block_table=table[:, :4].contiguous())
    with pytest.raises(ValueError, match="k_cache must have shape .pages, page_size=8"):
        plan.run(q, k_pages[:, :4], v_pages, seq_lens=seq_lens, block_table=table)
    out = plan.run(q, k_pages, v_pages, seq_lens=seq_lens, block_table=table)
    assert torch.isfinite(out).all()


def test_stages_without_out_allocate_it_and_check_the_call(inputs):
    """stages() took ``out`` as given and failed on ``None.data_ptr()``; now it allocates one, as run does."""
    q, k, v = inputs
    plan = plan_for()
    for _, launch in plan.stages(q, k, v):
        launch()
    with pytest.raises(ValueError, match="q must have the plan's shape"):
        plan.stages(q[:1], k, v)


@pytest.mark.parametrize("name,value,feature", [
    ("logits_soft_cap", 30.0, "soft-capping"), ("return_lse", True, "log-sum-exp"),
    ("pos_encoding_mode", "ROPE_LLAMA", "positional encoding"), ("window_left", 128, "sliding window"),
])
def test_flashinfer_features_santa_lacks_are_refused_by_name(inputs, name, value, feature):
    from santa.kernels import decode

    q, k, v = inputs
    with pytest.raises(ValueError, match=f"does not implement .*{feature}.*{name}="):
        decode(q, k, v, 8, **{name: value})
    with pytest.raises(ValueError, match=f"does not implement .*{feature}"):
        plan_decode(batch=4, heads=8, kv_heads=2, head_dim=16, n_keys=40, budget=8, dtype=torch.float32, device=DEVICE,
                    **{name: value})
    off = {"logits_soft_cap": 0.0, "return_lse": False, "pos_encoding_mode": "NONE", "window_left": -1}[name]
    assert decode(q, k, v, 8, **{name: off}).shape == q.shape  # the feature's off value asks for nothing missing
    with pytest.raises(TypeError, match="unexpected keyword argument 'budgett'"):
        decode(q, k, v, 8, budgett=3)


def test_one_cache_holds_each_call_and_calls_of_one_shape_share_their_plan():
    """santa.decode's one cache (issue 41): a call signature's validation and plan; another signature of the same
    shape (an ``out`` given, an offset tensor) reuses that plan instead of making a second one."""
    import importlib

    import santa

    eager = importlib.import_module("santa.kernels.eager")
    q = torch.randn(2, 4, 16, device=DEVICE)
    k, v = torch.randn(2, 2, 40, 2, 16, device=DEVICE).unbind(0)
    eager._CALLS.clear()
    santa.decode(q, k, v, 8, seed=1)
    santa.decode(q, k, v, 8, seed=1, out=torch.empty_like(q))
    santa.decode(q, k, v, 8, seed=1, offset=torch.zeros(1, dtype=torch.int64, device=DEVICE))
    calls = list(eager._CALLS.values())
    assert len(calls) == 3 and calls[0].plan is not None
    assert all(call.plan is calls[0].plan for call in calls)
    santa.decode(q, k, v, 16, seed=1)  # another budget: another plan
    assert len({id(call.plan) for call in eager._CALLS.values()}) == 2


def test_a_cache_growing_by_a_key_per_step_holds_a_bounded_number_of_plans():
    """transformers' default DynamicCache grows by one key per step, so santa.decode makes a plan per step under
    santa.hf; each plan owns a workspace sized by its keys, so the cache keeps at most _PLANS_HELD of them (the oldest
    dropped first), and a dropped shape seen again is planned anew with the same output."""
    import importlib

    import santa

    eager = importlib.import_module("santa.kernels.eager")
    eager._CALLS.clear()
    q = torch.randn(2, 4, 16, device=DEVICE)
    k, v = torch.randn(2, 2, 2, 40, 16, device=DEVICE).unbind(0)  # HND, as santa.hf passes it
    first = santa.decode(q, k[:, :, :20].contiguous(), v[:, :, :20].contiguous(), 8, kv_layout="HND", seed=3)
    for n in range(21, 21 + eager._PLANS_HELD + 4):
        santa.decode(q, k[:, :, :n].contiguous(), v[:, :, :n].contiguous(), 8, kv_layout="HND", seed=3)
        plans = {id(call.plan) for call in eager._CALLS.values()}
        assert len(plans) <= eager._PLANS_HELD
    held = {call.plan.shape.n_keys for call in eager._CALLS.values()}
    assert held == set(range(21 + 4, 21 + eager._PLANS_HELD + 4))  # the newest, in full
    again = santa.decode(q, k[:, :, :20].contiguous(), v[:, :, :20].contiguous(), 8, kv_layout="HND", seed=3)
    assert torch.equal(again, first)


def test_a_plan_says_which_kernels_serve_it():
    """Chosen when the plan is made: the interpreter's Triton kernels on the CPU (a float32 plan has no one launch)."""
    assert plan_for().implementation == plan_for(paged=True).implementation == "triton"
