"""Unique keys (with the GQA union) and the paper's value-stage accounting."""

import pytest
import torch

import santa
from santa.stats import ADD_PJ, MULT_PJ, prefill_cost


def test_unique_keys_counts_distinct_sampled_keys():
    counts = torch.tensor([[3, 0, 1, 0], [0, 0, 0, 4]])
    assert santa.unique_keys(counts).tolist() == [2, 1]


def test_unique_keys_merges_query_heads_of_a_group():
    counts = torch.tensor([[[1, 0, 0, 2], [0, 0, 3, 0], [0, 1, 0, 0], [0, 1, 0, 0]]])  # [B=1, H=4, n=4]
    assert santa.unique_keys(counts, group_size=2).tolist() == [[3, 1]]
    with pytest.raises(ValueError, match="group_size"):
        santa.unique_keys(counts, group_size=3)


def test_unique_keys_never_exceed_budget_or_keys():
    probs = torch.softmax(torch.randn(10, 300, generator=torch.Generator().manual_seed(0)), -1)
    counts = santa.sample_counts(probs, 64, "iid", generator=torch.Generator().manual_seed(1))
    unique = santa.unique_keys(counts)
    assert (unique <= 64).all() and (unique >= 1).all()


def test_value_stage_cost_follows_table_8():
    dense = santa.value_stage_cost(4096, 128, method="dense")
    assert (dense.adds, dense.mults, dense.value_reads, dense.writes) == (4096 * 128,) * 3 + (128,)
    sampled = santa.value_stage_cost(4096, 128, method="santa", budget=64)
    assert (sampled.adds, sampled.mults, sampled.value_reads) == (64 * 128, 128, 64 * 128)
    assert santa.value_stage_cost(4096, 128, method="santa", budget=64, unique_rows=40).value_reads == 40 * 128
    topk = santa.value_stage_cost(4096, 128, method="topk", budget=64)
    assert (topk.adds, topk.mults) == (64 * 128, 64 * 128)


def test_energy_uses_horowitz_costs():
    cost = santa.value_stage_cost(1000, 1, method="santa", budget=10)
    assert cost.energy_pj == pytest.approx(10 * ADD_PJ + 1 * MULT_PJ)
    # the paper's comparison at k = S: top-k ≈ 4.6k pJ, SANTA ≈ 0.9S pJ per output element (+ the 1/S)
    topk = santa.value_stage_cost(1000, 1, method="topk", budget=10)
    assert topk.energy_pj == pytest.approx(10 * 4.6)


def test_prefill_cost_scales_with_queries():
    cost = prefill_cost(8, 100, 4, method="santa", budget=5)
    assert cost["score"]["adds"] == 8 * 100 * 4
    assert cost["value"]["adds"] == 8 * 5 * 4 and cost["value"]["mults"] == 8 * 4


def test_bad_accounting_arguments_raise():
    with pytest.raises(ValueError, match="method"):
        santa.value_stage_cost(10, 4, method="sparse", budget=2)
    with pytest.raises(TypeError, match="budget"):
        santa.value_stage_cost(10, 4, method="santa")
