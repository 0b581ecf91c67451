"""Graders on fixed strings, and the bootstrap on known cases."""

import numpy as np
import pytest

from santa.eval.grading import (
    gsm8k_extract,
    mmlu_extract,
    multivalue_score,
    numbers_equal,
    string_match_all,
    word_set_score,
)
from santa.eval.report import bootstrap_ci

GOLD = ("1111111", "2222222", "3333333", "4444444")


def test_multivalue_takes_the_first_four_unique_integers():
    assert multivalue_score("1111111, 2222222, 3333333 and 4444444", GOLD) == 1.0
    assert multivalue_score("1111111, 1111111, 2222222", GOLD) == 0.5
    # a wrong number among the first four costs its quarter, later right ones do not count
    assert multivalue_score("1111111 9 8 7 2222222", GOLD) == 0.25
    assert multivalue_score("no numbers", GOLD) == 0.0


def test_word_set_score_is_partial_and_case_insensitive():
    assert word_set_score("Gadobi, rica and MITABO", ("gadobi", "rica", "mitabo")) == 1.0
    assert word_set_score("gadobis rica", ("gadobi", "rica", "mitabo")) == pytest.approx(1 / 3)


def test_string_match_all_counts_each_variable():
    assert string_match_all("ABCDE, fghij", ("ABCDE", "FGHIJ", "KLMNO")) == pytest.approx(2 / 3)


def test_gsm8k_reads_the_last_line_then_the_last_25_tokens():
    assert gsm8k_extract("Step 1: 3 + 4 = 7\nSo she pays\n1,234") == "1,234"
    assert gsm8k_extract("The answer is -5 apples\n") == "-5"
    assert gsm8k_extract("total 18 dollars\nDone.") == "18"  # last line has no number: final 25 tokens
    assert gsm8k_extract("") is None


def test_gsm8k_reads_the_last_boxed_number_first():
    qwen_style = "100 - 20 = 80\nThe final answer is:\n\\[\n\\boxed{80}\n\\]"
    assert gsm8k_extract(qwen_style) == "80"  # the last-line rule alone would find no number, then 100
    assert gsm8k_extract("first \\boxed{3}, corrected: \\boxed{ $1,250 }\nDone") == "1,250"
    assert gsm8k_extract("no box here\n42") == "42"


def test_numeric_compare_normalises_commas_and_decimals():
    assert numbers_equal("1,234", "1234")
    assert numbers_equal("18", "18.0")
    assert not numbers_equal("17", "18")
    assert not numbers_equal(None, "18")


def test_mmlu_reads_the_letter_after_the_last_newline():
    assert mmlu_extract("Reasoning about A and B.\nC") == "C"
    assert mmlu_extract("the answer is (b)") == "B"
    assert mmlu_extract("The letter is D\nAnswer:") == "D"  # no letter on the last line: last 10 tokens
    assert mmlu_extract("none here\nnothing") is None


def test_bootstrap_of_a_constant_is_a_point():
    assert bootstrap_ci([1.0] * 20) == (1.0, 1.0, 1.0)


def test_bootstrap_matches_the_normal_interval_for_a_fair_coin():
    x = np.array([0.0, 1.0] * 200)
    mean, low, high = bootstrap_ci(x, n_resamples=4000)
    half = 1.96 * np.sqrt(0.25 / x.size)
    assert mean == 0.5
    assert low == pytest.approx(0.5 - half, abs=0.01)
    assert high == pytest.approx(0.5 + half, abs=0.01)
