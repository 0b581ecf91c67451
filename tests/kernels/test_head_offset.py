"""Tensor parallelism (issue 43): ``head_offset`` keys a call's draws on the model's global heads, so ranks that each
hold a slice of the heads (H/TP query heads over H_kv/TP KV heads) draw exactly what one call with every head draws:
the same counts and outputs, prop and flash, bf16 and fp8 caches, request-keyed (positional) draws, in Triton's
interpreter and the torch fallback. Without the offset, rank r draws rank 0's uniforms (the bug it fixes).
The one-launch CUDA prop has no offset: such calls take the Triton prop."""

import pytest
import torch

from helpers import CUDA, DEVICE, KERNELS
from santa.kernels import decode, plan_decode, prop_reference
from santa.kernels.plan import check_head_offset
from santa.kernels.reference import call_uniforms

FP8 = torch.float8_e4m3fn
B, H, H_KV, D, L, BUDGET = 2, 8, 4, 16, 40, 8  # L > S: every sequence is sampled


def inputs(cache: str, seed: int = 0) -> dict:
    """q ``[B, H, D]`` bf16, K/V ``[B, L, H_kv, D]`` (bf16, or fp8 with per-KV-head scales), request keys."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, D, generator=g).bfloat16()
    k, v = (torch.randn(B, L, H_KV, D, generator=g) for _ in range(2))
    call = dict(q=q.to(DEVICE), positions=torch.tensor([L - 1, 17], device=DEVICE),
                seed=torch.tensor([5, 2**40 + 3], device=DEVICE), seq_lens=torch.tensor([L, 30], dtype=torch.int32, device=DEVICE))
    if cache == "fp8":
        k_scale, v_scale = torch.tensor([0.5, 0.25, 1.0, 0.125]), torch.tensor([0.25, 0.5, 0.125, 1.0])
        call.update(k=(k / k_scale.view(1, 1, -1, 1)).to(FP8).to(DEVICE), v=(v / v_scale.view(1, 1, -1, 1)).to(FP8).to(DEVICE),
                    k_scale=k_scale.to(DEVICE), v_scale=v_scale.to(DEVICE))
    else:
        call.update(k=k.bfloat16().to(DEVICE), v=v.bfloat16().to(DEVICE))
    return call


def rank_slice(call: dict, tp: int, rank: int) -> dict:
    """What rank ``rank`` of ``tp`` holds: query heads ``[rank·H/tp, (rank+1)·H/tp)`` and their KV heads (its own
    contiguous cache and scales); the per-sequence tensors are every rank's."""
    heads, kv_heads = slice(rank * H // tp, (rank + 1) * H // tp), slice(rank * H_KV // tp, (rank + 1) * H_KV // tp)
    part = dict(call, q=call["q"][:, heads].contiguous(), k=call["k"][:, :, kv_heads].contiguous(),
                v=call["v"][:, :, kv_heads].contiguous())
    for name in ("k_scale", "v_scale"):
        if name in call:
            part[name] = call[name][kv_heads].contiguous()
    return part


def run(kernel: str, call: dict, **extra) -> tuple[torch.Tensor, torch.Tensor]:
    call = dict(call)
    return decode(call.pop("q"), call.pop("k"), call.pop("v"), BUDGET, kernel=kernel, return_counts=True, **call, **extra)


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bitwise on the CPU (one head's work does not depend on the others at these shapes); up to float rounding on a GPU."""
    if CUDA:
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-3)
    else:
        assert torch.equal(got, want)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_ranks_with_their_head_offset_draw_what_one_call_draws(decode_path, kernel, cache, tp):
    call = inputs(cache, seed=tp)
    whole, whole_counts = run(kernel, call)
    parts = [run(kernel, rank_slice(call, tp, r), head_offset=r * H // tp) for r in range(tp)]
    assert torch.equal(torch.cat([c for _, c in parts], dim=1), whole_counts)
    assert_same(torch.cat([o for o, _ in parts], dim=1), whole)
    assert bool((whole_counts.sum(-1) == BUDGET).all())  # sampled, not covered: the draws matter


@pytest.mark.parametrize("kernel", KERNELS)
def test_without_the_offset_a_rank_draws_rank_0s_samples(decode_path, kernel):
    """The bug: heads h and h + H/2 get one uniform when each rank counts heads from 0. With rank 1's inputs equal to
    rank 0's, rank 1 then samples exactly rank 0's keys, where the whole call (and rank 1 with its offset) draws afresh."""
    call = inputs("bf16", seed=7)
    call["q"] = torch.cat([call["q"][:, : H // 2]] * 2, dim=1)
    call["k"], call["v"] = (torch.cat([call[n][:, :, : H_KV // 2]] * 2, dim=2) for n in ("k", "v"))
    whole, whole_counts = run(kernel, call)
    rank0 = run(kernel, rank_slice(call, 2, 0))
    unkeyed = run(kernel, rank_slice(call, 2, 1))
    keyed = run(kernel, rank_slice(call, 2, 1), head_offset=H // 2)
    assert torch.equal(unkeyed[1], rank0[1]) and torch.equal(unkeyed[0], rank0[0])  # rank 1 repeats rank 0's draws
    assert not torch.equal(whole_counts[:, H // 2:], whole_counts[:, : H // 2])  # the model's heads draw afresh
    assert torch.equal(keyed[1], whole_counts[:, H // 2:]) and not torch.equal(keyed[1], unkeyed[1])


def test_the_reference_uniforms_of_a_slice_are_the_whole_calls():
    positions, keys = torch.tensor([3, 900]), torch.tensor([1, 2**62])
    whole = call_uniforms(keys, 0, positions, 2, 8, torch.arange(3))
    for rank in range(4):
        part = call_uniforms(keys, 0, positions, 2, 2, torch.arange(3), head_offset=2 * rank)
        assert torch.equal(part, whole[:, 2 * rank: 2 * rank + 2])
    assert torch.equal(call_uniforms(keys, 0, positions, 2, 2, head_offset=2), call_uniforms(keys, 0, positions, 2, 4)[:, 2:])
    assert torch.equal(call_uniforms(keys, 0, positions, 2, 2), call_uniforms(keys, 0, positions, 2, 4)[:, :2])
    # the batch-row counter (offset, b·H + head_offset + h): the kernels' arithmetic, which the entry points refuse
    assert torch.equal(call_uniforms(3, 10, None, 2, 4, head_offset=1)[0, :3], call_uniforms(3, 10, None, 2, 4)[0, 1:])


def test_no_offset_changes_no_draw():
    """head_offset=0 (and its default) draw what santa drew before the offset existed: the counter's head is h."""
    call = inputs("bf16", seed=3)
    plain, explicit = run("prop", call), run("prop", call, head_offset=0)
    assert torch.equal(plain[0], explicit[0]) and torch.equal(plain[1], explicit[1])
    assert torch.equal(call_uniforms(4, 0, torch.tensor([5]), 1, 3, head_offset=0), call_uniforms(4, 0, torch.tensor([5]), 1, 3))


@pytest.mark.parametrize("value, error", [(1.0, TypeError), ("1", TypeError), (True, TypeError), (None, TypeError),
                                          (-1, ValueError), (2**31, ValueError)])
def test_a_bad_head_offset_is_refused_by_name(value, error):
    call = inputs("bf16")
    with pytest.raises(error, match="head_offset"):
        run("prop", call, head_offset=value)
    plan = plan_decode(batch=B, heads=H, kv_heads=H_KV, head_dim=D, n_keys=L, budget=BUDGET, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(error, match="head_offset"):
        plan.run(call["q"], call["k"], call["v"], positions=call["positions"], head_offset=value)
    with pytest.raises(error, match="head_offset"):
        check_head_offset(value, heads=H, positional=True)
    if error is ValueError:
        with pytest.raises(ValueError, match="head_offset"):
            prop_reference(call["q"], call["k"], call["v"], BUDGET, positions=call["positions"], head_offset=-1)


def test_a_head_offset_needs_positions():
    """The batch-row counter (offset, b·H + h) counts the call's own heads: no offset makes it the model's."""
    call = inputs("bf16")
    with pytest.raises(ValueError, match="head_offset=4 needs positions"):
        decode(call["q"], call["k"], call["v"], BUDGET, head_offset=4)
    plan = plan_decode(batch=B, heads=H, kv_heads=H_KV, head_dim=D, n_keys=L, budget=BUDGET, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="head_offset=4 needs positions"):
        plan.run(call["q"], call["k"], call["v"], head_offset=4)
    assert check_head_offset(4, heads=H, positional=True) == 4 and check_head_offset(0, heads=H, positional=False) == 0
    assert check_head_offset(2**31 - H, heads=H, positional=True) == 2**31 - H  # the counter's 32-bit head word


def test_the_offset_is_a_runtime_argument_of_every_launch(monkeypatch):
    """One compiled kernel per rank's plan (the offset is not in the Triton launch key, so not specialised on), and the
    one-launch CUDA prop takes the offset as an argument too: a rank past the first keeps the one launch."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # run_checked launches (here: the stand-in) instead of the torch fallback
    call = inputs("bf16")
    plan = plan_decode(batch=B, heads=H, kv_heads=H_KV, head_dim=D, n_keys=L, budget=BUDGET, dtype=torch.bfloat16, device=DEVICE)
    q, k, v, positions = call["q"], call["k"], call["v"], call["positions"]
    out = torch.empty_like(q)
    common = (q, k, v, None, None, 0, 0, out, None, None, 1.0, 1.0, positions, None)
    key0, args0, _ = plan._arguments(*common, 0)
    key4, args4, _ = plan._arguments(*common, 4)
    assert key0 == key4 and args0["head_offset"] == 0 and args4["head_offset"] == 4

    class OneLaunchStandIn:  # as on an sm_90 GPU: records what the plan passes to the launch
        calls: list = []

        def own_buffers(self):
            return "own buffers"

        def run(self, *tensors, **kwargs):
            self.calls.append(kwargs)
            return kwargs["out"]

    plan.one_launch = OneLaunchStandIn()
    for offset in (0, 4):
        plan.run(q, k, v, seq_lens=call["seq_lens"], positions=positions, out=out, head_offset=offset)
    assert [c["head_offset"] for c in OneLaunchStandIn.calls] == [0, 4]
    assert all(c["buffers"] == "own buffers" and c["strides"] == (k.stride(0), k.stride(1), k.stride(2))
               for c in OneLaunchStandIn.calls)


def test_the_custom_op_takes_the_offset():
    """``torch.ops.santa.decode`` (what torch.compile traces :func:`santa.decode` into) passes head_offset through."""
    call = inputs("bf16", seed=5)
    part = rank_slice(call, 2, 1)
    want = run("prop", part, head_offset=H // 2)
    got = torch.ops.santa.decode_counts(part["q"], part["k"], part["v"], part["seq_lens"], None, None, part["seed"],
                                        part["positions"], None, BUDGET, "prop", "NHD", None, 0, 0, head_offset=H // 2)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
