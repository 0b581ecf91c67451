"""Argument checks shared by the library's public functions: one convention for every entry point.

- An integer argument accepts a Python ``int`` or a numpy integer (anything ``numbers.Integral``
  except ``bool``) and is returned as a Python ``int``.
- The wrong *type* (a float, even ``2.0``; a string; ``None``; a bool) is a ``TypeError``; the
  right type with a bad *value* (out of range) is a ``ValueError``. Both name the argument and
  say what was expected.
"""

from __future__ import annotations

import numbers


def _range_text(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"in [{low}, {high})"
    if low is not None:
        return f"≥ {low}"
    if high is not None:
        return f"< {high}"
    return ""


def integer(name: str, value: object, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as a Python int in ``[low, high)`` (either bound may be None), or raise naming ``name``."""
    expected = f"an int {_range_text(low, high)}".rstrip()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value >= high):
        raise ValueError(f"{name} must be {expected}, got {value}")
    return value
