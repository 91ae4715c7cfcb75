"""Checked numbers for configs, flags and constructors (pure Python: no Keras, no TensorFlow).

Each check returns the value when it is good and otherwise raises `CheckError` (a
``ValueError``) whose message names the argument and the value received:
``positive_int("batch_size", 0)`` raises "`batch_size` must be a positive integer. Received:
batch_size=0". A dotted name names the owner too: ``positive_int("NMTConfig.d_model", 0)``
says "`NMTConfig.d_model` must be a positive integer. Received: d_model=0".

``True`` and ``False`` are never numbers here, nor are strings; ``nan`` and infinities are
refused. With ``optional=True``, None is accepted (and returned), and the message says "must
be None or ...".

Example:
    >>> self.num_heads = positive_int("num_heads", num_heads)
    >>> self.dropout = fraction("dropout", dropout)  # in [0, 1)
"""

from __future__ import annotations

import math
import numbers

__all__ = [
    "CheckError", "boolean", "fraction", "integer", "non_negative_int", "non_negative_number",
    "number", "positive_int", "positive_ints", "positive_number",
]


class CheckError(ValueError):
    """A value that failed a check: ``name``, ``value`` and what was ``expected`` of it
    (e.g. "a positive integer"), so that a caller (an argparse type) can word it its own way."""

    def __init__(self, name: str, value, expected: str):
        self.name, self.value, self.expected = name, value, expected
        field = name.rpartition(".")[2]
        super().__init__(f"`{name}` must be {expected}. Received: {field}={value!r}")


def _fail(name: str, value, expected: str, optional: bool):
    raise CheckError(name, value, f"None or {expected}" if optional else expected)


def integer(name: str, value, *, minimum: int | None = None, maximum: int | None = None,
            optional: bool = False) -> int | None:
    """``value`` as an ``int`` if it is an integer (a Python or NumPy one, not a bool) in
    ``[minimum, maximum]`` (either bound may be None)."""
    if optional and value is None:
        return None
    if minimum == 1 and maximum is None:
        expected = "a positive integer"
    elif minimum == 0 and maximum is None:
        expected = "a non-negative integer"
    elif maximum is None:
        expected = "an integer" if minimum is None else f"an integer >= {minimum}"
    else:
        expected = f"an integer <= {maximum}" if minimum is None else (
            f"an integer in [{minimum}, {maximum}]")
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)):
        _fail(name, value, expected, optional)
    return int(value)


def positive_int(name: str, value, *, optional: bool = False) -> int | None:
    """``value`` if it is an integer >= 1 ("`name` must be a positive integer")."""
    return integer(name, value, minimum=1, optional=optional)


def positive_ints(name: str, values, *, length: int | None = None,
                  optional: bool = False) -> tuple[int, ...] | None:
    """``values`` as a tuple of ints if it is a non-empty list or tuple of positive integers
    (of ``length`` of them, if given), e.g. filter counts or a (height, width)."""
    if optional and values is None:
        return None
    expected = ("a non-empty sequence of positive integers" if length is None
                else f"a sequence of {length} positive integers")
    if (not isinstance(values, (list, tuple)) or not values
            or (length is not None and len(values) != length)
            or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0
                       for v in values)):
        _fail(name, values, expected, optional)
    return tuple(int(v) for v in values)


def non_negative_int(name: str, value, *, optional: bool = False) -> int | None:
    """``value`` if it is an integer >= 0 ("`name` must be a non-negative integer")."""
    return integer(name, value, minimum=0, optional=optional)


def number(name: str, value, *, minimum: float | None = None, maximum: float | None = None,
           interval: str = "[]", optional: bool = False) -> float | None:
    """``value`` as a ``float`` if it is a finite real number (not a bool) within the bounds.

    ``interval`` says which bounds are included: two characters, ``"["`` or ``"("`` then
    ``"]"`` or ``")"`` (default ``"[]"``: both).
    """
    if optional and value is None:
        return None
    low_open, high_open = interval[0] == "(", interval[1] == ")"
    if minimum == 0 and maximum is None:
        expected = "a positive number" if low_open else "a non-negative number"
    elif maximum is None:
        expected = "a number" if minimum is None else (
            f"a number {'>' if low_open else '>='} {minimum}")
    elif minimum is None:
        expected = f"a number {'<' if high_open else '<='} {maximum}"
    else:
        expected = f"a number in {interval[0]}{minimum}, {maximum}{interval[1]}"
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value))
    if ok and minimum is not None:
        ok = value > minimum if low_open else value >= minimum
    if ok and maximum is not None:
        ok = value < maximum if high_open else value <= maximum
    if not ok:
        _fail(name, value, expected, optional)
    return float(value)


def positive_number(name: str, value, *, optional: bool = False) -> float | None:
    """``value`` if it is a finite number > 0 ("`name` must be a positive number")."""
    return number(name, value, minimum=0, interval="(]", optional=optional)


def non_negative_number(name: str, value, *, optional: bool = False) -> float | None:
    """``value`` if it is a finite number >= 0 ("`name` must be a non-negative number")."""
    return number(name, value, minimum=0, optional=optional)


def fraction(name: str, value, *, interval: str = "[)", optional: bool = False) -> float | None:
    """``value`` if it is a number between 0 and 1, by default in ``[0, 1)`` (a dropout rate,
    a held-out share); ``interval="(]"`` for ``(0, 1]``, and so on."""
    return number(name, value, minimum=0, maximum=1, interval=interval, optional=optional)


def boolean(name: str, value) -> bool:
    """``value`` if it is ``True`` or ``False`` (not 0 or 1)."""
    if not isinstance(value, bool):
        raise CheckError(name, value, "True or False")
    return value
