"""santa.kernels: non-finite input, bad seq_lens / block_table values and mismatched workspaces.

Every path (the Triton kernels under the interpreter or on CUDA, the planned ``run`` with no host
checks, and the torch fallback) gives NaN for the affected (sequence, head) rows and a finite,
correct answer elsewhere; host checks raise ValueError naming the argument.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import DEVICE, KERNELS, kernel_reference, make_inputs, to_paged
from santa.kernels import MAX_BUDGET, decode, make_workspace, plan_decode

triton = pytest.importorskip("triton")

def cpu_fallback(monkeypatch, kernel, q, k, v, budget, **kw):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return decode(q.cpu(), k.cpu(), v.cpu(), budget, kernel=kernel, **kw)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_q_or_k_gives_nan_in_the_affected_rows_only(kernel, where, value, monkeypatch):
    q, k, v = make_inputs(2, 4, 2, 32, 150, seed=1)
    if where == "q":
        q[0, 1, 3] = value  # sequence 0, head 1
        affected = torch.zeros(2, 4, dtype=torch.bool)
        affected[0, 1] = True
    else:
        k[1, 140, 0, :] = value  # sequence 1, key 140 (in the second tile), KV head 0 → heads 0, 1
        affected = torch.zeros(2, 4, dtype=torch.bool)
        affected[1, :2] = True
    if value == math.inf and where == "q":
        k[0, :, :, 3] = k[0, :, :, 3].abs() + 0.1  # +inf · (positive) = +inf scores
    if value == math.inf and where == "k":
        q[1, :2, :] = q[1, :2, :].abs() + 0.1
    for out in (
        decode(q, k, v, 16, kernel=kernel, seed=3),
        cpu_fallback(monkeypatch, kernel, q, k, v, 16, seed=3),
        kernel_reference(kernel, q, k, v, 16, seed=3)[0],
    ):
        out = out.cpu()
        assert torch.isnan(out[affected]).all()
        assert torch.isfinite(out[~affected]).all()
    clean = kernel_reference(kernel, q, k, v, 16, seed=3)[0].cpu()
    got = decode(q, k, v, 16, kernel=kernel, seed=3).cpu()
    torch.testing.assert_close(got[~affected], clean[~affected], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_minus_inf_scores_get_zero_weight_like_a_mask(kernel):
    q, k, v = make_inputs(1, 2, 1, 16, 40, seed=2)
    q = q.abs() + 0.1
    k[0, 5:, 0, :] = -math.inf  # keys 5.. score −inf: as if masked
    out = decode(q, k, v, 4, kernel=kernel, seed=1)  # S = 4 below the 5 finite keys: sampled either way
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu(), kernel_reference(kernel, q, k, v, 4, seed=1)[0].cpu(), rtol=1e-5, atol=1e-6)
    if kernel == "prop":  # the same distribution and uniforms: the same samples as with the keys cut off
        masked = decode(q, k[:, :5].contiguous(), v[:, :5].contiguous(), 4, kernel=kernel, seed=1)
        torch.testing.assert_close(out, masked, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_sampled_nan_value_row_gives_nan_and_an_unsampled_one_is_unseen(kernel):
    q, k, v = make_inputs(1, 2, 1, 16, 64, seed=4)
    q[0, 0] = 0.0  # head 0: uniform weights, samples spread over the keys
    q[0, 1] = 30 * k[0, 7, 0]  # head 1: all its mass on key 7
    _, counts = decode(q, k, v, 8, kernel=kernel, seed=0, return_counts=True)
    unsampled = int(torch.nonzero((counts[0].sum(0) == 0).cpu())[0, 0])
    v_bad = v.clone()
    v_bad[0, 7, 0, 0] = math.nan  # sampled by head 1
    v_bad[0, unsampled, 0, 0] = math.nan  # sampled by no head
    out = decode(q, k, v_bad, 8, kernel=kernel, seed=0).cpu()
    ref = kernel_reference(kernel, q, k, v_bad, 8, seed=0)[0].cpu()
    for result in (out, ref):
        assert torch.isnan(result[0, 1, 0]) and torch.isfinite(result[0, 1, 1:]).all()  # the element, as SDPA
        # prop: head 0 sees the NaN only if it sampled key 7; flash reads key 7 once for the group
        assert bool(torch.isnan(result[0, 0, 0])) == (kernel == "flash" or bool(counts[0, 0, 7] > 0))
        assert torch.isfinite(result[0, 0, 1:]).all()


@pytest.mark.parametrize("kernel", KERNELS)
def test_unchecked_bad_seq_len_gives_nan_for_that_sequence_and_reads_nothing_outside(kernel):
    q, k, v = make_inputs(3, 4, 2, 32, 100, seed=5)
    plan = plan_decode(batch=3, heads=4, kv_heads=2, head_dim=32, n_keys=100, budget=16, dtype=q.dtype, device=DEVICE, kernel=kernel)
    seq_lens = torch.tensor([100, -3, 2**30], dtype=torch.int32, device=DEVICE)  # unclamped, 2**30 reads far past the cache
    out = plan.run(q, k, v, seq_lens=seq_lens, seed=1).cpu()
    assert torch.isnan(out[1:]).all()
    good = decode(q[:1], k[:1], v[:1], 16, kernel=kernel, seed=1).cpu()
    torch.testing.assert_close(out[0], good[0])


@pytest.mark.parametrize("kernel", KERNELS)
def test_unchecked_bad_page_id_gives_nan_for_the_heads_that_read_it(kernel):
    q, k, v = make_inputs(2, 4, 2, 32, 64, seed=6)
    kp, table = to_paged(k, 16, seed=2)
    vp, _ = to_paged(v, 16, seed=2)
    seq_lens = torch.tensor([64, 40], dtype=torch.int32, device=DEVICE)
    bad = table.clone()
    bad[0, 2] = 2**30  # far past the pool: never followed
    bad[1, 3] = 10**6  # past sequence 1's 3 pages: never read, legal
    plan = plan_decode(batch=2, heads=4, kv_heads=2, head_dim=32, n_keys=64, budget=16, dtype=q.dtype, device=DEVICE,
                       kernel=kernel, page_size=16)
    out = plan.run(q, kp, vp, seq_lens=seq_lens, block_table=bad, seed=2).cpu()
    good = decode(q, kp, vp, 16, kernel=kernel, seq_lens=seq_lens, block_table=table, seed=2).cpu()
    assert torch.isnan(out[0]).all()
    torch.testing.assert_close(out[1], good[1])


def test_checked_tables_raise_naming_the_entry():
    q, k, v = make_inputs(2, 4, 2, 32, 64, seed=7)
    kp, table = to_paged(k, 16, seed=3)
    vp, _ = to_paged(v, 16, seed=3)
    lens = torch.tensor([64, 40], dtype=torch.int32, device=DEVICE)
    for entry in (-1, kp.shape[0]):
        bad = table.clone()
        bad[1, 2] = entry
        with pytest.raises(ValueError, match=r"block_table\[1, 2\]"):
            decode(q, kp, vp, 8, seq_lens=lens, block_table=bad, check=True)
    padded = table.clone()
    padded[1, 3] = -1  # sequence 1 uses 3 pages: the 4th entry is never read
    decode(q, kp, vp, 8, seq_lens=lens, block_table=padded, check=True)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 65"):
        decode(q, kp, vp, 8, seq_lens=torch.tensor([65, 40], dtype=torch.int32, device=DEVICE), block_table=table, check=True)
    with pytest.raises(TypeError, match="check"):
        decode(q, k, v, 8, check="yes")


def test_cpu_fallback_ignores_table_entries_past_a_sequence(monkeypatch):
    q, k, v = make_inputs(2, 4, 2, 32, 64, seed=8)
    kp, table = to_paged(k.cpu(), 16, seed=4)
    vp, _ = to_paged(v.cpu(), 16, seed=4)
    lens = torch.tensor([64, 40], dtype=torch.int32)
    padded = table.clone()
    padded[1, 3] = 10**6
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    a = decode(q.cpu(), kp, vp, 8, seq_lens=lens, block_table=padded)
    b = decode(q.cpu(), kp, vp, 8, seq_lens=lens, block_table=table)
    assert torch.equal(a, b)


def test_a_workspace_is_refused_for_another_kernel_or_shape():
    q, k, v = make_inputs(1, 4, 2, 32, 100, seed=9)
    flash_ws = make_workspace(q, k, 16, kernel="flash")
    with pytest.raises(ValueError, match="workspace was made for kernel='flash'"):
        decode(q, k, v, 16, kernel="prop", workspace=flash_ws)
    with pytest.raises(ValueError, match="budget=16"):
        decode(q, k, v, 32, kernel="flash", workspace=flash_ws)
    with pytest.raises(TypeError, match="workspace must be a santa.kernels.Workspace"):
        decode(q, k, v, 16, workspace=torch.zeros(10**6, dtype=torch.uint8, device=DEVICE))
    prop_ws = make_workspace(q, k, 16, kernel="prop")
    first = decode(q, k, v, 16, workspace=prop_ws, seed=1)
    assert torch.equal(decode(q, k, v, 16, workspace=prop_ws, seed=1), first)


@pytest.mark.parametrize("change,error,match", [
    (dict(kernel="foo"), ValueError, "kernel"),
    (dict(kv_layout="XYZ"), ValueError, "kv_layout"),
    (dict(budget=0), ValueError, "budget"),
    (dict(budget=2.5), TypeError, "budget"),
])
def test_make_workspace_refuses_bad_arguments(change, error, match):
    q, k, _ = make_inputs(1, 4, 2, 32, 10)
    kwargs = dict(kernel="prop", kv_layout="NHD") | {key: val for key, val in change.items() if key != "budget"}
    with pytest.raises(error, match=match):
        make_workspace(q, k, change.get("budget", 8), **kwargs)


def test_budgets_past_the_kernels_limit_are_refused_before_any_allocation():
    q, k, v = make_inputs(1, 4, 2, 32, 10)
    for budget in (MAX_BUDGET + 1, 10**9):
        with pytest.raises(ValueError, match=r"budget must lie in \[1, 1048576\]"):
            decode(q, k, v, budget)
        with pytest.raises(ValueError, match="budget"):
            make_workspace(q, k, budget)
    out = decode(q, k, v, 4096)  # S ≫ n is legal: counts repeat
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("change,error,match", [
    (dict(heads=6, kv_heads=4), ValueError, "multiple of kv_heads"),
    (dict(batch=0), ValueError, "batch"),
    (dict(head_dim=True), TypeError, "head_dim"),
    (dict(page_size=7), ValueError, "multiple of page_size"),
    (dict(dtype=torch.int8), TypeError, "dtype"),
    (dict(scale=math.nan), ValueError, "scale"),
    (dict(tuning={"block_n": 64}), TypeError, "tuning"),
])
def test_plan_decode_refuses_bad_shapes(change, error, match):
    args = dict(batch=1, heads=4, kv_heads=2, head_dim=32, n_keys=64, budget=8, dtype=torch.float32, device="cpu") | change
    with pytest.raises(error, match=match):
        plan_decode(**args)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_sampled_inf_value_gives_the_same_non_finite_output_as_the_reference(kernel):
    q, k, v = make_inputs(1, 2, 1, 16, 64, seed=10)
    q[0, 1] = 30 * k[0, 7, 0]  # head 1: all its mass on key 7
    v[0, 7, 0, 0] = math.inf
    out = decode(q, k, v, 8, kernel=kernel, seed=0).cpu()
    ref = kernel_reference(kernel, q, k, v, 8, seed=0)[0].cpu()
    assert out[0, 1, 0] == math.inf and ref[0, 1, 0] == math.inf  # Σ c_j v_j / S: inf stays inf
    same = torch.isfinite(ref) | torch.isfinite(out)
    torch.testing.assert_close(out[same], ref[same], rtol=1e-5, atol=1e-6)
    assert torch.equal(torch.isnan(out), torch.isnan(ref))


def test_strided_seq_lens_are_refused():
    q, k, v = make_inputs(2, 4, 2, 32, 64, seed=11)
    both = torch.tensor([[10, 99], [64, 99]], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="seq_lens must be contiguous"):
        decode(q, k, v, 8, seq_lens=both[:, 0])


def test_the_torch_fallback_checks_tables_even_unasked(monkeypatch):
    q, k, v = make_inputs(1, 4, 2, 32, 40, seed=12)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 41"):
        decode(q.cpu(), k.cpu(), v.cpu(), 8, seq_lens=torch.tensor([41], dtype=torch.int32), check=False)


@pytest.mark.parametrize("tuning,match", [
    (dict(block_n=100), "block_n"), (dict(block_n=0), "block_n"), (dict(samples_per_program=48), "samples_per_program"),
    (dict(warps_pass2=-4), "warps_pass2"), (dict(stages_pass1=9), "stages_pass1"), (dict(pdl="yes"), "pdl"),
    (dict(tile_search="binary"), "tile_search"), (dict(tile_search=["scan"]), "tile_search"),
    (dict(k_evict_first="yes"), "k_evict_first"), (dict(k_evict_first=1), "k_evict_first"),
    (dict(discard_stash="no"), "discard_stash"), (dict(pass1_programs=3), "pass1_programs"), (dict(pass1_programs=0), "pass1_programs"),
])
def test_bad_tuning_fields_are_refused_by_name(tuning, match):
    from santa.kernels import Tuning

    with pytest.raises((ValueError, TypeError), match=match):
        plan_decode(batch=1, heads=4, kv_heads=2, head_dim=32, n_keys=64, budget=8, dtype=torch.float32, device="cpu",
                    tuning=Tuning(**tuning))


def test_a_validated_call_signature_never_lets_a_bad_call_through():
    """decode() skips re-validating a signature it has seen; every other call is still refused by name."""
    q, k, v = make_inputs(1, 4, 2, 32, 40, seed=3)
    seq_lens = torch.tensor([40], dtype=torch.int32, device=DEVICE)
    good = decode(q, k, v, 8, seq_lens=seq_lens, seed=1)
    assert torch.equal(decode(q, k, v, 8, seq_lens=seq_lens, seed=1), good)  # the cached signature: same result
    bad_calls = [
        (dict(seed=-1), ValueError, "seed"), (dict(seed=True), TypeError, "seed"), (dict(offset=2**63), ValueError, "offset"),
        (dict(budget=True), (TypeError, ValueError), "budget"), (dict(budget=8.0), (TypeError, ValueError), "budget"),
        (dict(check="yes"), TypeError, "check"), (dict(seq_lens=seq_lens.long()), TypeError, "seq_lens"),
        (dict(seq_lens=torch.tensor([41], dtype=torch.int32, device=DEVICE), check=True), ValueError, "seq_lens"),
        (dict(out=torch.empty(1, 4, 32, dtype=torch.float16, device=DEVICE)), ValueError, "out"),
        (dict(v=v[..., :16]), ValueError, "shape"), (dict(kernel=["prop"]), (TypeError, ValueError), "kernel"),
        (dict(scale=float("nan")), ValueError, "scale"),
        (dict(batch_invariant="yes"), TypeError, "batch_invariant must be a bool, got str"),
        (dict(batch_invariant=1), TypeError, "batch_invariant must be a bool, got int"),
    ]
    for change, error, match in bad_calls:
        args = dict(q=q, k_cache=k, v_cache=v, budget=8, seq_lens=seq_lens, seed=1)
        if "v" in change:
            args["v_cache"] = change.pop("v")
        args.update(change)
        with pytest.raises(error, match=match):
            decode(**args)
    assert torch.equal(decode(q, k, v, 8, seq_lens=seq_lens, seed=1), good)


def test_a_cached_signature_follows_triton_interpret(monkeypatch):
    """Whether a CPU call runs the kernels (TRITON_INTERPRET=1) or the torch fallback is read per call,
    also for a signature whose validation is cached."""
    import importlib

    if DEVICE.type != "cpu":
        pytest.skip("on CUDA the kernels always run")
    decode_module = importlib.import_module("santa.kernels.eager")
    q, k, v = make_inputs(1, 4, 2, 32, 48, seed=5)
    decode(q, k, v, 8, seed=2)  # under the interpreter (the fixture sets it): the kernels
    fallback = []
    real_reference = decode_module._decode_reference
    monkeypatch.setattr(decode_module, "_decode_reference", lambda *a: fallback.append(1) or real_reference(*a))
    monkeypatch.delenv("TRITON_INTERPRET")
    decode(q, k, v, 8, seed=2)
    assert fallback == [1]


def _fallback_plan(monkeypatch, **shape):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # kernels_on_cpu() is False: plan.run runs the torch fallback
    return plan_decode(batch=2, heads=4, kv_heads=2, head_dim=8, n_keys=16, budget=4, dtype=torch.float32, device="cpu",
                       **shape)


def test_the_plans_torch_fallback_reads_the_first_b_rows_of_larger_tables(monkeypatch):
    """DecodePlan.run takes tables with more rows than the plan's batch (vLLM's persistent buffers): the fallback reads
    their first B entries, as the kernels do, and never checks the rows past them."""
    plan = _fallback_plan(monkeypatch)
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 16, 2, 8), torch.randn(2, 16, 2, 8)
    lens, positions = torch.tensor([4, 3], dtype=torch.int32), torch.tensor([5, 7])
    want = plan.run(q, k, v, seq_lens=lens, positions=positions, seed=1)
    got = plan.run(q, k, v, seq_lens=torch.tensor([4, 3, 99], dtype=torch.int32), positions=torch.tensor([5, 7, -1]), seed=1)
    assert torch.equal(got, want)
    paged = _fallback_plan(monkeypatch, page_size=4)
    pages = torch.randn(6, 4, 2, 8)
    table = torch.tensor([[0, 1, 2, 3], [3, 4, 5, 0]], dtype=torch.int32)
    want = paged.run(q, pages, pages, block_table=table, seq_lens=lens)
    got = paged.run(q, pages, pages, block_table=torch.cat([table, table.new_full((1, 4), 99)]), seq_lens=lens)
    assert torch.equal(got, want)


@pytest.mark.parametrize("call,error,match", [
    (dict(block_table=torch.tensor([[0, 1, 2, 99], [3, 4, 5, 0]], dtype=torch.int32)), ValueError,
     r"block_table\[0, 3\] = 99 must be a page id in \[0, 6\)"),  # no seq_lens: every page is read
    (dict(starts=torch.tensor([5, 0], dtype=torch.int32), seq_lens=torch.tensor([4, 3], dtype=torch.int32)), ValueError,
     r"starts\[0\] = 5 must lie in \[0, 4\]"),
    (dict(positions=torch.tensor([-1, 2])), ValueError, r"positions\[0\] = -1 must be ≥ 0"),
    (dict(seed=torch.tensor([3, -2])), ValueError, r"seed\[1\] = -2 must be ≥ 0"),
    (dict(k_scale="x"), TypeError, "k_scale must be a float or a float32 tensor"),
    (dict(v_scale=2.0), ValueError, "v_scale dequantises a float8_e4m3fn cache; this call's caches are not fp8"),
])
def test_the_plans_torch_fallback_refuses_what_the_kernels_guard_by_name(monkeypatch, call, error, match):
    """The values the kernels guard on the device (a bad page, a start past its sequence, a negative position or key),
    checked by name on the CPU fallback, where a check costs no sync; a scale on a cache that is not fp8 is refused on
    every path (the Triton kernels would scale the scores, the fallback and the one launch would not)."""
    paged = "block_table" in call
    plan = _fallback_plan(monkeypatch, **(dict(page_size=4) if paged else {}))
    q = torch.randn(2, 4, 8)
    k = torch.randn(6, 4, 2, 8) if paged else torch.randn(2, 16, 2, 8)
    if "seed" in call or "positions" in call:
        call = dict(call, positions=call.get("positions", torch.tensor([1, 2])))
    with pytest.raises(error, match=match):
        plan.run(q, k, k, **call)


@pytest.mark.parametrize("scale", [-1.0, float("nan"), torch.tensor([1.0, -2.0])])
def test_an_fp8_plans_scales_must_be_finite_and_positive(monkeypatch, scale):
    plan = _fallback_plan(monkeypatch, kv_dtype=torch.float8_e4m3fn)
    q, k = torch.randn(2, 4, 8), torch.randn(2, 16, 2, 8).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="k_scale must (be a finite scale|hold finite scales) > 0"):
        plan.run(q, k, k, k_scale=scale)


def test_a_cache_in_the_other_layout_is_named():
    q, k = torch.randn(1, 4, 8), torch.randn(1, 16, 2, 8)  # NHD: 16 keys, 2 KV heads
    with pytest.raises(ValueError, match=r"kv_layout='HND' reads k_cache \(1, 16, 2, 8\) as \[B, H_kv, L_max, d\]: is it NHD\?"):
        decode(q, k, k, 4, kv_layout="HND")
