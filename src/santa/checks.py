"""Argument checks shared by the library's public functions: one convention for every entry point.

- An integer argument accepts a Python ``int`` or a numpy integer (anything ``numbers.Integral``
  except ``bool``) and is returned as a Python ``int``.
- A real argument (:func:`real`, :func:`scale`) accepts a Python or numpy int or float (anything
  ``numbers.Real`` except ``bool``) and is returned as a Python ``float``.
- A tensor whose values are read (:func:`has_values`) must not be on the ``meta`` device.
- The wrong *type* (a float, even ``2.0``, for an int; a string; ``None``; a bool; a tensor for a
  number) is a ``TypeError``; the right type with a bad *value* (out of range, NaN or ±inf, a meta
  tensor) is a ``ValueError``. Both name the argument and say what was expected.
"""

from __future__ import annotations

import math
import numbers
from typing import TypeVar

_T = TypeVar("_T")


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


def real(name: str, value: object, *, optional: bool = False) -> float | None:
    """``value`` as a finite Python float (None passes through when ``optional``), or raise naming ``name``:
    TypeError for another type (a bool, a string, a tensor), ValueError for NaN or ±inf."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        expected = "a real number or None" if optional else "a real number"
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def scale(value: object) -> float | None:
    """A score scale: None (the caller's default, ``1/√d``) or a finite real number (0 and negatives
    are allowed), as a Python float: TypeError for another type, ValueError for NaN or ±inf."""
    return real("scale", value, optional=True)


def has_values(name: str, tensor: _T) -> _T:
    """``tensor`` (a torch.Tensor), or a ValueError naming ``name`` if it is on the meta device (shapes
    only, no values to compute with)."""
    if getattr(tensor, "is_meta", False):
        raise ValueError(f"{name} is on the meta device, which holds no values to compute with: "
                         "pass tensors on the CPU or a GPU")
    return tensor
