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
