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


def test_bad_starts_are_refused_by_name():
    q, k, v = make_inputs(2, 4, 2, 16, 20, seed=1, device="cpu")
    lens = torch.tensor([20, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"starts\[1\] = 10 must lie in \[0, 9\]"):
        decode(q, k, v, 8, seq_lens=lens, starts=torch.tensor([0, 10], dtype=torch.int32))
    with pytest.raises(TypeError, match=r"starts must be an int32 tensor \[B=2\]"):
        decode(q, k, v, 8, starts=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="starts need kernel='prop'"):
        decode(q, k, v, 8, kernel="flash", starts=torch.tensor([0, 1], dtype=torch.int32))
