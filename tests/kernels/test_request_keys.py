"""Request-keyed draws (issue 26): with ``positions`` (each query's position in its own sequence) and
per-sequence keys, a sequence's samples depend on its key, position and heads only: not on the batch
row it sits in, the other sequences, the cache's allocated length or the steps taken before."""

from __future__ import annotations

import pytest
import torch

from helpers import DEVICE, make_inputs, to_paged
from santa.kernels import decode
from santa.kernels.reference import call_uniforms
from test_kernels import assert_counts_match_systematic, dense_probs

triton = pytest.importorskip("triton")  # the interpreter's setup: tests/kernels/conftest.py


def batch_inputs(n_keys=200):
    q, k, v = make_inputs(3, 8, 2, 32, n_keys, seed=31, q_scale=2.0)
    seq_lens = torch.tensor([n_keys, 77, 150], dtype=torch.int32, device=DEVICE)
    seeds = torch.tensor([11, 2**62 + 7, 11], dtype=torch.int64, device=DEVICE)  # the third shares the first's key
    return q, k, v, seq_lens, seeds, seq_lens.long() - 1


@pytest.mark.parametrize("kernel", ["prop", "flash"])
@pytest.mark.parametrize("paged", [False, True])
def test_each_sequence_draws_the_same_samples_alone_or_batched(kernel, paged):
    q, k, v, seq_lens, seeds, positions = batch_inputs()
    kwargs = dict(kernel=kernel, return_counts=True)
    if paged:
        k_pages, table = to_paged(k, 16, seed=4)
        v_pages, _ = to_paged(v, 16, seed=4)
        out, counts = decode(q, k_pages, v_pages, 48, seq_lens=seq_lens, block_table=table, seed=seeds,
                             positions=positions, **kwargs)
    else:
        out, counts = decode(q, k, v, 48, seq_lens=seq_lens, seed=seeds, positions=positions, **kwargs)
    for b in (2, 0, 1):  # alone, in a cache of its own length, with its own key and position
        n = int(seq_lens[b])
        alone, alone_counts = decode(q[b : b + 1], k[b : b + 1, :n].contiguous(), v[b : b + 1, :n].contiguous(), 48,
                                     seed=seeds[b : b + 1], positions=positions[b : b + 1], **kwargs)
        assert torch.equal(alone_counts[0], counts[b, :, :n]), b
        torch.testing.assert_close(alone[0], out[b], rtol=1e-5, atol=1e-6)


def test_prop_draws_the_systematic_reference_with_the_request_uniforms():
    q, k, v, seq_lens, seeds, positions = batch_inputs()
    _, counts = decode(q, k, v, 64, seq_lens=seq_lens, seed=seeds, positions=positions, return_counts=True)
    uniforms = call_uniforms(seeds, 0, positions, 3, 8)
    assert_counts_match_systematic(counts, dense_probs(q, k, seq_lens), 64, uniforms)
    # one int key for the whole batch: the same as that key per sequence
    same_key = decode(q, k, v, 64, seq_lens=seq_lens, seed=11, positions=positions, return_counts=True)[1]
    per_seq = decode(q, k, v, 64, seq_lens=seq_lens, seed=torch.full((3,), 11, device=DEVICE), positions=positions,
                     return_counts=True)[1]
    assert torch.equal(same_key, per_seq)


def test_the_request_uniforms_depend_on_position_and_head_not_on_the_row():
    keys = torch.tensor([3, 3])
    u = call_uniforms(keys, 0, torch.tensor([10, 10]), 2, 4)
    assert torch.equal(u[0], u[1])  # two rows, one request: the same draws
    assert not torch.equal(call_uniforms(keys, 0, torch.tensor([10, 11]), 2, 4)[1], u[1])  # the next position: fresh
    assert len(set(u[0].tolist())) == 4  # heads draw apart
    # without positions, the row enters the counter (the low-level offset API)
    rows = call_uniforms(3, 10, None, 2, 4)
    assert not torch.equal(rows[0], rows[1])


@pytest.mark.parametrize("change,error,match", [
    (dict(offset=1), ValueError, "offset must be 0 when positions are given"),
    (dict(positions=torch.zeros(3)), TypeError, r"positions as a tensor must be int32 or int64 \[B=3\]"),
    (dict(positions=torch.zeros(2, dtype=torch.int64)), TypeError, r"positions as a tensor must be"),
    (dict(seed=torch.zeros(3, dtype=torch.int32)), TypeError, r"seed as a tensor must be int64 \[B=3\]"),
    (dict(positions=torch.tensor([0, -1, 2])), ValueError, r"positions\[1\] = -1 must be ≥ 0"),
    (dict(seed=torch.tensor([0, 1, -5])), ValueError, r"seed\[2\] = -5 must be ≥ 0"),
])
def test_bad_request_keys_raise_naming_the_argument(change, error, match):
    q, k, v = make_inputs(3, 4, 2, 16, 20, seed=1, device="cpu")
    kwargs = dict(positions=torch.tensor([5, 6, 7]))
    kwargs.update(change)
    with pytest.raises(error, match=match):
        decode(q, k, v, 8, **kwargs)


# --------------------------------------------------------------------------- starts: a run of keys [start, seq_len)


@pytest.mark.parametrize("paged", [False, True])
def test_a_left_padded_sequence_samples_its_run_as_the_unpadded_one(paged):
    """starts[b] pads sequence b on the left: its keys are [start, seq_len). With positions counted in
    the run, it draws what the same keys at offset 0 draw alone."""
    q, k, v = make_inputs(2, 8, 2, 32, 300, seed=41, q_scale=2.0)
    pad = 133
    noise = make_inputs(2, 8, 2, 32, pad, seed=42)[1:]  # what the pad slots hold: never read
    k_padded, v_padded = torch.cat([noise[0], k], dim=1), torch.cat([noise[1], v], dim=1)  # keys at [pad, pad + 300)
    lens = torch.tensor([300, 170], dtype=torch.int32, device=DEVICE)
    starts = torch.tensor([pad, pad], dtype=torch.int32, device=DEVICE)
    positions = lens.long() - 1
    kwargs = dict(seed=torch.tensor([5, 6], device=DEVICE), positions=positions, return_counts=True)
    want_out, want_counts = decode(q, k, v, 40, seq_lens=lens, **kwargs)
    if paged:
        k_pages, table = to_paged(k_padded, 16, seed=2)
        v_pages, _ = to_paged(v_padded, 16, seed=2)
        out, counts = decode(q, k_pages, v_pages, 40, seq_lens=lens + pad, block_table=table, starts=starts, **kwargs)
    else:
        out, counts = decode(q, k_padded, v_padded, 40, seq_lens=lens + pad, starts=starts, **kwargs)
    assert not counts[..., :pad].any()  # the pad is never sampled
    assert torch.equal(counts[..., pad : pad + 300], want_counts)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)


def test_a_left_pad_of_any_length_keeps_the_runs_samples_bit_for_bit():
    """The Triton prop cuts its tiles from each run's first key, so a run's tile masses, float32 CDF and counts are
    those of the same keys unpadded, whatever the pad. S = 1024 over 2,000 keys puts many comb points near CDF steps:
    with tiles cut from key 0, a pad of 37 moved two of them (the CPU interpreter, before this rule)."""
    q, k, v = make_inputs(1, 4, 1, 16, 2000, seed=7, q_scale=3.0)
    request = dict(seed=torch.tensor([3], device=DEVICE), positions=torch.tensor([1999], device=DEVICE), return_counts=True)
    want_out, want_counts = decode(q, k, v, 1024, **request)
    for pad in (5, 37, 69, 100, 200):
        noise = make_inputs(1, 4, 1, 16, pad, seed=8)[1:]  # what the pad slots hold: never read
        out, counts = decode(q, torch.cat([noise[0], k], dim=1), torch.cat([noise[1], v], dim=1), 1024,
                             seq_lens=torch.tensor([2000 + pad], dtype=torch.int32, device=DEVICE),
                             starts=torch.tensor([pad], dtype=torch.int32, device=DEVICE), **request)
        assert not counts[..., :pad].any(), pad
        assert torch.equal(counts[..., pad:], want_counts), pad
        torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)


def test_bad_starts_are_refused_by_name():
    q, k, v = make_inputs(2, 4, 2, 16, 20, seed=1, device="cpu")
    lens = torch.tensor([20, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"starts\[1\] = 10 must lie in \[0, 9\]"):
        decode(q, k, v, 8, seq_lens=lens, starts=torch.tensor([0, 10], dtype=torch.int32))
    with pytest.raises(TypeError, match=r"starts must be an int32 tensor \[B=2\]"):
        decode(q, k, v, 8, starts=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="starts need kernel='prop'"):
        decode(q, k, v, 8, kernel="flash", starts=torch.tensor([0, 1], dtype=torch.int32))


# --------------------------------------------------------------------------- batch_invariant: the Triton prop always


def test_batch_invariant_plans_the_triton_prop_apart_from_the_default_plan(monkeypatch):
    """decode(batch_invariant=True) plans with santa.kernels.BATCH_INVARIANT (no one launch), a plan of its own, not the
    default call's of the same shape. Where there is no one launch (the CPU; this head dim on any GPU) both draw the same
    samples, bit for bit; the torch fallback has no plan, and the switch changes nothing there either."""
    import importlib

    from santa.kernels import BATCH_INVARIANT

    eager = importlib.import_module("santa.kernels.eager")
    q, k, v, seq_lens, seeds, positions = batch_inputs()
    kwargs = dict(seq_lens=seq_lens, seed=seeds, positions=positions, return_counts=True)
    eager._CALLS.clear()
    default_out, default_counts = decode(q, k, v, 48, **kwargs)
    out, counts = decode(q, k, v, 48, batch_invariant=True, **kwargs)
    default_call, call = eager._CALLS.values()
    assert call.plan is not default_call.plan and call.plan_key != default_call.plan_key
    assert call.plan.tuning == BATCH_INVARIANT and call.plan.tuning.one_launch is False and call.plan.one_launch is None
    assert default_call.plan.tuning.one_launch is None
    assert torch.equal(counts, default_counts) and torch.equal(out, default_out)
    assert torch.equal(decode(q, k, v, 48, batch_invariant=True, **kwargs)[1], counts)  # the cached signature: the same
    assert len(eager._CALLS) == 2
    if DEVICE.type == "cpu":  # the torch fallback: no plan
        monkeypatch.delenv("TRITON_INTERPRET")
        fallback_out, fallback_counts = decode(q, k, v, 48, batch_invariant=True, **kwargs)
        reference_out, reference_counts = decode(q, k, v, 48, **kwargs)
        assert torch.equal(fallback_counts, reference_counts) and torch.equal(fallback_out, reference_out)


HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("pad", [128, 37])
def test_batch_invariant_draws_a_sequences_samples_alike_alone_and_batched(pad):
    """batch_invariant=True: a sequence's counts are the same bit for bit alone (batch 1, a cache of its own length) and
    batched (batch 3, a longer HND cache, as santa.hf passes it), left-padded there by a whole prop tile (128 keys) or
    by part of one (37): the Triton prop's tiles are cut from each run's first key. On CUDA in bf16 at a shape whose
    default plan takes the one launch on Hopper (d = 128, G = 4), whose slices follow the batch; batch_invariant's plans
    have none."""
    import importlib

    eager = importlib.import_module("santa.kernels.eager")
    cuda = DEVICE.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    heads, kv_heads = (32, 8) if cuda else (8, 2)  # the interpreter: fewer heads of the same group
    dim, length, budget = 128, 420, 64
    q, k, v = make_inputs(3, heads, kv_heads, dim, pad + length + 152, dtype, seed=51, q_scale=2.0, layout="HND")
    q_alone = q[1:2].clone()
    k_alone, v_alone = (x[1:2, :, pad : pad + length].contiguous() for x in (k, v))
    seq_lens = torch.tensor([pad + length + 152, pad + length, 300], dtype=torch.int32, device=DEVICE)
    starts = torch.tensor([0, pad, 37], dtype=torch.int32, device=DEVICE)
    positions = (seq_lens - starts).long() - 1
    seeds = torch.tensor([3, 2**62 + 5, 8], dtype=torch.int64, device=DEVICE)
    common = dict(kv_layout="HND", return_counts=True, batch_invariant=True)
    eager._CALLS.clear()
    out, counts = decode(q, k, v, budget, seq_lens=seq_lens, starts=starts, seed=seeds, positions=positions, **common)
    alone, alone_counts = decode(q_alone, k_alone, v_alone, budget, seq_lens=seq_lens[1:2] - pad,
                                 starts=torch.zeros(1, dtype=torch.int32, device=DEVICE), seed=seeds[1:2],
                                 positions=positions[1:2], **common)
    assert torch.equal(alone_counts[0], counts[1, :, pad : pad + length])
    assert not counts[1, :, :pad].any() and int(counts[1].sum()) == heads * budget
    tolerance = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alone[0], out[1], **tolerance)  # the same samples; the sums' order follows the batch
    plans = [call.plan for call in eager._CALLS.values()]
    assert len(plans) == 2 and all(plan.tuning.one_launch is False and plan.one_launch is None for plan in plans)
    if HOPPER:  # the switch matters here: the default plans of both calls take the one launch
        decode(q, k, v, budget, seq_lens=seq_lens, starts=starts, seed=seeds, positions=positions, kv_layout="HND")
        decode(q_alone, k_alone, v_alone, budget, seq_lens=seq_lens[1:2] - pad, seed=seeds[1:2], positions=positions[1:2],
               kv_layout="HND", starts=torch.zeros(1, dtype=torch.int32, device=DEVICE))
        defaults = [call.plan for call in eager._CALLS.values() if call.plan.tuning.one_launch is None]
        assert len(defaults) == 2 and all(plan.one_launch is not None for plan in defaults)
