"""covered_cost.py's float32 reference: attention over the table's pages equals dense attention on the same keys laid
out contiguously (what the covered arm's error is measured against)."""

import torch
from benchmarks.kernels.covered_cost import CASES, exact_attention
from benchmarks.kernels.paged_ab import MODELS, PAGE


def test_exact_attention_reads_the_pages_the_table_names():
    heads, kv_heads, dim = MODELS["qwen"]
    torch.manual_seed(0)
    batch, pages_per_seq = 2, 3
    packed = torch.randn(batch * pages_per_seq, PAGE, kv_heads, 2 * dim)
    table = torch.randperm(batch * pages_per_seq).int().reshape(batch, pages_per_seq)
    q = torch.randn(batch, heads, dim)
    out = exact_attention("qwen", q, packed, table)
    for b in range(batch):
        rows = packed[table[b].long()].reshape(pages_per_seq * PAGE, kv_heads, 2 * dim)
        k, v = rows[..., :dim].transpose(0, 1), rows[..., dim:].transpose(0, 1)  # [H_kv, n, D]
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[b].reshape(kv_heads, heads // kv_heads, dim), k, v)  # each KV head's group of query heads
        torch.testing.assert_close(out[b], expected.reshape(heads, dim), atol=1e-5, rtol=1e-5)


def test_the_cases_are_the_short_grid_below_4k():
    assert sorted({(n, batch) for _, batch, n in CASES}) == [(n, b) for n in (512, 1024, 2048) for b in (1, 16, 64, 256)]
    assert {model for model, *_ in CASES} == {"llama", "qwen"}
