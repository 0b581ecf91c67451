"""santa's decode on vLLM's paged cache layout (santa.vllm.decode; no vLLM needed): the packed FlashAttention
cache splits into strided K/V views that give what santa.decode gives on contiguous copies, keyed on the layer
and each token's position; fp8 caches stored as uint8; a padded row (seq_len 0) gives 0."""

import pytest
import torch

from helpers import DEVICE, make_inputs, to_paged
from santa import rng
from santa.kernels import decode
from santa.vllm.decode import PagedDecoder, split_kv_cache

BLOCK = 16


def packed(k_pages: torch.Tensor, v_pages: torch.Tensor) -> torch.Tensor:
    """K and V pages [nb, bs, H_kv, D] as vLLM 0.26's FlashAttention cache: physical [nb, bs, H_kv, 2D],
    logical (nb, H_kv, bs, 2D)."""
    return torch.cat([k_pages, v_pages], dim=-1).permute(0, 2, 1, 3)


def decoder(kernel="prop", kv_dtype=torch.float32, max_batch=4, max_keys=256, budget=24, seed=9, gated=False):
    return PagedDecoder(heads=8, kv_heads=2, head_dim=32, block_size=BLOCK, max_keys=max_keys, max_batch=max_batch,
                        budget=budget, kernel=kernel, seed=seed, dtype=torch.float32, kv_dtype=kv_dtype, device=DEVICE,
                        gated=gated)


def test_split_gives_strided_views_of_the_packed_cache():
    k_pages, v_pages = torch.randn(2, 5, BLOCK, 2, 32).unbind(0)
    k, v = split_kv_cache(packed(k_pages, v_pages), 32)
    assert torch.equal(k, k_pages) and torch.equal(v, v_pages) and not k.is_contiguous()
    with pytest.raises(ValueError, match="kv_cache must be"):
        split_kv_cache(packed(k_pages, v_pages), 16)


@pytest.mark.parametrize("kernel", ["prop", "flash"])
def test_a_decode_step_equals_santa_decode_on_contiguous_pages(kernel):
    q, k, v = make_inputs(3, 8, 2, 32, 200, seed=31)
    k_pages, table = to_paged(k, BLOCK, seed=2)
    v_pages, _ = to_paged(v, BLOCK, seed=2)
    seq_lens = torch.tensor([200, 77, 0], dtype=torch.int32, device=DEVICE)  # the last row: a CUDA-graph pad
    run = decoder(kernel)
    out = torch.full_like(q, float("nan"))
    run.run(q, packed(k_pages, v_pages), seq_lens=seq_lens, block_table=table, layer=3, scale=0.2, out=out)
    want = decode(q, k_pages.contiguous(), v_pages.contiguous(), 24, kernel=kernel, seq_lens=seq_lens, block_table=table,
                  scale=0.2, seed=rng.layer_key(9, 3), positions=(seq_lens - 1).clamp_min(0))
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    # positions computed once per step (the metadata builder's buffer) give the same step
    positions = run.positions(seq_lens)
    assert positions.tolist() == [199, 76, 0]
    again = run.run(q, packed(k_pages, v_pages), seq_lens=seq_lens, block_table=table, layer=3, scale=0.2,
                    out=torch.empty_like(q), positions=positions)
    assert torch.equal(again, out)
    # another layer draws other samples; a batch of one draws what that sequence drew in the batch
    other = run.run(q, packed(k_pages, v_pages), seq_lens=seq_lens, block_table=table, layer=4, scale=0.2, out=torch.empty_like(q))
    assert not torch.equal(other[:2], out[:2])
    alone = run.run(q[1:2], packed(k_pages, v_pages), seq_lens=seq_lens[1:2], block_table=table[1:2], layer=3, scale=0.2,
                    out=torch.empty_like(q[1:2]))
    torch.testing.assert_close(alone[0], out[1], rtol=1e-5, atol=1e-6)


def test_a_block_table_wider_than_the_model_is_read_through_a_column_slice():
    """vLLM's V2 runner rounds the table's width up (to 128 keys): the backend passes its first columns, a strided view."""
    q, k, v = make_inputs(2, 8, 2, 32, 96, seed=33)
    k_pages, table = to_paged(k, BLOCK, seed=4)
    v_pages, _ = to_paged(v, BLOCK, seed=4)
    wide = torch.cat([table, torch.zeros(2, 5, dtype=torch.int32, device=DEVICE)], dim=1)  # 5 unused columns
    seq_lens = torch.tensor([96, 50], dtype=torch.int32, device=DEVICE)
    run = decoder(max_keys=96)
    sliced = run.run(q, packed(k_pages, v_pages), seq_lens=seq_lens, block_table=wide[:, :6], layer=1, scale=0.2,
                     out=torch.empty_like(q))
    plain = run.run(q, packed(k_pages, v_pages), seq_lens=seq_lens, block_table=table, layer=1, scale=0.2,
                    out=torch.empty_like(q))
    assert not wide[:, :6].is_contiguous() and torch.equal(sliced, plain)


def test_an_fp8_cache_stored_as_uint8_is_read_with_its_scales():
    q, k, v = make_inputs(2, 8, 2, 32, 120, seed=32)
    k_scale, v_scale = torch.tensor(0.02), torch.tensor(0.01)  # vLLM's 0-d layer scales
    k8, v8 = (k / k_scale).to(torch.float8_e4m3fn), (v / v_scale).to(torch.float8_e4m3fn)
    k_pages, table = to_paged(k8.view(torch.uint8), BLOCK, seed=3)
    v_pages, _ = to_paged(v8.view(torch.uint8), BLOCK, seed=3)
    seq_lens = torch.tensor([120, 64], dtype=torch.int32, device=DEVICE)
    out = decoder(kv_dtype=torch.float8_e4m3fn).run(
        q, packed(k_pages, v_pages), seq_lens=seq_lens, block_table=table, layer=0, scale=0.18, out=torch.empty_like(q),
        k_scale=k_scale.to(DEVICE), v_scale=v_scale.to(DEVICE))
    want = decode(q, k_pages.view(torch.float8_e4m3fn).contiguous(), v_pages.view(torch.float8_e4m3fn).contiguous(), 24,
                  seq_lens=seq_lens, block_table=table, scale=0.18, seed=rng.layer_key(9, 0),
                  positions=seq_lens - 1, k_scale=float(k_scale), v_scale=float(v_scale))
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


def test_a_batch_beyond_the_workspace_is_refused():
    q, _, _ = make_inputs(3, 8, 2, 32, 8, seed=1)
    cache = torch.zeros(4, 2, BLOCK, 64, device=DEVICE)
    with pytest.raises(ValueError, match="exceeds what santa's workspace was sized for"):
        decoder(max_batch=2).run(q, cache, seq_lens=torch.ones(3, dtype=torch.int32, device=DEVICE),
                                 block_table=torch.zeros(3, 1, dtype=torch.int32, device=DEVICE), layer=0, scale=0.2,
                                 out=torch.empty_like(q))


def test_the_workspace_is_allocated_once_and_shared_by_every_batch_size():
    run = decoder(max_batch=4, max_keys=256)
    run.allocate()
    scratch = run._scratch
    assert scratch.numel() == run.workspace_nbytes() and run._semaphores.numel() == 4 * 8
    for batch in (1, 3):
        _, workspace = run.plan(batch, 256, 0.2)
        assert workspace.buffer.data_ptr() == scratch.data_ptr()
    run.allocate()
    assert run._scratch is scratch


def test_prepare_makes_the_captured_batch_sizes_plans_before_any_capture():
    """vLLM captures decode graphs per batch size without an eager run first (0 warm-ups by default): the builder
    makes those plans at start-up, so that no plan is first made inside a capture (where the one launch cannot be)."""
    santa = decoder(max_batch=4)
    santa.allocate()
    assert santa.prepare([1, 2, 4, 8, 2], 32**-0.5) == 3  # past max_batch: never a decode batch of santa's
    assert sorted(santa._plans) == [(b, 256, 32**-0.5) for b in (1, 2, 4)]
    assert santa.prepare([1, 2], 32**-0.5) == 0
    assert santa.one_launch_nbytes() == 0  # float32 on the CPU: no one-launch plan, no buffers
    # an eager step's decode rows are padded to the next prepared size; past the largest, their own count
    assert [santa.padded_batch(b) for b in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, 5]


def test_a_gated_decoders_calls_outside_a_graph_pass_its_open_gate(monkeypatch):
    """A gated decoder's graphs captured its plans' gated kernels (a Triton plan's GATED variant): its calls outside a
    graph (mixed steps) pass an open gate, so they launch those same kernels and none is compiled while a server runs;
    a given gate is passed as it is, and an ungated decoder passes none."""
    from santa.kernels import DecodePlan

    seen = []
    monkeypatch.setattr(DecodePlan, "run", lambda self, *args, enabled=None, **kwargs: seen.append(enabled))
    q, k, v = make_inputs(2, 8, 2, 32, 40, seed=3)
    k_pages, table = to_paged(k, BLOCK, seed=3)
    v_pages, _ = to_paged(v, BLOCK, seed=3)
    lens = torch.tensor([40, 30], dtype=torch.int32, device=DEVICE)
    closed = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    for gated, enabled in ((True, None), (True, closed), (False, None)):
        run = decoder(max_batch=4, gated=gated)
        run.run(q, packed(k_pages, v_pages), seq_lens=lens, block_table=table, layer=0, scale=0.2, out=torch.empty_like(q),
                enabled=enabled)
    assert seen[0].tolist() == [1] and seen[1] is closed and seen[2] is None


def test_an_error_target_decodes_as_santa_decode_does():
    """vLLM's decoder with an error target (SANTA_VLLM_ERROR_TARGET): the budgets of santa.decode on the same pages."""
    q, k, v = make_inputs(2, 8, 2, 32, 200, seed=33)
    v = v + 1.0  # values around a shared mean: ‖o‖ well above the noise, so the heads ask for budgets below the cap
    k_pages, table = to_paged(k, BLOCK, seed=3)
    v_pages, _ = to_paged(v, BLOCK, seed=3)
    seq_lens = torch.tensor([200, 150], dtype=torch.int32, device=DEVICE)
    run = PagedDecoder(heads=8, kv_heads=2, head_dim=32, block_size=BLOCK, max_keys=256, max_batch=4, budget=64,
                       kernel="prop", seed=9, dtype=torch.float32, kv_dtype=torch.float32, device=DEVICE, error_target=0.3)
    out = run.run(q, packed(k_pages, v_pages), seq_lens=seq_lens, block_table=table, layer=2, scale=0.2, out=torch.empty_like(q))
    want = decode(q, k_pages.contiguous(), v_pages.contiguous(), 64, seq_lens=seq_lens, block_table=table, scale=0.2,
                  seed=rng.layer_key(9, 2), positions=seq_lens - 1, error_target=0.3)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    fixed = decode(q, k_pages.contiguous(), v_pages.contiguous(), 64, seq_lens=seq_lens, block_table=table, scale=0.2,
                   seed=rng.layer_key(9, 2), positions=seq_lens - 1)
    assert not torch.equal(out, fixed)  # the heads drew their own budgets, not 64 each


def test_a_gated_decoder_cuts_only_the_pass_1_grids_that_would_be_cut_anyway():
    """santa.vllm's gated decoder (short steps close santa's launch inside a captured graph) gives a Triton plan whose
    default pass-1 grid is past layout.PASS1_PROGRAMS a grid of GATED_PASS1_PROGRAMS programs (a closed launch costs
    its grid); other plans, ungated decoders, flash and a tuning that sets the grid keep theirs."""
    from santa.kernels import Tuning
    from santa.vllm import decode as paged

    def llama(**change):
        return PagedDecoder(**{**dict(heads=32, kv_heads=8, head_dim=128, block_size=BLOCK, max_keys=131072, max_batch=256,
                                      budget=128, kernel="prop", seed=0, dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                                      device="cpu", gated=True), **change})

    assert llama().tuning_for(64, 131072) == Tuning(pass1_programs=paged.GATED_PASS1_PROGRAMS)  # 64·8·1024 programs
    assert llama().tuning_for(8, 131072) is None  # 8·8·1024 = 2^16: not cut
    assert llama().tuning_for(64, 16384) is None  # 64·8·128 programs
    assert llama(gated=False).tuning_for(64, 131072) is None
    assert llama(kernel="flash").tuning_for(64, 131072) is None
    mine = Tuning(pass1_programs=1 << 14)
    assert llama(tuning=mine).tuning_for(64, 131072) is mine
    assert llama(tuning=Tuning(one_launch=False)).tuning_for(64, 131072) == Tuning(one_launch=False, pass1_programs=4096)
    # never under 8 programs per (sequence, KV head): 512 × 8 rows take 8 × 4096; past 8,192 rows the default cut does
    assert llama(max_batch=2048).tuning_for(512, 131072) == Tuning(pass1_programs=8 * 4096)
    assert llama(max_batch=2048).tuning_for(1024, 131072) is None
    with pytest.raises(ValueError, match="Tuning.block_n must be None or a power of two"):
        llama(tuning=Tuning(block_n=0)).tuning_for(64, 131072)


def test_a_gated_decoders_cut_grid_draws_what_the_full_grid_draws(monkeypatch):
    """The cut grid only loops each program over more tiles: the same samples and output (a small grid here, its
    limits lowered so that the interpreter's shapes cross them)."""
    from santa.kernels import Tuning, layout
    from santa.vllm import decode as paged

    q, k, v = make_inputs(3, 8, 2, 32, 200, seed=33)
    k_pages, table = to_paged(k, BLOCK, seed=4)
    v_pages, _ = to_paged(v, BLOCK, seed=4)
    seq_lens = torch.tensor([200, 130, 9], dtype=torch.int32, device=DEVICE)
    # 16-key tiles: 3 · 2 rows × 16 tiles = 96 programs by default, past a limit lowered to 80 (13 per row), so the gated
    # plan takes max(GATED_PASS1_PROGRAMS, 8 · next_pow2(6)) = 64 programs, 10 per row looping over 16 tiles; the
    # ungated one is given every tile's program (a limit past the grid)
    monkeypatch.setattr(layout, "PASS1_PROGRAMS", 80)
    monkeypatch.setattr(paged, "GATED_PASS1_PROGRAMS", 2)
    full, tiled = Tuning(block_n=16, pass1_programs=1 << 30), Tuning(block_n=16)
    outs = []
    for gated in (False, True):
        run = PagedDecoder(heads=8, kv_heads=2, head_dim=32, block_size=BLOCK, max_keys=256, max_batch=4, budget=24,
                           kernel="prop", seed=9, dtype=torch.float32, kv_dtype=torch.float32, device=DEVICE, gated=gated,
                           tuning=tiled if gated else full)
        assert run.tuning_for(3, 256) == (Tuning(block_n=16, pass1_programs=64) if gated else full)
        outs.append(run.run(q, packed(k_pages, v_pages), seq_lens=seq_lens, block_table=table, layer=1, scale=0.2,
                            out=torch.empty_like(q)))
    assert torch.equal(outs[0], outs[1])
