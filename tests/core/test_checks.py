"""santa.checks.integer: the one convention for integer arguments (issue 22, item 6)."""

import numpy as np
import pytest

from santa.checks import integer


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
