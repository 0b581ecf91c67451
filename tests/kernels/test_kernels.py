"""santa.kernels.decode: the Triton prop and flash kernels against the reference samplers.

On CPU the kernels run under TRITON_INTERPRET=1 (small shapes); on a CUDA machine the same tests
run the compiled kernels, plus the CUDA-only tests at the bottom.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import CUDA, DEVICE, make_inputs, needs_cuda, to_paged
from santa.kernels import decode, flash_reference, flash_tile, make_workspace, philox_uniforms, prop_reference
from santa.sampling import sample_counts

triton = pytest.importorskip("triton")  # the interpreter's setup: tests/kernels/conftest.py


def dense_probs(q, k, seq_lens=None, layout="NHD"):
    """float64 softmax weights [B, H, L] (zero past seq_lens) for a contiguous cache."""
    if layout == "HND":
        k = k.transpose(1, 2)
    heads, kv_heads = q.shape[1], k.shape[2]
    s = torch.einsum("bhd,blhd->bhl", q.double(), k.double().repeat_interleave(heads // kv_heads, dim=2))
    s = s / math.sqrt(q.shape[-1])
    if seq_lens is not None:
        visible = torch.arange(k.shape[1], device=k.device) < seq_lens.long().unsqueeze(-1)
        s = s.masked_fill(~visible.unsqueeze(1), -math.inf)
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


def sorted_indices(counts, budget):
    """The systematic sampler's nondecreasing indices J_0 ≤ … ≤ J_{S−1} from per-key counts [R, n] → [R, S]."""
    rows = counts.reshape(-1, counts.shape[-1]).long().cpu()
    keys = torch.arange(rows.shape[-1])
    return torch.stack([torch.repeat_interleave(keys, row) for row in rows]).reshape(*counts.shape[:-1], budget)


def assert_counts_match_systematic(counts, probs, budget, uniforms, tol=2e-5, max_moved=0.02):
    """Kernel counts equal ``sample_counts(p, S, "systematic", U)`` but for samples on a CDF step.

    The kernels compute the CDF in float32, the reference in float64: sample m may land on the
    other side of a step F(j) only where ``|F(j) − (m + U)/S| ≤ tol``.
    """
    probs, uniforms = probs.double().cpu(), uniforms.double().cpu()
    ref = sample_counts(probs, budget, "systematic", uniforms=uniforms)
    assert torch.equal(counts.long().sum(-1).cpu(), ref.sum(-1)), "every head draws exactly S samples"
    got, want = sorted_indices(counts, budget), sorted_indices(ref, budget)
    moved = got != want
    cdf = torch.cumsum(probs, dim=-1)
    points = (torch.arange(budget, dtype=torch.float64) + uniforms.unsqueeze(-1)) / budget  # T_m
    lo, hi = torch.minimum(got, want), torch.maximum(got, want)
    near_lo = (cdf.gather(-1, lo) - points).abs() <= tol
    near_hi = (cdf.gather(-1, (hi - 1).clamp_min(0)) - points).abs() <= tol
    assert (~moved | (near_lo & near_hi)).all(), "a sample moved across a CDF step it is not near"
    assert moved.float().mean() <= max_moved


def prop_uniforms(batch, heads, seed, offset):
    return philox_uniforms(seed, offset, torch.arange(batch * heads).reshape(batch, heads))


# --------------------------------------------------------------------------- prop: exact sampler


@pytest.mark.parametrize(
    "batch,heads,kv_heads,dim,n_keys,budget",
    [
        (2, 4, 1, 64, 300, 64),  # n not a tile multiple, several tiles
        (1, 3, 3, 64, 50, 16),  # GQA 1, n < one tile
        (2, 6, 2, 32, 129, 120),  # GQA 3, S just below n
        (1, 7, 1, 64, 6, 5),  # GQA 7, a few keys
    ],
)
def test_prop_counts_equal_systematic_reference_given_kernel_uniforms(batch, heads, kv_heads, dim, n_keys, budget):
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, seed=n_keys)
    out, counts = decode(q, k, v, budget, kernel="prop", seed=11, offset=7, return_counts=True)
    uniforms = prop_uniforms(batch, heads, 11, 7)
    assert_counts_match_systematic(counts, dense_probs(q, k), budget, uniforms)


def test_prop_counts_sum_to_budget_and_vanish_past_seq_lens():
    q, k, v = make_inputs(3, 8, 2, 32, 260, seed=1)
    seq_lens = torch.tensor([260, 131, 97], dtype=torch.int32, device=DEVICE)  # all above S = 96 (S ≥ n: exact)
    _, counts = decode(q, k, v, 96, kernel="prop", seq_lens=seq_lens, return_counts=True)
    assert torch.equal(counts.sum(-1), torch.full((3, 8), 96, dtype=counts.dtype, device=DEVICE))
    past = torch.arange(260, device=DEVICE) >= seq_lens.long().unsqueeze(-1)  # [B, L]
    assert counts.masked_select(past.unsqueeze(1)).eq(0).all()
    assert_counts_match_systematic(counts, dense_probs(q, k, seq_lens), 96, prop_uniforms(3, 8, 0, 0))


def test_prop_output_is_counts_weighted_mean_of_values():
    q, k, v = make_inputs(2, 8, 2, 64, 200, torch.bfloat16, seed=2)
    out, counts = decode(q, k, v, 64, kernel="prop", seed=5, return_counts=True)
    vv = v.double().repeat_interleave(4, dim=2)  # [B, L, H, d]
    expected = torch.einsum("bhl,blhd->bhd", counts.double(), vv) / 64  # ô = (1/S) Σ_j c_j v_j
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, rtol=8e-3, atol=8e-3)


def test_sequence_of_length_zero_gets_zero_output_and_no_counts():
    q, k, v = make_inputs(2, 4, 2, 32, 40, seed=3)
    seq_lens = torch.tensor([0, 40], dtype=torch.int32, device=DEVICE)
    for kernel in ("prop", "flash"):
        out, counts = decode(q, k, v, 8, kernel=kernel, seq_lens=seq_lens, return_counts=True)
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        assert counts[0].sum() == 0 and bool((counts[1].sum(-1) >= 8).all())


def test_prop_is_unbiased_within_a_variance_bound():
    """Mean of R independent draws (R sequences holding the same K/V) converges to dense attention."""
    replicas, heads, dim, n_keys, budget = 64, 1, 16, 40, 4
    q1, k1, v1 = make_inputs(1, heads, 1, dim, n_keys, seed=4, q_scale=3.0)
    q, k, v = q1.expand(replicas, -1, -1).contiguous(), k1.expand(replicas, -1, -1, -1).contiguous(), v1.expand(replicas, -1, -1, -1).contiguous()
    out = decode(q, k, v, budget, kernel="prop", seed=9).double()  # [R, H, d]
    probs = dense_probs(q1, k1)[0]  # [H, L]
    exact = probs @ v1[0, :, 0].double()  # [H, d]
    mean = out.mean(0)
    spread = out.var(0, unbiased=True).sum(-1)  # trace of the estimator's covariance, per head
    assert (spread > 0).all(), "the estimator should be random at S=4"
    err2 = ((mean - exact) ** 2).sum(-1)
    # E‖mean − μ‖² = tr Cov / R; 12× that is exceeded with probability < 1/12 per head (Markov)
    assert (err2 <= 12 * spread / replicas + 1e-10).all(), (err2, spread / replicas)


def test_same_seed_and_offset_are_bitwise_equal_and_new_offset_draws_fresh_samples():
    q, k, v = make_inputs(2, 4, 2, 32, 150, torch.float16, seed=5)
    for kernel in ("prop", "flash"):
        a, ca = decode(q, k, v, 16, kernel=kernel, seed=3, offset=10, return_counts=True)
        b, cb = decode(q, k, v, 16, kernel=kernel, seed=3, offset=10, return_counts=True)
        c, cc = decode(q, k, v, 16, kernel=kernel, seed=3, offset=11, return_counts=True)
        d, cd = decode(q, k, v, 16, kernel=kernel, seed=4, offset=10, return_counts=True)
        assert torch.equal(a, b) and torch.equal(ca, cb)
        assert not torch.equal(ca, cc) and not torch.equal(ca, cd)


def test_offset_read_from_device_tensor_equals_int_offset():
    q, k, v = make_inputs(1, 4, 1, 32, 90, seed=6)
    for kernel in ("prop", "flash"):
        a = decode(q, k, v, 12, kernel=kernel, offset=2**33 + 5)
        b = decode(q, k, v, 12, kernel=kernel, offset=torch.tensor([2**33 + 5], device=DEVICE))
        assert torch.equal(a, b)


@pytest.mark.parametrize("dim,group,dtype", [(64, 8, torch.bfloat16), (128, 4, torch.float16), (256, 1, torch.bfloat16)])
def test_prop_head_dims_and_gqa_over_a_paged_cache(dim, group, dtype):
    batch, kv_heads, n_keys, page_size = 2, 2, 150, 16
    q, k, v = make_inputs(batch, group * kv_heads, kv_heads, dim, n_keys, dtype, seed=dim + group)
    seq_lens = torch.tensor([150, 61], dtype=torch.int32, device=DEVICE)
    k_pages, table = to_paged(k, page_size, seed=1)
    v_pages, _ = to_paged(v, page_size, seed=1)
    out_c, counts_c = decode(q, k, v, 40, seq_lens=seq_lens, seed=2, return_counts=True)
    out_p, counts_p = decode(q, k_pages, v_pages, 40, seq_lens=seq_lens, block_table=table, seed=2, return_counts=True)
    assert torch.equal(counts_p[..., :n_keys], counts_c) and counts_p[..., n_keys:].eq(0).all()
    torch.testing.assert_close(out_p, out_c, rtol=0, atol=0)
    assert_counts_match_systematic(counts_c, dense_probs(q, k, seq_lens), 40, prop_uniforms(batch, group * kv_heads, 2, 0))


def test_hnd_layout_equals_nhd():
    q, k, v = make_inputs(2, 4, 2, 32, 70, seed=8)
    for kernel in ("prop", "flash"):
        a = decode(q, k, v, 20, kernel=kernel)
        b = decode(q, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), 20, kernel=kernel, kv_layout="HND")
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_random_shapes_match_the_reference():
    rng = torch.Generator().manual_seed(123)
    for trial in range(5):
        dim = [32, 64, 128][trial % 3]
        group = [1, 3, 4, 7, 8][trial]
        kv_heads = int(torch.randint(1, 3, (1,), generator=rng))
        batch = int(torch.randint(1, 3, (1,), generator=rng))
        n_keys = int(torch.randint(1, 300, (1,), generator=rng))
        budget = int(torch.randint(1, 2 * n_keys + 2, (1,), generator=rng))
        dtype = [torch.float32, torch.bfloat16, torch.float16][trial % 3]
        q, k, v = make_inputs(batch, group * kv_heads, kv_heads, dim, n_keys, dtype, seed=trial)
        seq_lens = torch.randint(1, n_keys + 1, (batch,), generator=rng).to(torch.int32).to(DEVICE)
        out, counts = decode(q, k, v, budget, seq_lens=seq_lens, seed=trial, offset=trial, return_counts=True)
        ref_out, ref_counts = prop_reference(q, k, v, budget, seq_lens=seq_lens, seed=trial, offset=trial)
        sampled = (seq_lens > budget).cpu()  # S ≥ a sequence's keys: exact, one read per key (the reference's too)
        live = torch.arange(n_keys) < seq_lens.cpu().long().unsqueeze(-1)  # [B, L]
        assert torch.equal(counts[~sampled].cpu().long(), live[~sampled].unsqueeze(1).expand(-1, group * kv_heads, -1).long())
        assert torch.equal(ref_counts[~sampled].cpu(), counts[~sampled].cpu().long())
        if sampled.any():
            assert_counts_match_systematic(counts[sampled], dense_probs(q, k, seq_lens)[sampled], budget,
                                           prop_uniforms(batch, group * kv_heads, trial, trial)[sampled])
        same = (counts.long() == ref_counts).all(-1)  # [B, H]
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out[same].float(), ref_out[same].float(), rtol=tol, atol=tol)


# --------------------------------------------------------------------------- flash


@pytest.mark.parametrize("n_keys,budget,group", [(300, 64, 4), (40, 8, 3), (257, 5, 1)])
def test_flash_matches_per_tile_reference(n_keys, budget, group):
    batch, kv_heads, dim = 2, 2, 64
    q, k, v = make_inputs(batch, group * kv_heads, kv_heads, dim, n_keys, seed=n_keys)
    seq_lens = torch.tensor([n_keys, max(1, n_keys // 2)], dtype=torch.int32, device=DEVICE)
    out, counts = decode(q, k, v, budget, kernel="flash", seq_lens=seq_lens, seed=1, offset=3, return_counts=True)
    ref_out, ref_counts = flash_reference(q, k, v, budget, tile=flash_tile(dim), seq_lens=seq_lens, seed=1, offset=3)
    tile = flash_tile(dim)
    n_tiles = (seq_lens.long() + tile - 1) // tile
    s_tile = (budget + n_tiles - 1) // n_tiles
    assert torch.equal(counts.sum(-1).long(), (s_tile * n_tiles).unsqueeze(-1).expand(batch, group * kv_heads))
    past = torch.arange(n_keys, device=DEVICE) >= seq_lens.long().unsqueeze(-1)
    assert counts.masked_select(past.unsqueeze(1)).eq(0).all()
    same = (counts.long() == ref_counts).all(-1)
    assert same.float().mean() >= 0.75
    torch.testing.assert_close(out[same], ref_out[same], rtol=1e-5, atol=1e-5)


def test_flash_is_unbiased_within_a_variance_bound():
    replicas, heads, dim, n_keys, budget = 64, 1, 16, 200, 6
    q1, k1, v1 = make_inputs(1, heads, 1, dim, n_keys, seed=12, q_scale=3.0)
    q, k, v = q1.expand(replicas, -1, -1).contiguous(), k1.expand(replicas, -1, -1, -1).contiguous(), v1.expand(replicas, -1, -1, -1).contiguous()
    out = decode(q, k, v, budget, kernel="flash", seed=2).double()
    exact = dense_probs(q1, k1)[0] @ v1[0, :, 0].double()
    spread = out.var(0, unbiased=True).sum(-1)
    err2 = ((out.mean(0) - exact) ** 2).sum(-1)
    assert (spread > 0).all()
    assert (err2 <= 12 * spread / replicas + 1e-10).all(), (err2, spread / replicas)


# --------------------------------------------------------------------------- API


def test_out_and_workspace_are_used_and_reused():
    q, k, v = make_inputs(1, 4, 2, 32, 100, seed=9)
    for kernel in ("prop", "flash"):
        ws = make_workspace(q, k, 24, kernel=kernel)
        out = torch.full_like(q, float("nan"))
        result = decode(q, k, v, 24, kernel=kernel, out=out, workspace=ws, seed=1)
        assert result is out and not torch.isnan(out).any()
        again = decode(q, k, v, 24, kernel=kernel, workspace=ws, seed=1)
        assert torch.equal(again, out)


@pytest.mark.parametrize("kernel", ["prop", "flash"])
def test_a_scratch_workspace_reads_nothing_it_did_not_write(kernel):
    """Workspace.scratch (the custom op's per-call workspace) zeroes only the semaphores: filled with NaN
    elsewhere, it gives the counts and output of a zeroed one, with short sequences and (prop) runs of keys."""
    from santa.kernels import Tuning, Workspace, plan_decode

    q, k, v = make_inputs(2, 8, 2, 32, 300, seed=21)
    seq_lens = torch.tensor([300, 131], dtype=torch.int32, device=DEVICE)
    runs = dict(starts=torch.tensor([0, 40], dtype=torch.int32, device=DEVICE)) if kernel == "prop" else {}
    tuning = Tuning(samples_per_program=4) if kernel == "prop" else Tuning()
    plan = plan_decode(batch=2, heads=8, kv_heads=2, head_dim=32, n_keys=300, budget=48, dtype=q.dtype, device=DEVICE,
                       kernel=kernel, tuning=tuning)
    results = []
    for fill in (0, 255):  # 0xFF bytes: every float32 word is a NaN
        workspace = Workspace.scratch(plan.workspace_key)
        assert not workspace.views.get("sem", torch.zeros(1)).any()
        if fill:
            for name, view in workspace.views.items():
                if name != "sem":
                    view.view(torch.uint8).fill_(fill)
        else:
            workspace.buffer.zero_()
        counts = torch.zeros(2, 8, 300, dtype=torch.int32, device=DEVICE)
        out = plan.run(q, k, v, seq_lens=seq_lens, seed=4, counts=counts, workspace=workspace, **runs)
        results.append((out, counts))
    assert torch.equal(results[0][1], results[1][1]) and torch.equal(results[0][0], results[1][0])
    assert torch.isfinite(results[1][0]).all()


def test_workspaces_of_several_batch_sizes_share_one_scratch_buffer():
    """Workspace.within: plans for B = 3 and B = 1 run on views of one scratch buffer and one semaphore array
    (alternating calls, as a serving engine's CUDA graphs of two batch sizes would), and give what their own
    zeroed workspaces give."""
    from santa.kernels import Tuning, Workspace, plan_decode
    from santa.kernels.layout import workspace_nbytes

    q, k, v = make_inputs(3, 8, 2, 32, 200, seed=22)
    plans = {b: plan_decode(batch=b, heads=8, kv_heads=2, head_dim=32, n_keys=200, budget=24, dtype=q.dtype, device=DEVICE,
                            kernel="prop", tuning=Tuning(samples_per_program=4)) for b in (3, 1)}
    scratch = torch.full((workspace_nbytes(plans[3].workspace_key),), 255, dtype=torch.uint8, device=DEVICE)
    semaphores = torch.zeros(3 * 8, dtype=torch.int32, device=DEVICE)
    shared = {b: Workspace.within(plan.workspace_key, scratch=scratch, semaphores=semaphores) for b, plan in plans.items()}
    for _ in range(2):
        for b, plan in plans.items():
            own = plan.run(q[:b], k[:b], v[:b], seed=5)
            assert torch.equal(plan.run(q[:b], k[:b], v[:b], seed=5, workspace=shared[b]), own)
            assert not semaphores.any()
    with pytest.raises(ValueError, match="scratch must hold"):
        Workspace.within(plans[3].workspace_key, scratch=scratch[:64], semaphores=semaphores)


@pytest.mark.parametrize("paged", [False, True])
def test_planned_run_equals_eager_decode_and_leaves_the_semaphores_at_zero(paged):
    from santa.kernels import Tuning, plan_decode

    q, k, v = make_inputs(2, 8, 2, 32, 300, seed=15)
    seq_lens = torch.tensor([300, 131], dtype=torch.int32, device=DEVICE)
    block_table = None
    if paged:
        k, block_table = to_paged(k, 16, seed=1)
        v, _ = to_paged(v, 16, seed=1)
    n_keys = k.shape[1] * (block_table.shape[1] if paged else 1)
    # 4 samples per program: several pass-2 chunks per head, so the semaphore reduction runs
    plan = plan_decode(batch=2, heads=8, kv_heads=2, head_dim=32, n_keys=n_keys, budget=48, dtype=q.dtype, device=DEVICE,
                       kernel="prop", page_size=16 if paged else None, tuning=Tuning(samples_per_program=4))
    eager, eager_counts = decode(q, k, v, 48, seq_lens=seq_lens, block_table=block_table, seed=6, offset=2, return_counts=True)
    for _ in range(2):  # the second run reuses the workspace's semaphores
        counts = torch.zeros(2, 8, n_keys, dtype=torch.int32, device=DEVICE)
        out = plan.run(q, k, v, seq_lens=seq_lens, block_table=block_table, seed=6, offset=2, counts=counts)
        assert torch.equal(counts, eager_counts)
        torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
        assert not plan.workspace.views["sem"].any()


def edge_case_inputs(n_keys: int, short: int, paged: bool, *, seed: int):
    """``(q, k, v, seq_lens, block_table, planned_keys)`` for 3 sequences × 4 heads (2 KV heads, d = 16): a full one,
    an empty one and one of ``short`` keys whose head 1 is poisoned (a NaN query: NaN output, no counts);
    paged in shuffled pages of 16 keys when ``paged``."""
    q, k, v = make_inputs(3, 4, 2, 16, n_keys, seed=seed, q_scale=3.0)
    q[2, 1, 0] = float("nan")
    seq_lens = torch.tensor([n_keys, 0, short], dtype=torch.int32, device=DEVICE)
    block_table = None
    if paged:
        k, block_table = to_paged(k, 16, seed=2)
        v, _ = to_paged(v, 16, seed=2)
    return q, k, v, seq_lens, block_table, k.shape[1] * (block_table.shape[1] if paged else 1)


@pytest.mark.parametrize(
    "n_keys,block_n,per_program,paged",
    [
        (300, 16, 4, False),  # 19 tiles, several pass-2 chunks per head
        (300, 16, 64, True),  # one chunk per head, paged
        (1030 * 16 + 5, 16, 8, False),  # 1031 tiles: over 1024, so the search walks the tiles in chunks
    ],
)
def test_bisect_and_scan_tile_searches_give_equal_counts(n_keys, block_n, per_program, paged):
    """The binary search over the stored prefix finds the same tile and bounds as comparing every
    sample with every tile: the same counts, bit for bit, also for short, empty and poisoned rows."""
    from santa.kernels import Tuning, plan_decode

    batch, heads, kv_heads, dim, budget = 3, 4, 2, 16, 40
    q, k, v, seq_lens, block_table, planned_keys = edge_case_inputs(n_keys, min(n_keys // 3 + 1, 301), paged, seed=n_keys)
    results = {}
    for search in ("scan", "bisect"):
        tuning = Tuning(block_n=block_n, samples_per_program=per_program, tile_search=search)
        plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=planned_keys, budget=budget,
                           dtype=q.dtype, device=DEVICE, page_size=16 if paged else None, tuning=tuning)
        counts = torch.zeros(batch, heads, planned_keys, dtype=torch.int32, device=DEVICE)
        out = plan.run(q, k, v, seq_lens=seq_lens, block_table=block_table, seed=3, offset=5, counts=counts)
        results[search] = out, counts
    (scan_out, scan_counts), (bisect_out, bisect_counts) = results["scan"], results["bisect"]
    assert torch.equal(bisect_counts, scan_counts)
    assert torch.equal(bisect_out.isnan(), scan_out.isnan()) and bisect_out[2, 1].isnan().all()
    torch.testing.assert_close(bisect_out.nan_to_num(), scan_out.nan_to_num(), rtol=1e-5, atol=1e-6)
    per_head = bisect_counts.sum(-1)  # [B, H]: S for every live head, 0 for the empty sequence and the poisoned head
    assert (per_head[0] == budget).all() and not per_head[1].any() and per_head[2].tolist() == [budget, 0, budget, budget]
    if not paged:
        probs = dense_probs(q[[0, 2]], k[[0, 2]], seq_lens[[0, 2]])[:, [0, 2, 3]]
        rows = bisect_counts[[0, 2]][:, [0, 2, 3]]
        assert_counts_match_systematic(rows, probs, budget, prop_uniforms(batch, heads, 3, 5)[[0, 2]][:, [0, 2, 3]])


def test_pass1_grid_is_cut_past_its_program_cap():
    """Every planned tile gets its own program up to PASS1_PROGRAMS programs in all (every timed table's plan);
    past it, as many programs per (sequence, KV head) as fit, at least one."""
    from santa.kernels import Tuning
    from santa.kernels.layout import PASS1_PROGRAMS, prop_pass1_tiles

    assert prop_pass1_tiles(256, 32 * 8) == 256  # Llama B = 32 × 32k: 65,536 programs, uncut
    assert 32 * 8 * 256 == PASS1_PROGRAMS
    assert prop_pass1_tiles(1024, 64 * 8) == PASS1_PROGRAMS // (64 * 8)  # batch 64 planned for 128k keys: 128
    assert prop_pass1_tiles(19, 6, Tuning(pass1_programs=64)) == 10 and prop_pass1_tiles(19, 6, Tuning(pass1_programs=4)) == 1


@pytest.mark.parametrize("paged", [False, True])
def test_a_cut_pass1_grid_gives_the_samples_of_one_tile_per_program(paged):
    """A plan far past its sequences (pass 1's grid cut, each program looping over tiles t, t + grid, …) gives
    the counts and outputs of one program per tile, bit for bit: full, short, empty and later-starting
    sequences, a poisoned head, contiguous and paged."""
    from santa.kernels import Tuning, plan_decode

    batch, heads, kv_heads, dim, budget, n_keys = 3, 4, 2, 16, 40, 300
    q, k, v, seq_lens, block_table, planned_keys = edge_case_inputs(n_keys, 101, paged, seed=11)
    results = {}
    for cap in (None, 32, 1):  # 19 tiles × 6 rows: uncut; 5 programs per row (tiles t, t+5, …); one program per row
        plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=planned_keys, budget=budget,
                           dtype=q.dtype, device=DEVICE, page_size=16 if paged else None,
                           tuning=Tuning(block_n=16, samples_per_program=8, pass1_programs=cap))
        counts = torch.zeros(batch, heads, planned_keys, dtype=torch.int32, device=DEVICE)
        results[cap] = plan.run(q, k, v, seq_lens=seq_lens, block_table=block_table, seed=3, offset=5, counts=counts), counts
    (out, counts) = results[None]
    assert counts.sum(-1)[0].tolist() == [budget] * heads and not counts[1].any() and counts[2].sum(-1).tolist() == [budget, 0, budget, budget]
    for cap in (32, 1):
        cut_out, cut_counts = results[cap]
        assert torch.equal(cut_counts, counts)
        assert torch.equal(cut_out.isnan(), out.isnan())
        assert torch.equal(cut_out.nan_to_num(), out.nan_to_num())


def test_k_evict_first_is_chosen_by_the_stash_size_and_never_changes_a_sample():
    """The K loads' L2 hint is on only where the stash fits the L2 but is not tiny (the measured rule),
    can be forced either way, and changes no count or output."""
    from santa.kernels import Tuning, plan_decode
    from santa.kernels.layout import prop_k_evict_first

    l2 = 60 << 20
    assert not prop_k_evict_first(4 << 20, l2) and prop_k_evict_first(16 << 20, l2) and prop_k_evict_first(45 << 20, l2)
    assert not prop_k_evict_first(64 << 20, l2) and not prop_k_evict_first(32 << 20, None)
    assert prop_k_evict_first(1, l2, Tuning(k_evict_first=True)) and not prop_k_evict_first(16 << 20, l2, Tuning(k_evict_first=False))
    q, k, v = make_inputs(2, 4, 2, 16, 100, seed=44)
    results = []
    for hint in (False, True):
        plan = plan_decode(batch=2, heads=4, kv_heads=2, head_dim=16, n_keys=100, budget=24, dtype=q.dtype, device=DEVICE,
                           tuning=Tuning(k_evict_first=hint))
        assert plan.k_evict_first is hint
        counts = torch.zeros(2, 4, 100, dtype=torch.int32, device=DEVICE)
        results.append((plan.run(q, k, v, seed=2, counts=counts), counts))
    assert torch.equal(results[0][1], results[1][1]) and torch.equal(results[0][0], results[1][0])
    flash = plan_decode(batch=2, heads=4, kv_heads=2, head_dim=16, n_keys=100, budget=24, dtype=q.dtype, device=DEVICE,
                        kernel="flash", tuning=Tuning(k_evict_first=True, discard_stash=True))
    assert not flash.k_evict_first and not flash.discard_stash  # flash keeps its loads as they are and has no stash
    assert plan.discard_stash is CUDA  # PTX discard on the GPU; the interpreter has none


def test_the_stash_discard_mode_follows_the_chunks_per_head():
    """Where a head has few pass-2 chunks its last chunk drops the whole row; from 8 on every chunk
    drops its own part (the measured rule); with the discard off, or on the CPU, nothing is dropped."""
    from santa.kernels import plan_decode
    from santa.kernels.layout import prop_discard_mode
    from santa.kernels.prop import prop_launchers

    assert [prop_discard_mode(c) for c in (1, 2, 4, 7, 8, 16)] == [1, 1, 1, 1, 2, 2]
    for n_keys, chunks, mode in ((4096, 4, 1), (131072, 16, 2)):
        plan = plan_decode(batch=1, heads=4, kv_heads=2, head_dim=64, n_keys=n_keys, budget=128, dtype=torch.bfloat16,
                           device="cpu")
        assert not plan.discard_stash  # the interpreter has no PTX
        launch = dict(prop_launchers(plan, has_seq_lens=False, offset_in_memory=False, return_counts=False))["pass2"]
        assert launch.grid[0] == chunks and launch.meta["DISCARD"] == 0
        plan.discard_stash = True  # as on sm_80+
        launch = dict(prop_launchers(plan, has_seq_lens=False, offset_in_memory=False, return_counts=False))["pass2"]
        assert launch.meta["DISCARD"] == mode


def test_stash_rows_are_whole_l2_lines_for_every_tile_size():
    """discard.global.L2 takes 128-byte aligned lines: every stash row starts on one and spans whole
    lines, also for 16-key tiles and an odd tile count (whose keys alone would end mid-line)."""
    from santa.kernels import Tuning
    from santa.kernels.layout import WorkspaceKey, workspace_regions, workspace_strides

    for block_n, n_keys in ((16, 16 * 7 - 3), (32, 100), (128, 1000), (64, 4097)):
        key = WorkspaceKey.of(kernel="prop", batch=3, heads=5, head_dim=64, n_keys=n_keys, budget=64, device="cpu",
                              tuning=Tuning(block_n=block_n))
        stride = workspace_strides(key)[0]
        start = {name: offset for name, _, _, offset in workspace_regions(key)}["stash"]
        assert stride % 32 == 0 and stride >= -(-n_keys // block_n) * block_n and start % 128 == 0


def test_cpu_fallback_without_interpreter_computes_the_same_estimator(monkeypatch):
    q, k, v = make_inputs(2, 4, 2, 32, 100, seed=10)
    q, k, v = q.cpu(), k.cpu(), v.cpu()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for kernel, ref in (("prop", prop_reference), ("flash", None)):
        out, counts = decode(q, k, v, 24, kernel=kernel, seed=4, offset=1, return_counts=True)
        if ref is not None:
            ref_out, ref_counts = ref(q, k, v, 24, seed=4, offset=1)
        else:
            ref_out, ref_counts = flash_reference(q, k, v, 24, tile=flash_tile(32), seed=4, offset=1)
        assert torch.equal(counts.long(), ref_counts) and torch.equal(out, ref_out)


@pytest.mark.parametrize(
    "change,error,name",
    [
        (dict(q="not a tensor"), TypeError, "q"),
        (dict(q=torch.zeros(2, 4, 32, dtype=torch.int32)), TypeError, "q"),
        (dict(k_cache=torch.zeros(2, 10, 3, 32), v_cache=torch.zeros(2, 10, 3, 32)), ValueError, "H_kv"),
        (dict(budget=0), ValueError, "budget"),
        (dict(kernel="fast"), ValueError, "kernel"),
        (dict(kv_layout="NDH"), ValueError, "kv_layout"),
        (dict(seq_lens=torch.tensor([5, 5])), TypeError, "seq_lens"),
        (dict(block_table=torch.zeros(2, 3, dtype=torch.int32)), ValueError, "seq_lens"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(offset=1.5), TypeError, "offset"),
        (dict(out=torch.zeros(2, 4, 16)), ValueError, "out"),
        (dict(v_cache=torch.zeros(2, 10, 2, 32, dtype=torch.float16)), TypeError, "v_cache"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(change, error, name):
    args = dict(q=torch.zeros(2, 4, 32), k_cache=torch.zeros(2, 10, 2, 32), v_cache=torch.zeros(2, 10, 2, 32), budget=8)
    kwargs = {}
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(error, match=name):
        decode(args["q"], args["k_cache"], args["v_cache"], args["budget"], **kwargs)


def test_philox_emulation_reproduces_the_kernels_uniforms():
    """The numpy Philox in reference.py is bit-exact with the kernels' tl.philox draw."""
    from santa.kernels._common import kernel_uniforms

    offset, seed = 2**40 + 12345, 2**35 + 77
    rows = torch.arange(300, device=DEVICE)
    got = kernel_uniforms(seed, offset, rows, rows % 5)
    expected = philox_uniforms(seed, offset, rows.cpu(), rows.cpu() % 5)
    assert torch.equal(got.cpu(), expected)
    assert 0.4 < float(expected.mean()) < 0.6 and bool(((expected >= 0) & (expected < 1)).all())


# --------------------------------------------------------------------------- CUDA only


@needs_cuda
def test_cuda_graph_replay_matches_eager_and_advances_with_device_offset():
    q, k, v = make_inputs(2, 32, 8, 128, 5000, torch.bfloat16, seed=13)
    seq_lens = torch.tensor([5000, 3001], dtype=torch.int32, device=DEVICE)
    for kernel, budget in (("prop", 128), ("flash", 1024)):
        ws = make_workspace(q, k, budget, kernel=kernel)
        out = torch.empty_like(q)
        offset = torch.tensor([0], dtype=torch.int64, device=DEVICE)
        decode(q, k, v, budget, kernel=kernel, seq_lens=seq_lens, offset=offset, out=out, workspace=ws)  # compile
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            decode(q, k, v, budget, kernel=kernel, seq_lens=seq_lens, offset=offset, out=out, workspace=ws)
        for step in (3, 4):
            offset.fill_(step)
            graph.replay()
            # the same workspace: the Triton kernels (without one, a Hopper GPU runs prop in one launch, whose samples
            # may differ by float32 CDF rounding: tests/kernels/test_one_launch.py replays that one)
            eager = decode(q, k, v, budget, kernel=kernel, seq_lens=seq_lens, offset=step, workspace=ws)
            torch.cuda.synchronize()
            assert torch.equal(out, eager), (kernel, step)
        first = out.clone()
        offset.fill_(3)
        graph.replay()
        assert not torch.equal(first, out)


@needs_cuda
@pytest.mark.parametrize("n_keys", [20000, 40000])  # the scan and the bisect tile search
@pytest.mark.parametrize("per_program", [None, 128])  # several chunks per head (each drops its part), and one
def test_discarding_the_stash_changes_no_sample_across_calls(per_program, n_keys):
    """Pass 2 drops from L2 the stash lines no other chunk of the row reads; the next call rewrites them.
    Back-to-back calls on different queries (so a line dropped too early would read another call's
    scores back from DRAM) give the counts and outputs of calls without the discard."""
    from santa.kernels import Tuning, plan_decode

    _, k, v = make_inputs(3, 14, 2, 64, n_keys, torch.bfloat16, seed=23, q_scale=3.0)
    queries = [make_inputs(3, 14, 2, 64, 16, torch.bfloat16, seed=30 + step, q_scale=3.0)[0] for step in range(4)]
    seq_lens = torch.tensor([n_keys, n_keys // 2 - 1, 1], dtype=torch.int32, device=DEVICE)
    kwargs = dict(batch=3, heads=14, kv_heads=2, head_dim=64, n_keys=n_keys, budget=128, dtype=k.dtype, device=DEVICE)
    runs = {}
    for discard in (False, True):
        plan = plan_decode(**kwargs, tuning=Tuning(discard_stash=discard, samples_per_program=per_program))
        assert plan.discard_stash is discard
        runs[discard] = []
        for step, q in enumerate(queries):
            counts = torch.zeros(3, 14, n_keys, dtype=torch.int32, device=DEVICE)
            runs[discard].append((plan.run(q, k, v, seq_lens=seq_lens, seed=4, offset=step, counts=counts), counts))
    torch.cuda.synchronize()
    for (out, counts), (want, want_counts) in zip(runs[True], runs[False], strict=True):
        assert torch.equal(counts, want_counts) and torch.equal(out, want)


@needs_cuda
def test_large_gpu_shapes_match_the_reference():
    q, k, v = make_inputs(1, 32, 8, 128, 32768, torch.bfloat16, seed=14, q_scale=4.0)
    out, counts = decode(q, k, v, 128, seed=1, return_counts=True)
    assert_counts_match_systematic(counts, dense_probs(q, k), 128, prop_uniforms(1, 32, 1, 0))
    ref_out, ref_counts = prop_reference(q, k, v, 128, seed=1)
    same = (counts.long() == ref_counts).all(-1)
    torch.testing.assert_close(out[same].float(), ref_out[same].float(), rtol=1e-2, atol=1e-2)


@needs_cuda
def test_bisect_equals_scan_on_long_gpu_sequences():
    from santa.kernels import Tuning, plan_decode

    q, k, v = make_inputs(2, 32, 8, 128, 131072, torch.bfloat16, seed=15, q_scale=4.0)
    seq_lens = torch.tensor([131072, 70001], dtype=torch.int32, device=DEVICE)
    counts = {}
    for search in ("scan", "bisect"):
        plan = plan_decode(batch=2, heads=32, kv_heads=8, head_dim=128, n_keys=131072, budget=128, dtype=q.dtype,
                           device=DEVICE, tuning=Tuning(tile_search=search))
        counts[search] = torch.zeros(2, 32, 131072, dtype=torch.int32, device=DEVICE)
        plan.run(q, k, v, seq_lens=seq_lens, seed=2, counts=counts[search])
    assert torch.equal(counts["scan"], counts["bisect"])
