"""santa.checks: the one convention for integer (issue 22, item 6) and real arguments, and tensors with values."""

import math

import numpy as np
import pytest
import torch

from santa.checks import has_values, integer, real, scale


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_python_and_numpy_integers_are_accepted_as_int(value):
    got = integer("budget", value, low=1)
    assert got == 3 and type(got) is int


@pytest.mark.parametrize("value", [3.0, 2.7, "3", None, True, np.float64(3.0)])
def test_wrong_type_is_a_type_error_naming_the_argument(value):
    with pytest.raises(TypeError, match=r"budget must be an int ≥ 1, got"):
        integer("budget", value, low=1)


@pytest.mark.parametrize("value, low, high", [(0, 1, None), (5, 0, 5), (-1, 0, 10), (np.int64(2**40), 0, 2**32)])
def test_out_of_range_is_a_value_error_naming_the_argument_and_range(value, low, high):
    with pytest.raises(ValueError, match=r"layers must be an int (≥|in \[)"):
        integer("layers", value, low=low, high=high)


@pytest.mark.parametrize("value", [0.5, 0, -2, np.float32(0.5), np.float64(-2.0), np.int64(3)])
def test_real_numbers_are_accepted_as_float(value):
    got = real("temperature", value)
    assert got == float(value) and type(got) is float
    assert scale(value) == float(value) and type(scale(value)) is float


@pytest.mark.parametrize("value", [math.nan, -math.inf, math.inf, np.float64("nan"), np.float32("inf")])
def test_a_non_finite_real_is_a_value_error_naming_the_argument(value):
    """scale=nan used to be a TypeError in the decode paths, where every other bad value is a ValueError."""
    with pytest.raises(ValueError, match=r"temperature must be finite, got"):
        real("temperature", value)
    with pytest.raises(ValueError, match=r"scale must be finite, got"):
        scale(value)


@pytest.mark.parametrize("value", ["0.5", True, torch.tensor(0.5), [0.5], 1j])
def test_a_real_of_the_wrong_type_is_a_type_error_naming_the_argument(value):
    with pytest.raises(TypeError, match=r"temperature must be a real number, got"):
        real("temperature", value)
    with pytest.raises(TypeError, match=r"scale must be a real number or None, got"):
        scale(value)


def test_none_is_a_real_only_where_optional():
    assert scale(None) is None and real("scale", None, optional=True) is None
    with pytest.raises(TypeError, match=r"temperature must be a real number, got NoneType"):
        real("temperature", None)


def test_meta_tensors_have_no_values():
    cpu = torch.ones(3)
    assert has_values("probs", cpu) is cpu
    with pytest.raises(ValueError, match=r"probs is on the meta device"):
        has_values("probs", cpu.to("meta"))
