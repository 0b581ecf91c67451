"""santa.kernels.cache_write: one decode step's K/V into an fp8 cache, against santa.model's torch spelling
(quantise, then an indexed copy): the same bytes, on the CPU (interpreter) and the GPU."""

import pytest
import torch

from helpers import DEVICE
from santa.model import FP8, quantise

triton = pytest.importorskip("triton")  # the interpreter's setup: tests/kernels/conftest.py


def torch_write(k_val, v_val, k_scale, v_scale, k_cache, v_cache, positions):
    rows = torch.arange(k_val.shape[0], device=k_val.device)
    for val, scale, cache in ((k_val, k_scale, k_cache), (v_val, v_scale, v_cache)):
        cache.view(torch.uint8).index_put_((rows, positions), quantise(val, scale).view(torch.uint8)[:, 0])


@pytest.mark.parametrize("dim", [64, 128, 80])
@pytest.mark.parametrize("shared_position", [False, True])
def test_the_fused_write_stores_torchs_bytes_at_each_sequences_position(dim, shared_position):
    from santa.kernels.cache_write import fp8_decode_write

    g = torch.Generator().manual_seed(dim)
    batch, kv_heads, max_len = 3, 2, 12
    k_val = (torch.randn(batch, 1, kv_heads, dim, generator=g) * 3).to(torch.bfloat16).to(DEVICE)
    v_val = torch.randn(batch, 1, kv_heads, dim, generator=g).to(torch.bfloat16).to(DEVICE)
    k_val[0, 0, 1, :4] = torch.tensor([1e4, -1e4, float("nan"), 0.0])  # saturation both ways, NaN, zero
    k_scale = torch.tensor([0.01, 0.02], device=DEVICE)
    v_scale = torch.tensor([0.005, 0.03], device=DEVICE)
    positions = torch.tensor([5] if shared_position else [5, 0, 11], device=DEVICE)
    before = torch.randn(batch, max_len, kv_heads, dim, generator=g).to(FP8).to(DEVICE)  # what the other slots hold
    want_k, want_v, got_k, got_v = (before.clone() for _ in range(4))
    torch_write(k_val, v_val, k_scale, v_scale, want_k, want_v, positions.expand(batch))
    fp8_decode_write(k_val, v_val, k_scale=k_scale, v_scale=v_scale, k_cache=got_k, v_cache=got_v, positions=positions)
    assert torch.equal(got_k.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(got_v.view(torch.uint8), want_v.view(torch.uint8))
    assert torch.isnan(got_k.float()[0, 5, 1, 2]) and got_k.float()[0, 5, 1, :2].tolist() == [448.0, -448.0]


def test_a_position_past_the_cache_writes_nothing():
    from santa.kernels.cache_write import fp8_decode_write

    k_val = torch.ones(1, 1, 1, 16, dtype=torch.bfloat16, device=DEVICE)
    cache = torch.zeros(1, 4, 1, 16, dtype=FP8, device=DEVICE)
    other = torch.zeros_like(cache)
    one = torch.ones(1, device=DEVICE)
    fp8_decode_write(k_val, k_val, k_scale=one, v_scale=one, k_cache=cache, v_cache=other,
                     positions=torch.tensor([4], device=DEVICE))
    assert not cache.view(torch.uint8).any() and not other.view(torch.uint8).any()


def test_every_e4m3_rounding_case_matches_torch():
    """Ties, binade edges, subnormals, saturation, signed zeros and NaN: 200k values over the whole range."""
    from santa.kernels.cache_write import fp8_decode_write

    g = torch.Generator().manual_seed(7)
    codes = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    codes = codes[torch.isfinite(codes)]
    midpoints = (codes.sort().values[1:] + codes.sort().values[:-1]) / 2  # exact ties between neighbours
    values = torch.cat([codes, midpoints, torch.randn(100_000, generator=g) * 50, torch.rand(50_000, generator=g) * 0.03,
                        torch.tensor([1e6, -1e6, float("inf"), -float("inf"), float("nan"), -0.0, 0.0, 447.9, 464.0, 2**-10])])
    n = -(-values.numel() // 128) * 128
    x = torch.nn.functional.pad(values, (0, n - values.numel())).reshape(n // 128, 1, 1, 128).to(DEVICE)  # float32 K/V
    one = torch.ones(1, device=DEVICE)
    got = torch.zeros(n // 128, 1, 1, 128, dtype=FP8, device=DEVICE)
    fp8_decode_write(x, x, k_scale=one, v_scale=one, k_cache=got, v_cache=torch.zeros_like(got),
                     positions=torch.zeros(1, dtype=torch.long, device=DEVICE))
    want = quantise(x, one)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
