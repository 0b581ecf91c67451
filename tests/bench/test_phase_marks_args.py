"""phase_marks.py's ``--paged`` cases: MODEL:BxN of paged_ab's models, anything else named in one argparse error."""

import argparse

import pytest
from benchmarks.kernels.phase_marks import paged_case


def test_a_paged_case_names_a_model_a_batch_and_keys():
    assert paged_case("d64-g2:16x32768") == ("d64-g2", 16, 32768)
    assert paged_case("llama:64x2048") == ("llama", 64, 2048)


@pytest.mark.parametrize("text", ["bogus", "gpt:16x32768", "llama:16", "llama:0x2048", "llama:16x-5", "llama:x2048"])
def test_anything_else_is_refused_by_name(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected MODEL:BxN"):
        paged_case(text)


def test_phase_medians_skip_a_mark_no_slot_recorded():
    """A live launch records no mark 6: its phase 5 runs to mark 7 and phase 6 is None (before, 0 − t5 and t7 − 0 gave
    ±1.8e18 ns); slots without work (all zeros) are left out."""
    import torch
    from benchmarks.kernels.phase_marks import phase_medians

    base = 1_796_000_000_000_000_000
    work = torch.tensor([0, 10, 13, 14, 16, 17, 0, 25]) + base
    later = work + 5
    work[6] = later[6] = 0  # no slot recorded mark 6
    clocks = torch.stack([work, torch.zeros(8, dtype=torch.int64), later]).unsqueeze(0).repeat(3, 1, 1)
    out = phase_medians(clocks)
    assert out["phase_med_ns"] == [10, 3, 1, 2, 1, 8, None] and out["absent_marks"] == [6]
    assert out["span_ns"] == 30.0
    full = torch.arange(8, dtype=torch.int64).mul(2).add(base).expand(2, 1, 8)
    assert phase_medians(full) == {"phase_med_ns": [2] * 7, "span_ns": 14.0}


def test_phase_medians_count_a_mark_some_slots_skipped_as_zero():
    """Covered sequences in a live launch record mark 6 and sampled ones do not: a skipping slot's phase 5 runs to its
    mark 7 and its phase 6 is 0, so no ±1.8e18 enters the medians."""
    import torch
    from benchmarks.kernels.phase_marks import phase_medians

    base = 1_796_000_000_000_000_000
    covered = torch.tensor([0, 10, 13, 14, 16, 17, 20, 25]) + base
    sampled = covered.clone()
    sampled[6] = 0
    out = phase_medians(torch.stack([covered, sampled, sampled]).unsqueeze(0))
    assert out["phase_med_ns"] == [10, 3, 1, 2, 1, 8, 0] and "absent_marks" not in out
